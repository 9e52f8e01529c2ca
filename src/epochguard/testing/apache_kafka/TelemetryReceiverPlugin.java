// Broker-side receiver of client metrics pushes (KIP-714) for epochguard's tests: a metrics
// reporter that is also a ClientTelemetry, so the broker hands it every PushTelemetry it
// accepts. Each push becomes one JSON line in the file named by the broker config
// `epochguard.telemetry.file`: the client instance id, the terminating flag, the content
// type, the pushing client's id and the payload (OTLP MetricsData) in base64.
//
// Broker config: metric.reporters=TelemetryReceiverPlugin, with the compiled class on the
// broker's classpath (ApacheKafkaCluster(telemetry_file=...) sets both).

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

public class TelemetryReceiverPlugin implements MetricsReporter, ClientTelemetry {
    public static final String FILE_CONFIG = "epochguard.telemetry.file";

    private volatile String file;

    @Override
    public void configure(Map<String, ?> configs) {
        Object value = configs.get(FILE_CONFIG);
        file = value == null ? null : value.toString();
    }

    @Override
    public void init(List<KafkaMetric> metrics) {}

    @Override
    public void metricChange(KafkaMetric metric) {}

    @Override
    public void metricRemoval(KafkaMetric metric) {}

    @Override
    public void close() {}

    @Override
    public ClientTelemetryReceiver clientReceiver() {
        return this::record;
    }

    private void record(AuthorizableRequestContext context, ClientTelemetryPayload payload) {
        String target = file;
        if (target == null) {
            return;
        }
        ByteBuffer data = payload.data().duplicate();
        byte[] bytes = new byte[data.remaining()];
        data.get(bytes);
        String line = "{\"client_instance_id\": \"" + payload.clientInstanceId()
            + "\", \"terminating\": " + payload.isTerminating()
            + ", \"content_type\": \"" + escape(payload.contentType())
            + "\", \"client_id\": \"" + escape(context.clientId())
            + "\", \"data\": \"" + Base64.getEncoder().encodeToString(bytes) + "\"}\n";
        synchronized (TelemetryReceiverPlugin.class) {
            try (FileOutputStream out = new FileOutputStream(target, true)) {
                out.write(line.getBytes(StandardCharsets.UTF_8));
            } catch (IOException e) {
                throw new RuntimeException("cannot record a telemetry push in " + target, e);
            }
        }
    }

    private static String escape(String text) {
        if (text == null) {
            return "";
        }
        return text.replace("\\", "\\\\").replace("\"", "\\\"");
    }
}
