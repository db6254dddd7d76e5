// Transactions with Apache Kafka's Java clients, one JVM per scenario.
// Output, one line per observation (the Python test checks them):
//   R <value>              a record a read_committed consumer of the output received
//   I <what> <details...>  counts and answers
//   E <what> <exception class> <message>   an error
// Usage: TxnDriver SCENARIO bootstrap input output records [group.protocol]
//   ctp:    consume-transform-produce over <records> inputs with random aborts
//           (sendOffsetsToTransaction with the consumer's group metadata), then read the output
//   zombie: two producers with one transactional.id; the first is fenced by the second
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.serialization.*;

public class TxnDriver {
    static String bootstrap;

    static void out(String s) { System.out.println(s); }

    public static void main(String[] args) throws Exception {
        bootstrap = args[1];
        String in = args[2], output = args[3];
        int n = Integer.parseInt(args[4]);
        String protocol = args.length > 5 ? args[5] : "classic";
        switch (args[0]) {
            case "ctp": ctp(in, output, n, protocol); break;
            case "zombie": zombie(output); break;
            default: throw new IllegalArgumentException(args[0]);
        }
        System.out.flush();
        System.exit(0);
    }

    static KafkaProducer<String, String> producer(String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        if (txnId != null) p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        return new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
    }

    static KafkaConsumer<String, String> consumer(String group, String protocol) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100");
        if (group != null) p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        return new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer());
    }

    static void readCommitted(String topic, int want) {
        try (KafkaConsumer<String, String> c = consumer(null, null)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo pi : c.partitionsFor(topic)) parts.add(new TopicPartition(topic, pi.partition()));
            c.assign(parts);
            c.seekToBeginning(parts);
            int got = 0;
            long end = System.currentTimeMillis() + 60_000;
            while (got < want && System.currentTimeMillis() < end) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) { out("R " + r.value()); got++; }
            }
            long quiet = System.currentTimeMillis() + 2_000;  // nothing more may come
            while (System.currentTimeMillis() < quiet) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) out("R " + r.value());
            }
        }
    }

    static void ctp(String in, String output, int n, String protocol) throws Exception {
        try (KafkaProducer<String, String> plain = producer(null)) {
            for (int i = 0; i < n; i++) plain.send(new ProducerRecord<>(in, i % 2, null, Integer.toString(i)));
            plain.flush();
        }
        Random rnd = new Random(29);
        int done = 0, aborts = 0;
        try (KafkaConsumer<String, String> c = consumer("java-ctp-" + protocol, protocol);
             KafkaProducer<String, String> p = producer("java-ctp-" + protocol)) {
            p.initTransactions();
            c.subscribe(List.of(in));
            long deadline = System.currentTimeMillis() + 180_000;
            while (done < n && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
                if (recs.isEmpty()) continue;
                p.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : recs) {
                    p.send(new ProducerRecord<>(output, r.partition(), null, "out-" + r.value()));
                    offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                }
                p.sendOffsetsToTransaction(offsets, c.groupMetadata());
                if (rnd.nextInt(10) < 3) {
                    p.abortTransaction();
                    aborts++;
                    Map<TopicPartition, OffsetAndMetadata> committed = c.committed(c.assignment());
                    for (TopicPartition tp : c.assignment()) {
                        OffsetAndMetadata om = committed.get(tp);
                        c.seek(tp, om == null ? 0 : om.offset());
                    }
                } else {
                    p.commitTransaction();
                    done += recs.count();
                }
            }
        }
        out("I aborts " + aborts);
        out("I done " + done);
        readCommitted(output, n);
    }

    static void zombie(String output) throws Exception {
        KafkaProducer<String, String> old = producer("java-zombie");
        old.initTransactions();
        old.beginTransaction();
        old.send(new ProducerRecord<>(output, 0, null, "zombie-before")).get();
        KafkaProducer<String, String> fresh = producer("java-zombie");
        fresh.initTransactions();
        fresh.beginTransaction();
        fresh.send(new ProducerRecord<>(output, 0, null, "fresh")).get();
        fresh.commitTransaction();
        try {
            old.send(new ProducerRecord<>(output, 0, null, "zombie-after")).get();
            old.commitTransaction();
            out("I zombie-committed");
        } catch (Exception e) {
            Throwable t = e.getCause() != null && e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
            out("E zombie " + t.getClass().getSimpleName() + " " + String.valueOf(t.getMessage()).replace('\n', ' '));
        }
        try { old.close(Duration.ofSeconds(5)); } catch (Exception ignored) { }
        fresh.close();
        readCommitted(output, 1);
    }
}
