// KafkaShareConsumer scenarios against one broker, one JVM per scenario. Every delivery a
// client sees is printed as one line, for the Python test to check:
//   D <consumer> <partition> <offset> <value> <deliveryCount> <A|R|J|N|I>   (accept, release, reject, renew, implicit)
//   C <consumer> <error>            a commitSync/commitAsync/callback error
//   X <consumer> <exception>        a consumer thread failed
//   O <partition> <startOffset> <lag>  listShareGroupOffsets after the scenario (-1: none)
//   H <consumer> <offsets...>       records held (hold scenario), then the process waits to be killed
// Usage: ShareDriver SCENARIO bootstrap topic group [key=value ...]
import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.*;

public class ShareDriver {
    static String bootstrap, topic, group;
    static Map<String, String> opts = new HashMap<>();
    static final Object OUT = new Object();

    static void out(String line) { synchronized (OUT) { System.out.println(line); } }
    static int opt(String k, int d) { return opts.containsKey(k) ? Integer.parseInt(opts.get(k)) : d; }
    static String opt(String k, String d) { return opts.getOrDefault(k, d); }

    public static void main(String[] args) throws Exception {
        String scenario = args[0];
        bootstrap = args[1]; topic = args[2]; group = args[3];
        for (int i = 4; i < args.length; i++) { String[] kv = args[i].split("=", 2); opts.put(kv[0], kv[1]); }
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            if (opt("produce", 0) > 0) produce(opt("produce", 0));
            setGroupConfigs(admin);
            switch (scenario) {
                case "explicit": explicit(); break;
                case "implicit": implicit(); break;
                case "hold": hold(); return;
                case "drain": drain(); break;
                case "limit": limit(); break;
                case "renew": renew(); break;
                default: throw new IllegalArgumentException(scenario);
            }
            startOffsets(admin);
        }
        System.out.flush();
        System.exit(0);
    }

    static void produce(int n) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, opt("compression", "lz4"));
        try (KafkaProducer<String, String> pr = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            for (int i = 0; i < n; i++) pr.send(new ProducerRecord<>(topic, opt("partition", 0), null, Integer.toString(i)));
            pr.flush();
        }
    }

    static void setGroupConfigs(Admin admin) throws Exception {
        List<AlterConfigOp> ops = new ArrayList<>();
        ops.add(new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET));
        for (String k : List.of("share.record.lock.duration.ms", "share.delivery.count.limit"))
            if (opts.containsKey(k)) ops.add(new AlterConfigOp(new ConfigEntry(k, opts.get(k)), AlterConfigOp.OpType.SET));
        admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops)).all().get();
    }

    static void startOffsets(Admin admin) throws Exception {
        Map<TopicPartition, SharePartitionOffsetInfo> m = admin.listShareGroupOffsets(
            Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
        for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> e : m.entrySet())
            out("O " + e.getKey().partition() + " " + (e.getValue() == null ? -1 : e.getValue().startOffset())
                + " " + (e.getValue() == null ? -1 : e.getValue().lag().orElse(-1L)));
    }

    static KafkaShareConsumer<String, String> consumer(String mode, String clientId) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        p.put("share.acknowledgement.mode", mode);
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, opt("max.poll.records", "500"));
        KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer());
        c.subscribe(List.of(topic));
        return c;
    }

    static void delivered(int id, ConsumerRecord<String, String> r, char action) {
        out("D " + id + " " + r.partition() + " " + r.offset() + " " + r.value() + " " + r.deliveryCount().orElse((short) -1) + " " + action);
    }

    static void commitErrors(int id, Map<TopicIdPartition, Optional<KafkaException>> res) {
        for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : res.entrySet())
            e.getValue().ifPresent(ex -> out("C " + id + " " + ex));
    }

    static void runConsumers(int n, Callable<Void>[] bodies) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(n);
        List<Future<Void>> fs = new ArrayList<>();
        for (Callable<Void> b : bodies) fs.add(pool.submit(b));
        for (int i = 0; i < fs.size(); i++) {
            try { fs.get(i).get(); } catch (ExecutionException e) { out("X " + i + " " + e.getCause()); }
        }
        pool.shutdown();
    }

    // Many consumers, explicit mode: release 1 in `release` (first delivery), reject 1 in `reject`, accept the rest.
    @SuppressWarnings("unchecked")
    static void explicit() throws Exception {
        int n = opt("consumers", 8), records = opt("records", 1000), release = opt("release", 50), reject = opt("reject", 100);
        long deadline = System.currentTimeMillis() + opt("timeout.ms", 240000);
        AtomicInteger finished = new AtomicInteger();
        Callable<Void>[] bodies = new Callable[n];
        for (int i = 0; i < n; i++) {
            final int id = i;
            bodies[i] = () -> {
                try (KafkaShareConsumer<String, String> c = consumer("explicit", "share-" + id)) {
                    c.setAcknowledgementCommitCallback((offsets, ex) -> { if (ex != null) out("C " + id + " callback " + ex); });
                    int round = 0;
                    while (finished.get() < records && System.currentTimeMillis() < deadline) {
                        ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
                        for (ConsumerRecord<String, String> r : recs) {
                            int v = Integer.parseInt(r.value());
                            if (v % reject == 1) { c.acknowledge(r, AcknowledgeType.REJECT); delivered(id, r, 'J'); finished.incrementAndGet(); }
                            else if (v % release == 0 && r.deliveryCount().orElse((short) 0) == 1) { c.acknowledge(r, AcknowledgeType.RELEASE); delivered(id, r, 'R'); }
                            else { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(id, r, 'A'); finished.incrementAndGet(); }
                        }
                        if (recs.isEmpty()) continue;
                        // even consumers commit synchronously, odd ones asynchronously (and sync every 4th round)
                        if (id % 2 == 0 || ++round % 4 == 0) commitErrors(id, c.commitSync(Duration.ofSeconds(30)));
                        else c.commitAsync();
                    }
                    commitErrors(id, c.commitSync(Duration.ofSeconds(30)));
                }
                return null;
            };
        }
        runConsumers(n, bodies);
    }

    // Implicit mode: every record polled is accepted by the next poll / commit.
    @SuppressWarnings("unchecked")
    static void implicit() throws Exception {
        int n = opt("consumers", 2), records = opt("records", 1000);
        long deadline = System.currentTimeMillis() + opt("timeout.ms", 120000);
        AtomicInteger seen = new AtomicInteger();
        Callable<Void>[] bodies = new Callable[n];
        for (int i = 0; i < n; i++) {
            final int id = i;
            bodies[i] = () -> {
                try (KafkaShareConsumer<String, String> c = consumer("implicit", "implicit-" + id)) {
                    while (seen.get() < records && System.currentTimeMillis() < deadline) {
                        ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
                        for (ConsumerRecord<String, String> r : recs) { delivered(id, r, 'I'); seen.incrementAndGet(); }
                        if (!recs.isEmpty()) { if (id % 2 == 0) commitErrors(id, c.commitSync()); else c.commitAsync(); }
                    }
                    commitErrors(id, c.commitSync());
                }
                return null;
            };
        }
        runConsumers(n, bodies);
    }

    // Acquire some records, report them and wait (the test kills this process).
    static void hold() throws Exception {
        KafkaShareConsumer<String, String> c = consumer("explicit", "victim");
        long deadline = System.currentTimeMillis() + 60000;
        while (System.currentTimeMillis() < deadline) {
            ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
            if (recs.isEmpty()) continue;
            StringBuilder sb = new StringBuilder("H 0");
            for (ConsumerRecord<String, String> r : recs) { sb.append(' ').append(r.offset()); delivered(0, r, 'N'); }
            out(sb.toString());
            System.out.flush();
            Thread.sleep(600000);
        }
        throw new IllegalStateException("nothing acquired");
    }

    // One consumer accepts everything until `records` distinct offsets were accepted.
    static void drain() throws Exception {
        int records = opt("records", 100);
        long deadline = System.currentTimeMillis() + opt("timeout.ms", 120000);
        Set<Long> accepted = new HashSet<>();
        try (KafkaShareConsumer<String, String> c = consumer("explicit", "survivor")) {
            while (accepted.size() < records && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> r : recs) { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(0, r, 'A'); accepted.add(r.offset()); }
                if (!recs.isEmpty()) commitErrors(0, c.commitSync());
            }
        }
    }

    // Release the record with value `victim` on every delivery, accept the others; poll until
    // the others are accepted and `quiet.ms` passed without a delivery.
    static void limit() throws Exception {
        int records = opt("records", 10), victim = opt("victim", 3);
        long deadline = System.currentTimeMillis() + opt("timeout.ms", 60000), quiet = opt("quiet.ms", 4000);
        int accepted = 0;
        long last = System.currentTimeMillis();
        try (KafkaShareConsumer<String, String> c = consumer("explicit", "limit")) {
            while (System.currentTimeMillis() < deadline && (accepted < records - 1 || System.currentTimeMillis() - last < quiet)) {
                ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(300));
                for (ConsumerRecord<String, String> r : recs) {
                    last = System.currentTimeMillis();
                    if (Integer.parseInt(r.value()) == victim) { c.acknowledge(r, AcknowledgeType.RELEASE); delivered(0, r, 'R'); }
                    else { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(0, r, 'A'); accepted++; }
                }
                if (!recs.isEmpty()) commitErrors(0, c.commitSync());
            }
        }
    }

    // Consumer 0 holds its records past the lock duration by renewing them, then accepts
    // them; consumer 1 accepts whatever it gets meanwhile (it must get none of 0's records).
    @SuppressWarnings("unchecked")
    static void renew() throws Exception {
        int records = opt("records", 20);
        long holdMs = opt("hold.ms", 7000), every = opt("renew.every.ms", 1000);
        CountDownLatch held = new CountDownLatch(1);
        AtomicBoolean done = new AtomicBoolean();
        Callable<Void>[] bodies = new Callable[2];
        bodies[0] = () -> {
            try (KafkaShareConsumer<String, String> c = consumer("explicit", "renewer")) {
                // Renewed records come back from the next poll (the client hands them out again).
                Map<Long, ConsumerRecord<String, String>> mine = new TreeMap<>();
                long deadline = System.currentTimeMillis() + 60000;
                while (mine.isEmpty() && System.currentTimeMillis() < deadline)
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) { mine.put(r.offset(), r); delivered(0, r, 'N'); }
                held.countDown();
                long until = System.currentTimeMillis() + holdMs;
                while (System.currentTimeMillis() < until) {
                    Thread.sleep(every);
                    for (ConsumerRecord<String, String> r : mine.values()) c.acknowledge(r, AcknowledgeType.RENEW);
                    commitErrors(0, c.commitSync());
                    ConsumerRecords<String, String> again = c.poll(Duration.ofMillis(500));
                    for (ConsumerRecord<String, String> r : again) {
                        if (!mine.containsKey(r.offset())) delivered(0, r, 'N');
                        mine.put(r.offset(), r);
                    }
                    out("L 0 " + again.count() + " " + c.acquisitionLockTimeoutMs().orElse(-1));
                }
                for (ConsumerRecord<String, String> r : mine.values()) { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(0, r, 'A'); }
                commitErrors(0, c.commitSync());
                done.set(true);
            } finally { held.countDown(); done.set(true); }
            return null;
        };
        bodies[1] = () -> {
            held.await();
            try (KafkaShareConsumer<String, String> c = consumer("explicit", "other")) {
                while (!done.get()) {
                    ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(300));
                    for (ConsumerRecord<String, String> r : recs) { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(1, r, 'A'); }
                    if (!recs.isEmpty()) commitErrors(1, c.commitSync());
                }
                for (int i = 0; i < 6; i++) {  // whatever is left after the renewer accepted
                    ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
                    for (ConsumerRecord<String, String> r : recs) { c.acknowledge(r, AcknowledgeType.ACCEPT); delivered(1, r, 'A'); }
                    if (!recs.isEmpty()) commitErrors(1, c.commitSync());
                }
            }
            return null;
        };
        runConsumers(2, bodies);
    }
}
