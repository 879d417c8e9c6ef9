package example;

import com.fasterxml.jackson.annotation.JsonInclude;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Sends rankstream score events with kafka-clients: one event for one board, then one gift that
 * counts on three boards as one message (an array).
 *
 * <pre>
 * mvn -q package
 * BOOTSTRAP=127.0.0.1:9092 TOPIC=update_rank java -jar target/rankstream-producer.jar room42
 * </pre>
 *
 * A secured cluster: TLS_CA (the authority's PEM file: TLS), SASL_MECHANISM (SCRAM-SHA-512,
 * SCRAM-SHA-256 or PLAIN), SASL_USERNAME and SASL_PASSWORD.
 *
 * The event's fields: docs/contract.md §2; how to produce well: docs/producing.md.
 */
public final class Produce {

    /**
     * One score update. Left out here: "op" (default "incr") and "ts" (default: the message's
     * timestamp, the send time).
     *
     * @param id unique per board for the thing it counts
     * @param board "type:scope", here boards of type gift
     * @param member who gets the score
     * @param score added to the member's score (op incr)
     * @param meta the member's profile, shown beside it in reads
     */
    @JsonInclude(JsonInclude.Include.NON_NULL)
    record Event(String id, String board, String member, long score, Map<String, String> meta) {}

    public static void main(String[] args) throws Exception {
        String room = args.length > 0 ? args[0] : "room42";
        String topic = getenv("TOPIC", "update_rank");

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, getenv("BOOTSTRAP", "127.0.0.1:9092"));
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        // Idempotence: the broker drops the duplicates of the producer's own retries. Both are the
        // defaults since Kafka 3.0, spelled out because a stray acks=1 elsewhere would otherwise
        // turn idempotence off silently; set explicitly, the client refuses any acks but all.
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.putAll(security());

        // What is in effect, as the client reads its configuration.
        ProducerConfig config = new ProducerConfig(props);
        boolean idempotent = config.getBoolean(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG);
        String acks = config.getString(ProducerConfig.ACKS_CONFIG);
        System.out.printf("producer: enable.idempotence=%b acks=%s%n", idempotent, "-1".equals(acks) ? "all" : acks);

        // Ids name the thing counted (an order, a gift's transaction): here one per run.
        long run = System.currentTimeMillis();
        String board = "gift:" + room;

        // (a) One event: alice received a gift worth 50 in the room.
        Event single = new Event("order-" + run, board, "alice", 50, Map.of("name", "Alice"));

        // (b) One gift that counts on the room, its zone and a global board: one message, an array
        // with one event per board. The same id on each is right: ids are per board. (A service
        // names its real zone and global boards, gift:zone-eu, gift:global; here they are named
        // after the room, so that every run has boards of its own.)
        List<Event> batch = new ArrayList<>();
        for (String b : List.of(board, board + "-zone", board + "-global")) {
            batch.add(new Event("gift-" + run, b, "bob", 10, Map.of("name", "Bob")));
        }

        ObjectMapper json = new ObjectMapper();
        AtomicBoolean failed = new AtomicBoolean();
        try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(props)) {
            // The key is the board (for an array: its first board): one board's events stay in order.
            for (Object value : List.of(single, batch)) {
                ProducerRecord<String, byte[]> record = new ProducerRecord<>(topic, board, json.writeValueAsBytes(value));
                producer.send(record, (meta, error) -> {
                    if (error != null) {
                        failed.set(true);
                        System.err.printf("not sent (%s): %s%n", board, error);
                    } else {
                        System.out.printf("sent %s to %s[%d]@%d%n", board, meta.topic(), meta.partition(), meta.offset());
                    }
                });
            }
            // send() is asynchronous: wait for every message's answer before exiting.
            producer.flush();
        }
        System.exit(failed.get() ? 1 : 0);
    }

    /** The login and TLS settings the environment asks for (none: plain TCP, no login). */
    static Properties security() {
        Properties props = new Properties();
        String ca = System.getenv("TLS_CA");
        String mechanism = System.getenv("SASL_MECHANISM");
        boolean tls = ca != null && !ca.isEmpty();
        boolean login = mechanism != null && !mechanism.isEmpty();
        if (tls) {
            props.put("ssl.truststore.type", "PEM");
            props.put("ssl.truststore.location", ca);
        }
        if (login) {
            String module = mechanism.equals("PLAIN")
                    ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                    : "org.apache.kafka.common.security.scram.ScramLoginModule";
            props.put("sasl.mechanism", mechanism);
            props.put("sasl.jaas.config", String.format("%s required username=\"%s\" password=\"%s\";",
                    module, getenv("SASL_USERNAME", ""), getenv("SASL_PASSWORD", "")));
        }
        props.put("security.protocol", tls ? (login ? "SASL_SSL" : "SSL") : (login ? "SASL_PLAINTEXT" : "PLAINTEXT"));
        return props;
    }

    private static String getenv(String name, String fallback) {
        String value = System.getenv(name);
        return value == null || value.isEmpty() ? fallback : value;
    }
}
