// Kafka's Java clients on secured listeners, every case in one JVM. Arguments: CASE=PROPERTIES_FILE ...
// (the file holds bootstrap.servers and the case's security settings). Per case:
//   a case named bad-*: an Admin call that must be refused
//     X <case> <exception class> <message>    the refusal (the cause the client reports)
//   any other case: Admin creates topic sec-<case>, a KafkaProducer sends 3 records, a KafkaConsumer
//   reads them back; a case whose name contains "share" also reads them with a KafkaShareConsumer
//     P <case> <partition> <offset>           a record the producer sent
//     R <case> <value>                        a record the consumer read
//     S <case> <value> <delivery count>       a record the share consumer read (and accepted)
//     OK <case>                               everything above finished
//     F <case> <exception class> <message>    the case failed
import java.io.FileReader;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.*;

public class SecurityDriver {
    static final int N = 3;

    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String oneLine(Throwable t) {
        return String.valueOf(t.getMessage()).replace('\n', ' ');
    }

    static Throwable cause(Throwable t) {
        // the clients wrap the real cause in ExecutionException, and in some calls in a plain KafkaException
        while ((t instanceof ExecutionException || t.getClass() == org.apache.kafka.common.KafkaException.class)
               && t.getCause() != null) t = t.getCause();
        return t;
    }

    public static void main(String[] args) throws Exception {
        for (String arg : args) {
            int eq = arg.indexOf('=');
            String name = arg.substring(0, eq);
            Properties props = new Properties();
            try (FileReader r = new FileReader(arg.substring(eq + 1))) { props.load(r); }
            try {
                if (name.startsWith("bad-")) refused(name, props);
                else roundTrip(name, props);
            } catch (Throwable t) {
                Throwable c = cause(t);
                out("F " + name + " " + c.getClass().getSimpleName() + " " + oneLine(c));
            }
        }
    }

    // base's settings, and kv's where base has none
    static Properties with(Properties base, Object... kv) {
        Properties p = new Properties();
        p.putAll(base);
        for (int i = 0; i < kv.length; i += 2) p.putIfAbsent(kv[i], kv[i + 1]);
        return p;
    }

    static void refused(String name, Properties props) {
        try (Admin admin = Admin.create(with(props, AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000",
                AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000"))) {
            admin.describeCluster().nodes().get();
            out("F " + name + " accepted");
        } catch (Throwable t) {
            Throwable c = cause(t);
            out("X " + name + " " + c.getClass().getSimpleName() + " " + oneLine(c));
        }
    }

    static void roundTrip(String name, Properties props) throws Exception {
        String topic = "sec-" + name;
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            if (name.contains("share")) {
                admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, "share-" + name),
                    List.of(new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                              AlterConfigOp.OpType.SET)))).all().get();
            }
        }
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(
                with(props, ProducerConfig.ACKS_CONFIG, "all"), new StringSerializer(), new StringSerializer())) {
            for (int i = 0; i < N; i++) {
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, "k" + i, name + "-" + i)).get();
                out("P " + name + " " + md.partition() + " " + md.offset());
            }
        }
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(
                with(props, ConsumerConfig.GROUP_ID_CONFIG, "group-" + name), new StringDeserializer(),
                new StringDeserializer())) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            int got = 0;
            long deadline = System.currentTimeMillis() + 60_000;
            while (got < N && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    out("R " + name + " " + r.value());
                    got++;
                }
            }
            consumer.commitSync();
        }
        if (name.contains("share")) {
            try (KafkaShareConsumer<String, String> share = new KafkaShareConsumer<>(
                    with(props, ConsumerConfig.GROUP_ID_CONFIG, "share-" + name), new StringDeserializer(),
                    new StringDeserializer())) {
                share.subscribe(List.of(topic));
                int got = 0;
                long deadline = System.currentTimeMillis() + 60_000;
                while (got < N && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> r : share.poll(Duration.ofMillis(500))) {
                        out("S " + name + " " + r.value() + " " + r.deliveryCount().orElse((short) -1));
                        got++;
                    }
                }
                share.commitSync();
            }
        }
        out("OK " + name);
    }
}
