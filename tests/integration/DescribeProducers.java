// The broker's own account of who wrote to a topic idempotently (tests/integration/test_producers.py).
//
//   java -cp "<kafka-clients and slf4j jars>/*" DescribeProducers.java BOOTSTRAP TOPIC
//
// Prints one line per active producer state on each partition of TOPIC (Admin API
// DescribeProducers, KIP-664): "partition=P producerId=N epoch=E lastSequence=S". The broker keeps
// such a state only for record batches written with a producer id, that is by an idempotent (or
// transactional) producer; a producer without idempotence writes producer id -1 and leaves none.
// Run as a single-file program: the JDK compiles it on the fly, no build needed.

import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;

public final class DescribeProducers {
    public static void main(String[] args) throws Exception {
        String topic = args[1];
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(props)) {
            TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            List<TopicPartition> partitions = description.partitions().stream()
                    .map(p -> new TopicPartition(topic, p.partition()))
                    .toList();
            Map<TopicPartition, PartitionProducerState> states = admin.describeProducers(partitions).all().get();
            for (Map.Entry<TopicPartition, PartitionProducerState> entry : states.entrySet()) {
                for (ProducerState state : entry.getValue().activeProducers()) {
                    System.out.printf("partition=%d producerId=%d epoch=%d lastSequence=%d%n",
                            entry.getKey().partition(), state.producerId(), state.producerEpoch(), state.lastSequence());
                }
            }
        }
    }
}
