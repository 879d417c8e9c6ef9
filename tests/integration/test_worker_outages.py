"""A Redis or Kafka outage pauses the worker with back-off; nothing is committed unapplied,
nothing is lost, nothing is applied twice: afterwards Redis equals the model exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from common.settings import load_settings
from rankstream.stack import LocalKafka, LocalRedis, free_port
from rankstream.topics import UPDATE_PARTITIONS, ensure_topics
from tests.helpers import applied_so_far, check_dlq, committed_total, produce, running_worker, wait_for
from tests.integration.test_worker_oracle import ROOT
from tests.oracle import ORACLE_BOARDS, Message, compare_redis, generate, now_ms, run_model
from worker.main import BROKER_DEFAULT_MAX_MESSAGE_BYTES, PRODUCER_MESSAGE_MAX_BYTES, dlq_record_limit

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
            # a commit refused while the coordinator reloads is retried by the running loop (once,
            # under the whole suite's load on two cores, the reload and retry took over 60 s)
            wait_for(
                lambda: committed_total(settings) == len(first) + len(second), 120, "everything committed"
            )
        compare_redis(rclient, settings.key_prefix, model)
    finally:
        broker.stop()


# What the worker's SourceGuard does before a batch, in a child process: a crash fails the test
# instead of killing the session. argv: bootstrap, topic, partitions, groups; prints the last
# group's commits and how many reads Kafka refused (the worker rewinds and retries those).
READ_COMMITS = """
import sys
from confluent_kafka import KafkaException
from common.settings import load_settings
from worker.sources import commits_reader, group_commits

bootstrap, topic, partitions, *groups = sys.argv[1:]
refused, found = 0, None
for group in groups:
    reader = commits_reader(load_settings({}, kafka_bootstrap=bootstrap, worker_group=group))
    try:
        found = group_commits(reader, topic, list(range(int(partitions))))
    except KafkaException:
        refused += 1
    finally:
        reader.close()
print(sorted(found.items()) if found is not None else None, refused)
"""


def read_commits(bootstrap: str, topic: str, groups: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", READ_COMMITS, bootstrap, topic, str(UPDATE_PARTITIONS), *groups],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    died = f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else proc.returncode
    assert proc.returncode == 0, f"reading the group's commits: {died}\n{proc.stderr[-2000:]}"
    return proc.stdout.strip()


def test_commits_are_read_while_the_coordinator_is_not_ready(make_settings, tmp_path):
    """A broker that has just started answers offset fetches with NOT_COORDINATOR for a while;
    the admin client's list_consumer_group_offsets turned that into a SIGSEGV of the whole
    process (confluentinc/librdkafka#5040), every worker's first check after a start or a
    broker restart. The worker's reader gets an error (the batch is retried), never a crash."""
    broker = LocalKafka("kafka", tmp_path / "kafka", port=free_port(), controller_port=free_port())
    broker.start()
    try:
        settings = make_settings(kafka_bootstrap=broker.bootstrap)
        ensure_topics(settings)
        fresh = [f"fresh-{uuid.uuid4().hex[:8]}-{i}" for i in range(20)]
        read_commits(broker.bootstrap, settings.topic_updates, fresh)  # at once: no coordinator yet
        epoch = "e" + uuid.uuid4().hex[:6]
        writer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": settings.worker_group})
        try:
            offsets = [TopicPartition(settings.topic_updates, 1, 7, metadata=epoch)]
            writer.commit(offsets=offsets, asynchronous=False)
        finally:
            writer.close()
        assert read_commits(broker.bootstrap, settings.topic_updates, [settings.worker_group]) == (
            f"[(1, (7, '{epoch}'))] 0"
        )
    finally:
        broker.stop()


def test_dead_letter_limit_falls_back_when_no_broker_answers():
    """The worker asks the DLQ topic's max.message.bytes at start; a broker that never answers
    (the describe times out) leaves the broker default, not a traceback."""
    settings = load_settings({}, kafka_bootstrap=f"127.0.0.1:{free_port()}")
    expected = min(PRODUCER_MESSAGE_MAX_BYTES, BROKER_DEFAULT_MAX_MESSAGE_BYTES)
    assert dlq_record_limit(settings) == expected
