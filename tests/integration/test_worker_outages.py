"""A Redis or Kafka outage pauses the worker with back-off; nothing is committed unapplied,
nothing is lost, nothing is applied twice: afterwards Redis equals the model exactly."""

from __future__ import annotations

import time

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from common.settings import Settings
from rankstream.stack import LocalKafka, LocalRedis, free_port
from rankstream.topics import UPDATE_PARTITIONS, ensure_topics
from tests.helpers import applied_so_far, check_dlq, produce, running_worker, wait_for
from tests.oracle import ORACLE_BOARDS, Message, compare_redis, generate, now_ms, run_model

pytestmark = pytest.mark.integration


def committed_total(settings: Settings) -> int:
    reader = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.worker_group})
    try:
        parts = [TopicPartition(settings.topic_updates, p) for p in range(UPDATE_PARTITIONS)]
        return sum(max(tp.offset, 0) for tp in reader.committed(parts, timeout=10))
    finally:
        reader.close()


def stream(n: int) -> tuple[list[Message], list[Message], int]:
    start = now_ms()
    messages = list(generate(seed=11, total=n, now_ms=start))
    return messages[: len(messages) // 2], messages[len(messages) // 2 :], start


def test_redis_outage_pauses_and_loses_nothing(make_settings, tmp_path, consumer_factory):
    store = LocalRedis("redis", tmp_path / "redis", port=free_port(), persist=True)
    store.start()
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    settings = make_settings(boards=boards, redis_url=store.url)
    ensure_topics(settings)
    client = redis.Redis.from_url(store.url)
    first, second, start = stream(6000)
    try:
        produce(settings, first)
        with running_worker(settings) as loop:
            part_one = sum(run_model(first, start).seq.values())
            wait_for(lambda: applied_so_far(client, settings) >= part_one, 60, "the first half applied")
            wait_for(lambda: committed_total(settings) == len(first), 30, "the first half committed")
            store.stop()  # Redis goes away (its append-only file keeps what it acknowledged)
            produce(settings, second)
            retries = "rankstream_worker_batch_retries_total"
            wait_for(lambda: (loop.metrics.registry.get_sample_value(retries) or 0) >= 2, 30, "back-off")
            assert committed_total(settings) == len(first)  # nothing unapplied was committed
            store.start()
            model = run_model(first + second, start)
            wait_for(lambda: applied_so_far(client, settings) >= sum(model.seq.values()), 90, "all applied")
        compare_redis(client, settings.key_prefix, model)
        assert committed_total(settings) == len(first) + len(second)
        check_dlq(consumer_factory, settings, model, exact=True)
    finally:
        client.close()
        store.stop()


def test_kafka_outage_pauses_and_loses_nothing(make_settings, tmp_path, rclient):
    broker = LocalKafka("kafka", tmp_path / "kafka", port=free_port(), controller_port=free_port())
    broker.start()
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    settings = make_settings(boards=boards, kafka_bootstrap=broker.bootstrap)
    ensure_topics(settings)
    first, second, start = stream(4000)
    try:
        produce(settings, first)
        with running_worker(settings):
            part_one = sum(run_model(first, start).seq.values())
            wait_for(lambda: applied_so_far(rclient, settings) >= part_one, 60, "the first half applied")
            broker.stop()  # the broker goes away; its log dirs stay
            time.sleep(3)  # the worker keeps polling a dead broker: it must neither crash nor skip
            broker.start()
            produce(settings, second)
            model = run_model(first + second, start)
            wait_for(lambda: applied_so_far(rclient, settings) >= sum(model.seq.values()), 120, "all applied")
            # a commit refused while the coordinator reloads is retried by the running loop
            wait_for(
                lambda: committed_total(settings) == len(first) + len(second), 60, "everything committed"
            )
        compare_redis(rclient, settings.key_prefix, model)
    finally:
        broker.stop()
