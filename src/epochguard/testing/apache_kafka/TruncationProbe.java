// Reference Java client for epochguard's tests: the stock KafkaConsumer, driven over stdin,
// reporting what it sees as JSON lines on stdout. It holds no opinion of its own; tests record
// what the official client does around a truncation (LogTruncationException, resets, re-reads).
//
// Usage: java TruncationProbe <bootstrap> <topic> <partition> <auto.offset.reset> [key=value ...]
// Commands (one per line):
//   poll <max_records> <timeout_ms>   poll until max_records arrived, an exception, or timeout
//   position                          report the fetch position
//   seek <offset> [leader_epoch]      seek, with an epoch through OffsetAndMetadata (KIP-320)
//   seek_to_beginning | seek_to_end
//   quit
// Every command answers with exactly one terminal event ("polled", "position", "seeked",
// "closed" or "error"), so a driver can read until it sees one. Record, truncation and
// out-of-range events carry "at_ms", the wall clock when the consumer handed them over.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.LogTruncationException;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class TruncationProbe {
    private TruncationProbe() {}

    // Offset the next record should have if the consumer only moved forward; reset by seeks.
    static Long expected = null;

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

    static String bytes(byte[] value) {
        return value == null ? "null" : quote(new String(value, StandardCharsets.UTF_8));
    }

    static String epoch(Optional<Integer> epoch) {
        return epoch.isPresent() ? epoch.get().toString() : "null";
    }

    static void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String offsetsJson(Map<TopicPartition, Long> offsets) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<TopicPartition, Long> e : offsets.entrySet()) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append(quote(e.getKey().toString())).append(':').append(e.getValue());
        }
        return b.append('}').toString();
    }

    static String divergentJson(Map<TopicPartition, OffsetAndMetadata> offsets) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append(quote(e.getKey().toString()))
                .append(":{\"offset\":").append(e.getValue().offset())
                .append(",\"leader_epoch\":").append(epoch(e.getValue().leaderEpoch()))
                .append('}');
        }
        return b.append('}').toString();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: TruncationProbe <bootstrap> <topic> <partition> <reset> [k=v...]");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, args[3]);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(Collections.singletonList(tp));
            emit("{\"event\":\"ready\",\"partition\":" + quote(tp.toString()) + "}");
            String line;
            while ((line = in.readLine()) != null) {
                String[] cmd = line.trim().split("\\s+");
                try {
                    switch (cmd[0]) {
                        case "poll":
                            poll(consumer, tp, Integer.parseInt(cmd[1]), Long.parseLong(cmd[2]));
                            break;
                        case "position":
                            emit("{\"event\":\"position\",\"offset\":"
                                + consumer.position(tp, Duration.ofSeconds(10)) + "}");
                            break;
                        case "seek":
                            Optional<Integer> e = cmd.length > 2
                                ? Optional.of(Integer.parseInt(cmd[2])) : Optional.empty();
                            consumer.seek(tp, new OffsetAndMetadata(Long.parseLong(cmd[1]), e, ""));
                            expected = null;
                            emit("{\"event\":\"seeked\",\"offset\":" + cmd[1]
                                + ",\"leader_epoch\":" + epoch(e) + "}");
                            break;
                        case "seek_to_beginning":
                            consumer.seekToBeginning(Collections.singletonList(tp));
                            expected = null;
                            emit("{\"event\":\"seeked\",\"to\":\"beginning\"}");
                            break;
                        case "seek_to_end":
                            consumer.seekToEnd(Collections.singletonList(tp));
                            expected = null;
                            emit("{\"event\":\"seeked\",\"to\":\"end\"}");
                            break;
                        case "commit":
                            // Needs group.id among the k=v properties: commits the position
                            // (with the epoch of the last record consumed), then reads it back.
                            consumer.commitSync(Duration.ofSeconds(10));
                            OffsetAndMetadata c = consumer.committed(
                                Collections.singleton(tp), Duration.ofSeconds(10)).get(tp);
                            emit(c == null ? "{\"event\":\"committed\",\"offset\":null}"
                                : "{\"event\":\"committed\",\"offset\":" + c.offset()
                                    + ",\"leader_epoch\":" + epoch(c.leaderEpoch()) + "}");
                            break;
                        case "quit":
                            emit("{\"event\":\"closed\"}");
                            return;
                        default:
                            emit("{\"event\":\"error\",\"type\":\"UnknownCommand\",\"message\":"
                                + quote(line) + "}");
                    }
                } catch (KafkaException | IllegalStateException | IllegalArgumentException ex) {
                    emit("{\"event\":\"error\",\"type\":" + quote(ex.getClass().getSimpleName())
                        + ",\"message\":" + quote(ex.getMessage()) + "}");
                }
            }
        }
    }

    static String truncationJson(LogTruncationException ex) {
        return "{\"event\":\"truncation\",\"at_ms\":" + System.currentTimeMillis()
            + ",\"divergent_offsets\":"
            + divergentJson(ex.divergentOffsets()) + ",\"fetch_offsets\":"
            + offsetsJson(ex.offsetOutOfRangePartitions()) + ",\"message\":"
            + quote(ex.getMessage()) + "}";
    }

    static String outOfRangeJson(OffsetOutOfRangeException ex) {
        return "{\"event\":\"out_of_range\",\"at_ms\":" + System.currentTimeMillis()
            + ",\"fetch_offsets\":"
            + offsetsJson(ex.offsetOutOfRangePartitions()) + ",\"message\":"
            + quote(ex.getMessage()) + "}";
    }

    static void poll(KafkaConsumer<byte[], byte[]> consumer, TopicPartition tp, int max, long timeoutMs) {
        long deadline = System.currentTimeMillis() + timeoutMs;
        int count = 0;
        String outcome = "timeout";
        while (count < max && System.currentTimeMillis() < deadline) {
            ConsumerRecords<byte[], byte[]> records;
            try {
                records = consumer.poll(Duration.ofMillis(100));
            } catch (LogTruncationException ex) {
                // Must precede OffsetOutOfRangeException, which it extends.
                emit(truncationJson(ex));
                outcome = "truncation";
                break;
            } catch (OffsetOutOfRangeException ex) {
                emit(outOfRangeJson(ex));
                outcome = "out_of_range";
                break;
            }
            for (ConsumerRecord<byte[], byte[]> r : records.records(tp)) {
                if (expected != null && r.offset() != expected) {
                    // The consumer moved its position by itself (a reset or a truncation rewind).
                    emit("{\"event\":\"position_jump\",\"from\":" + expected + ",\"to\":" + r.offset() + "}");
                }
                emit("{\"event\":\"record\",\"at_ms\":" + System.currentTimeMillis()
                    + ",\"offset\":" + r.offset() + ",\"leader_epoch\":"
                    + epoch(r.leaderEpoch()) + ",\"key\":" + bytes(r.key()) + ",\"value\":"
                    + bytes(r.value()) + "}");
                expected = r.offset() + 1;
                count++;
            }
            if (count >= max) {
                outcome = "enough";
            }
        }
        String position = "null";
        // After a truncation or out-of-range error the position waits for the driver's seek:
        // position() can block here for its whole timeout, a stall in which the consumer
        // sends nothing and the driver hears of the error late.
        boolean awaitingSeek = outcome.equals("truncation") || outcome.equals("out_of_range");
        try {
            if (!awaitingSeek) {
                position = Long.toString(consumer.position(tp, Duration.ofMillis(2000)));
            }
        } catch (LogTruncationException ex) {
            // position() validates too, and the consumer throws a detected truncation only
            // once: swallowing it here would hide it from the driver for good.
            emit(truncationJson(ex));
            outcome = "truncation";
        } catch (OffsetOutOfRangeException ex) {
            emit(outOfRangeJson(ex));
            outcome = "out_of_range";
        } catch (KafkaException ex) {
            // a position still being validated or reset after the timeout: reported as null
        }
        emit("{\"event\":\"polled\",\"count\":" + count + ",\"outcome\":" + quote(outcome)
            + ",\"position\":" + position + "}");
    }
}
