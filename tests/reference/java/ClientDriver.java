// KafkaProducer, KafkaConsumer and Admin scenarios against one broker, one JVM per scenario.
// Output, one line per observation (the Python test checks them):
//   R <tag> <partition> <offset> <key> <value> <headers>   a record a consumer received
//   A <consumer> <partitions...>                          an assignment (after a rebalance)
//   K <partition> <committed offset>                       committed offsets of the group
//   T <query> <partition> <offset>                         offsetsForTimes answers
//   I <what> <details...>                                  admin answers
//   E <what> <exception class> <message>                   an expected or unexpected error
// Usage: ClientDriver SCENARIO bootstrap topic [key=value ...]
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.stream.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.*;

public class ClientDriver {
    static String bootstrap, topic;
    static Map<String, String> opts = new HashMap<>();

    static void out(String s) { System.out.println(s); }
    static int opt(String k, int d) { return opts.containsKey(k) ? Integer.parseInt(opts.get(k)) : d; }

    public static void main(String[] args) throws Exception {
        bootstrap = args[1]; topic = args[2];
        for (int i = 3; i < args.length; i++) { String[] kv = args[i].split("=", 2); opts.put(kv[0], kv[1]); }
        switch (args[0]) {
            case "produce": produceAllCodecs(); break;
            case "group": group(opts.get("protocol")); break;
            case "seek": seekAndTimes(); break;
            case "admin": admin(); break;
            case "share-admin": shareAdmin(); break;
            default: throw new IllegalArgumentException(args[0]);
        }
        System.out.flush();
        System.exit(0);
    }

