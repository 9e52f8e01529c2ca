// Reference Java client for epochguard's mixed-group tests: the stock KafkaConsumer as one
// member of a consumer group (subscribe(), not assign()), driven over stdin and reporting what
// it does as JSON lines on stdout. Like TruncationProbe it holds no opinion of its own: tests
// record how the official client takes part in a group beside EpochConsumer and librdkafka.
//
// Usage: java GroupMemberProbe <bootstrap> <group.id> <auto.offset.reset> [key=value ...]
// (group.protocol, partition.assignment.strategy, group.remote.assignor, group.instance.id
// and anything else arrive as key=value properties.)
// Commands (one per line):
//   subscribe <topic>[,<topic>...]    subscribe with a rebalance listener
//   poll <max_records> <timeout_ms>   poll until max_records arrived (0: for the whole timeout),
//                                     an exception, or the timeout
//   commit                            commitSync() of the positions, then committed() read back
//   seek <topic> <partition> <offset> [leader_epoch]
//   unsubscribe
//   quit                              close(): leaves the group
// Every command answers with exactly one terminal event ("subscribed", "polled", "committed",
// "seeked", "unsubscribed", "closed" or "error"); before it come "record", "assigned",
// "revoked", "lost" and "exception" events, in the order they happened.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.LogTruncationException;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class GroupMemberProbe {
    private GroupMemberProbe() {}

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }

    static String epoch(Optional<Integer> epoch) {
        return epoch.isPresent() ? epoch.get().toString() : "null";
    }

    static void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    // Partitions as [topic, partition] pairs: "topic-0" strings are ambiguous when topic
    // names end in "-<digits>".
    static String partitions(Collection<TopicPartition> tps) {
        StringBuilder b = new StringBuilder("[");
        for (TopicPartition tp : tps) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append('[').append(quote(tp.topic())).append(',').append(tp.partition()).append(']');
        }
        return b.append(']').toString();
    }

    static String offsets(Map<TopicPartition, OffsetAndMetadata> offsets) {
        StringBuilder b = new StringBuilder("[");
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            if (b.length() > 1) {
                b.append(',');
            }
            TopicPartition tp = e.getKey();
            OffsetAndMetadata o = e.getValue();
            b.append("{\"topic\":").append(quote(tp.topic()))
                .append(",\"partition\":").append(tp.partition())
                .append(",\"offset\":").append(o == null ? "null" : Long.toString(o.offset()))
                .append(",\"leader_epoch\":").append(o == null ? "null" : epoch(o.leaderEpoch()))
                .append('}');
        }
        return b.append(']').toString();
    }

    static String fetchOffsets(Map<TopicPartition, Long> offsets) {
        Map<TopicPartition, OffsetAndMetadata> asMeta = new HashMap<>();
        for (Map.Entry<TopicPartition, Long> e : offsets.entrySet()) {
            asMeta.put(e.getKey(), new OffsetAndMetadata(e.getValue()));
        }
        return offsets(asMeta);
    }

    static String exception(Throwable ex) {
        return "{\"event\":\"exception\",\"type\":" + quote(ex.getClass().getSimpleName())
            + ",\"class\":" + quote(ex.getClass().getName())
            + ",\"message\":" + quote(ex.getMessage()) + "}";
    }

    // The listener runs inside poll()/unsubscribe()/close() on the command thread, so its
    // events land between the command and its terminal event.
    static final class Listener implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            emit("{\"event\":\"revoked\",\"partitions\":" + partitions(partitions) + "}");
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            emit("{\"event\":\"assigned\",\"partitions\":" + partitions(partitions) + "}");
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            // Overridden so that a loss is reported as such (the default calls revoked).
            emit("{\"event\":\"lost\",\"partitions\":" + partitions(partitions) + "}");
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: GroupMemberProbe <bootstrap> <group.id> <reset> [k=v...]");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, args[2]);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        for (int i = 3; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        KafkaConsumer<byte[], byte[]> consumer;
        try {
            consumer = new KafkaConsumer<>(props);
        } catch (KafkaException ex) {
            // A bad configuration: report it by class like everything else, then exit.
            emit("{\"event\":\"error\",\"type\":" + quote(ex.getClass().getSimpleName())
                + ",\"class\":" + quote(ex.getClass().getName())
                + ",\"message\":" + quote(ex.getMessage()) + "}");
            return;
        }
        Listener listener = new Listener();
        emit("{\"event\":\"ready\",\"group\":" + quote(args[1]) + "}");
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split("\\s+");
            try {
                switch (cmd[0]) {
                    case "subscribe":
                        consumer.subscribe(Arrays.asList(cmd[1].split(",")), listener);
                        emit("{\"event\":\"subscribed\",\"topics\":" + quote(cmd[1]) + "}");
                        break;
                    case "poll":
                        poll(consumer, Integer.parseInt(cmd[1]), Long.parseLong(cmd[2]));
                        break;
                    case "commit":
                        // commitSync() commits every assigned partition's position with the
                        // epoch of the last record consumed from it.
                        consumer.commitSync(Duration.ofSeconds(10));
                        Set<TopicPartition> held = consumer.assignment();
                        emit("{\"event\":\"committed\",\"offsets\":"
                            + offsets(consumer.committed(held, Duration.ofSeconds(10))) + "}");
                        break;
                    case "seek":
                        TopicPartition tp = new TopicPartition(cmd[1], Integer.parseInt(cmd[2]));
                        Optional<Integer> e = cmd.length > 4
                            ? Optional.of(Integer.parseInt(cmd[4])) : Optional.empty();
                        consumer.seek(tp, new OffsetAndMetadata(Long.parseLong(cmd[3]), e, ""));
                        emit("{\"event\":\"seeked\",\"offset\":" + cmd[3]
                            + ",\"leader_epoch\":" + epoch(e) + "}");
                        break;
                    case "unsubscribe":
                        consumer.unsubscribe();
                        emit("{\"event\":\"unsubscribed\"}");
                        break;
                    case "quit":
                        consumer.close(Duration.ofSeconds(10));
                        emit("{\"event\":\"closed\"}");
                        return;
                    default:
                        emit("{\"event\":\"error\",\"type\":\"UnknownCommand\",\"class\":null,"
                            + "\"message\":" + quote(line) + "}");
                }
            } catch (RuntimeException ex) {
                emit("{\"event\":\"error\",\"type\":" + quote(ex.getClass().getSimpleName())
                    + ",\"class\":" + quote(ex.getClass().getName())
                    + ",\"message\":" + quote(ex.getMessage()) + "}");
            }
        }
        consumer.close(Duration.ofSeconds(10));
    }

    static void poll(KafkaConsumer<byte[], byte[]> consumer, int max, long timeoutMs) {
        long deadline = System.currentTimeMillis() + timeoutMs;
        int count = 0;
        String outcome = "timeout";
        while ((max == 0 || count < max) && System.currentTimeMillis() < deadline) {
            ConsumerRecords<byte[], byte[]> records;
            try {
                records = consumer.poll(Duration.ofMillis(100));
            } catch (LogTruncationException ex) {
                // Must precede OffsetOutOfRangeException, which it extends.
                emit("{\"event\":\"exception\",\"type\":\"LogTruncationException\",\"class\":"
                    + quote(ex.getClass().getName()) + ",\"divergent_offsets\":"
                    + offsets(ex.divergentOffsets()) + ",\"fetch_offsets\":"
                    + fetchOffsets(ex.offsetOutOfRangePartitions()) + ",\"message\":"
                    + quote(ex.getMessage()) + "}");
                outcome = "exception";
                break;
            } catch (OffsetOutOfRangeException ex) {
                emit("{\"event\":\"exception\",\"type\":\"OffsetOutOfRangeException\",\"class\":"
                    + quote(ex.getClass().getName()) + ",\"fetch_offsets\":"
                    + fetchOffsets(ex.offsetOutOfRangePartitions()) + ",\"message\":"
                    + quote(ex.getMessage()) + "}");
                outcome = "exception";
                break;
            } catch (RuntimeException ex) {
                emit(exception(ex));
                outcome = "exception";
                break;
            }
            for (ConsumerRecord<byte[], byte[]> r : records) {
                emit("{\"event\":\"record\",\"topic\":" + quote(r.topic()) + ",\"partition\":"
                    + r.partition() + ",\"offset\":" + r.offset() + ",\"leader_epoch\":"
                    + epoch(r.leaderEpoch()) + ",\"value\":"
                    + (r.value() == null ? "null"
                        : quote(new String(r.value(), StandardCharsets.UTF_8))) + "}");
                count++;
            }
            if (max > 0 && count >= max) {
                outcome = "enough";
            }
        }
        List<TopicPartition> held = new ArrayList<>(consumer.assignment());
        emit("{\"event\":\"polled\",\"count\":" + count + ",\"outcome\":" + quote(outcome)
            + ",\"assignment\":" + partitions(held) + "}");
    }
}
