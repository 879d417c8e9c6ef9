"""The servers the suite runs on are real, and the topics are what the contract says."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]  # re-exported at runtime, not in the stub's __all__

from common.errors import InfrastructureError
from rankstream.stack import free_port
from rankstream.topics import ensure_topics

pytestmark = pytest.mark.integration


def test_kafka_round_trip(topics, producer, consumer_factory):
    sent = [f"message-{i}".encode() for i in range(200)]
    for i, value in enumerate(sent):
        producer.produce(topics.topic_updates, value, key=str(i % 7).encode())
    assert producer.flush(10) == 0
    consumer = consumer_factory(topics.topic_updates)
    got: list[bytes] = []
    for _ in range(60):
        for msg in consumer.consume(500, 1.0):
            assert msg.error() is None
            got.append(msg.value())
        if len(got) >= len(sent):
            break
    assert sorted(got) == sorted(sent)


def test_redis_round_trip(settings, rclient):
    key = f"{settings.key_prefix}probe"
    rclient.zadd(key, {"a": 1, "b": 2})
    assert rclient.zrevrange(key, 0, -1, withscores=True) == [(b"b", 2.0), (b"a", 1.0)]


def test_topics_are_created_as_the_contract_says(settings):
    created = ensure_topics(settings)
    names = [settings.topic_updates, settings.topic_dlq, settings.topic_cache, settings.topic_results,
             settings.topic_dlq_replayed]  # fmt: skip
    assert sorted(created) == sorted(names)
    assert ensure_topics(settings) == []  # idempotent
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    # in the broker's metadata once it returns: the next step (a backfill, a worker) finds them
    meta = admin.list_topics(timeout=10).topics
    assert set(names) <= set(meta)
    assert len(meta[settings.topic_updates].partitions) == 6
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topic_cache)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"
    # period results: compacted per key and kept 30 days, records up to 16 MiB (a 10,000 top)
    assert len(meta[settings.topic_results].partitions) == 3
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topic_results)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact,delete"
    assert configs["retention.ms"].value == str(30 * 86_400_000)
    assert configs["max.message.bytes"].value == str(16 * 1024 * 1024)
    for future in admin.delete_topics(list(created), operation_timeout=30).values():
        future.result(timeout=30)


def test_topics_without_a_reachable_kafka_fail_with_one_clear_error(settings):
    """A wrong bootstrap: `rankstream topics` fails with an error naming it (one line, exit 1,
    through the CLI's InfrastructureError), not a bare TimeoutError's traceback."""
    bootstrap = f"127.0.0.1:{free_port()}"
    wrong = settings.model_copy(update={"kafka_bootstrap": bootstrap})
    with pytest.raises(InfrastructureError, match=f"Kafka at {bootstrap} did not answer in 2 s"):
        ensure_topics(wrong, timeout=2)