    static Admin adminClient() { return Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap)); }

    static KafkaProducer<String, String> producer(String codec) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "10");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "20000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        return new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
    }

    static KafkaConsumer<String, String> consumer(String group, String protocol, String clientId) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        if (protocol != null) p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        if ("classic".equals(protocol)) {
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        }
        return new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer());
    }

    static String headers(ConsumerRecord<String, String> r) {
        StringBuilder sb = new StringBuilder();
        for (Header h : r.headers()) sb.append(sb.length() == 0 ? "" : ",").append(h.key()).append('=').append(h.value() == null ? "<null>" : new String(h.value(), StandardCharsets.UTF_8));
        return sb.length() == 0 ? "-" : sb.toString();
    }

    static void record(String tag, ConsumerRecord<String, String> r) {
        out("R " + tag + " " + r.partition() + " " + r.offset() + " " + r.key() + " " + r.value() + " " + headers(r));
    }

    // An idempotent producer per codec, each to its own topic (TOPIC-codec); read back by assignment.
    static void produceAllCodecs() throws Exception {
        int n = opt("records", 200);
        List<String> codecs = List.of("none", "gzip", "snappy", "lz4", "zstd");
        try (Admin ad = adminClient()) {
            ad.createTopics(codecs.stream().map(c -> new NewTopic(topic + "-" + c, 2, (short) 1)).collect(Collectors.toList())).all().get();
        }
        for (String codec : codecs) {
            String t = topic + "-" + codec;
            try (KafkaProducer<String, String> pr = producer(codec)) {
                List<java.util.concurrent.Future<RecordMetadata>> fs = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    ProducerRecord<String, String> rec = new ProducerRecord<>(t, i % 2, "k" + i, codec + "-" + i);
                    rec.headers().add("codec", codec.getBytes(StandardCharsets.UTF_8)).add("i", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                    if (i % 10 == 0) rec.headers().add("empty", null);
                    fs.add(pr.send(rec));
                }
                for (java.util.concurrent.Future<RecordMetadata> f : fs) f.get();
            }
            try (KafkaConsumer<String, String> c = consumer(null, null, "reader-" + codec)) {
                List<TopicPartition> tps = List.of(new TopicPartition(t, 0), new TopicPartition(t, 1));
                c.assign(tps);
                c.seekToBeginning(tps);
                int got = 0;
                long deadline = System.currentTimeMillis() + 30000;
                while (got < n && System.currentTimeMillis() < deadline)
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) { record(codec, r); got++; }
            }
        }
    }

    static List<String> partitions(Collection<TopicPartition> tps) {
        return tps.stream().map(tp -> Integer.toString(tp.partition())).sorted().collect(Collectors.toList());
    }

    // Two consumers in one group: the first alone, then the second joins (a rebalance); every
    // record is consumed and committed once the group is balanced.
    static void group(String protocol) throws Exception {
        int n = opt("records", 400), parts = opt("partitions", 4);
        String group = opts.getOrDefault("group", "g-" + protocol);
        try (KafkaProducer<String, String> pr = producer("none")) {
            for (int i = 0; i < n; i++) pr.send(new ProducerRecord<>(topic, i % parts, "k" + i, Integer.toString(i)));
            pr.flush();
        }
        Set<String> seen = new HashSet<>();
        try (KafkaConsumer<String, String> a = consumer(group, protocol, "a")) {
            a.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60000;
            // a alone: read at least half of the records, committing after each record
            while (seen.size() < n / 2 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : a.poll(Duration.ofMillis(200))) {
                    record("a", r); seen.add(r.value());
                    a.commitSync(Map.of(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1)));
                }
            }
            out("A a " + String.join(" ", partitions(a.assignment())));
            try (KafkaConsumer<String, String> b = consumer(group, protocol, "b")) {
                b.subscribe(List.of(topic));
                // both poll until each has a share of the partitions and every record is in
                while (System.currentTimeMillis() < deadline) {
                    for (KafkaConsumer<String, String> c : List.of(a, b)) {
                        String tag = c == a ? "a" : "b";
                        for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) { record(tag, r); seen.add(r.value()); }
                        try { c.commitSync(); } catch (CommitFailedException e) { out("E commit " + tag + " " + err(e)); }
                    }
                    if (seen.size() >= n && !a.assignment().isEmpty() && !b.assignment().isEmpty()
                        && a.assignment().size() + b.assignment().size() == parts) break;
                }
                out("A a " + String.join(" ", partitions(a.assignment())));
                out("A b " + String.join(" ", partitions(b.assignment())));
                b.commitSync();
            }
            a.commitSync();
        }
        try (Admin ad = adminClient()) {
            Map<TopicPartition, OffsetAndMetadata> committed = ad.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            TreeMap<Integer, Long> sorted = new TreeMap<>();
            committed.forEach((tp, om) -> sorted.put(tp.partition(), om == null ? -1L : om.offset()));
            sorted.forEach((p, o) -> out("K " + p + " " + o));
            ConsumerGroupDescription d = ad.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
            out("I group " + d.type() + " " + d.groupState() + " " + d.members().size());
        }
    }

    // seek / seekToEnd / offsetsForTimes / beginningOffsets / endOffsets with explicit timestamps.
    static void seekAndTimes() throws Exception {
        int n = opt("records", 100);
        long base = 1_700_000_000_000L;
        try (KafkaProducer<String, String> pr = producer("none")) {
            for (int i = 0; i < n; i++) pr.send(new ProducerRecord<>(topic, 0, base + i * 1000L, "k" + i, Integer.toString(i)));
            pr.flush();
        }
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> c = consumer(null, null, "seeker")) {
            c.assign(List.of(tp));
            c.seek(tp, 42);
            ConsumerRecord<String, String> first = null;
            long deadline = System.currentTimeMillis() + 30000;
            while (first == null && System.currentTimeMillis() < deadline)
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(300))) { if (first == null) first = r; }
            record("seek42", first);
            for (long q : new long[] {base, base + 50_000L, base + 50_500L, base + (n - 1) * 1000L, base + n * 1000L}) {
                OffsetAndTimestamp ot = c.offsetsForTimes(Map.of(tp, q)).get(tp);
                out("T " + (q - base) + " 0 " + (ot == null ? "null" : ot.offset() + " " + (ot.timestamp() - base)));
            }
            out("T begin 0 " + c.beginningOffsets(List.of(tp)).get(tp));
            out("T end 0 " + c.endOffsets(List.of(tp)).get(tp));
            c.seekToEnd(List.of(tp));
            out("T position 0 " + c.position(tp));
        }
    }

    static String err(Exception e) {
        Throwable t = e instanceof ExecutionException ? e.getCause() : e;
        return t.getClass().getSimpleName() + " " + String.valueOf(t.getMessage()).replace('\n', ' ');
    }

    // Topics, partitions, configs and groups through Admin.
    static void admin() throws Exception {
        try (Admin ad = adminClient()) {
            ad.createTopics(List.of(new NewTopic(topic, 2, (short) 1).configs(Map.of("retention.ms", "3600000")))).all().get();
            try { ad.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get(); out("I recreate ok"); }
            catch (Exception e) { out("E recreate " + err(e)); }
            ad.createPartitions(Map.of(topic, NewPartitions.increaseTo(5))).all().get();
            try { ad.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get(); out("I shrink ok"); }
            catch (Exception e) { out("E shrink " + err(e)); }
            TopicDescription td = ad.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            out("I describe " + td.name() + " " + td.partitions().size() + " " + td.isInternal() + " " + td.topicId());
            out("I list " + ad.listTopics().names().get().contains(topic));
            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            ad.incrementalAlterConfigs(Map.of(res, List.of(
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE)))).all().get();
            Config cfg = ad.describeConfigs(List.of(res)).all().get().get(res);
            for (String k : List.of("cleanup.policy", "retention.ms", "segment.bytes")) {
                ConfigEntry e = cfg.get(k);
                out("I config " + k + " " + e.value() + " " + e.source());
            }
            try {
                ad.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all().get();
                out("I badconfig ok");
            } catch (Exception e) { out("E badconfig " + err(e)); }
            ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, opts.getOrDefault("broker", "0"));
            Config bc = ad.describeConfigs(List.of(broker)).all().get().get(broker);
            out("I brokerconfig num.partitions " + bc.get("num.partitions").value());
            DescribeClusterResult dc = ad.describeCluster();
            out("I cluster " + dc.nodes().get().size() + " " + (dc.controller().get() != null));
            Collection<GroupListing> groups = ad.listGroups().all().get();
            for (GroupListing g : groups) out("I group " + g.groupId() + " " + g.type().map(Object::toString).orElse("?") + " " + g.protocol());
            for (GroupType t : List.of(GroupType.CLASSIC, GroupType.CONSUMER, GroupType.SHARE)) {
                Collection<GroupListing> of = ad.listGroups(new ListGroupsOptions().withTypes(Set.of(t))).all().get();
                out("I groups-of " + t + " " + of.stream().map(GroupListing::groupId).sorted().collect(Collectors.joining(",")));
            }
            ad.deleteTopics(List.of(topic)).all().get();
            long deadline = System.currentTimeMillis() + 20000;
            while (ad.listTopics().names().get().contains(topic) && System.currentTimeMillis() < deadline) Thread.sleep(200);
            out("I deleted " + !ad.listTopics().names().get().contains(topic));
        }
    }

    // Share-group admin: describe, list/alter/delete share-group offsets, delete the group.
    static void shareAdmin() throws Exception {
        String group = opts.getOrDefault("group", "sg");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (Admin ad = adminClient()) {
            ShareGroupDescription d = ad.describeShareGroups(List.of(group)).describedGroups().get(group).get();
            out("I describe " + d.groupId() + " " + d.groupState() + " " + d.members().size() + " " + d.groupEpoch());
            Map<TopicPartition, SharePartitionOffsetInfo> offs = ad.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
            for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> e : offs.entrySet())
                out("I offsets " + e.getKey() + " " + e.getValue().startOffset() + " " + e.getValue().lag().orElse(-1L));
            ad.alterShareGroupOffsets(group, Map.of(tp, 3L)).all().get();
            offs = ad.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
            for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> e : offs.entrySet())
                out("I altered " + e.getKey() + " " + e.getValue().startOffset() + " " + e.getValue().lag().orElse(-1L));
            try { ad.alterShareGroupOffsets(group, Map.of(tp, 1_000_000L)).all().get(); out("I alter-out-of-range ok"); }
            catch (Exception e) { out("E alter-out-of-range " + err(e)); }
            try { ad.describeShareGroups(List.of("no-such-share-group")).describedGroups().get("no-such-share-group").get(); out("I describe-missing ok"); }
            catch (Exception e) { out("E describe-missing " + err(e)); }
            ad.deleteShareGroupOffsets(group, Set.of(topic)).all().get();
            offs = ad.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
            out("I after-delete-offsets " + offs.size() + " " + offs.values().stream().filter(Objects::nonNull).count());
            ad.deleteShareGroups(List.of(group)).all().get();
            try { ad.describeShareGroups(List.of(group)).describedGroups().get(group).get(); out("I describe-deleted ok"); }
            catch (Exception e) { out("E describe-deleted " + err(e)); }
        }
    }
}
