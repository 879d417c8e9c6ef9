"""Whether the worker group applied or dead-lettered one message of update_rank (what `rankstream
erase` and `reset` report): the group's commit past the message's offset says its batch is done,
Redis and the dead letters included (one transaction); the dead-letter topic says which."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from common.clients import kafka_consumer
from common.settings import Settings
from worker.dlq import HEADER_OFFSET, HEADER_PARTITION, HEADER_REASON, HEADER_TOPIC
from worker.sources import commits_reader, group_commits

POLL_S = 0.2
DEAD_LETTER_SLACK_MS = 60_000  # dead letters are stamped when the worker sends them: after the message


def wait_handled(settings: Settings, partition: int, offset: int, wait_s: float) -> bool:
    """Until the worker group's commit on the partition passes `offset`; False at the deadline."""
    reader = commits_reader(settings)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            committed = group_commits(reader, settings.topic_updates, [partition]).get(partition)
            if committed is not None and committed[0] > offset:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
    finally:
        reader.close()


def dead_letter_reason(settings: Settings, partition: int, offset: int, produced_ms: int) -> str | None:
    """The reason the message at (update_rank, partition, offset) was dead-lettered with, or None:
    the dead-letter topic read from shortly before the message was produced to its end."""
    dlq = settings.topic_dlq
    consumer = kafka_consumer(
        settings,
        {
            "group.id": f"rankstream-admin-{uuid.uuid4().hex[:8]}",  # never joins or commits
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        },
    )
    try:
        return _scan(consumer, dlq, produced_ms, (settings.topic_updates, str(partition), str(offset)))
    finally:
        consumer.close()


def _scan(consumer: Consumer, dlq: str, since_ms: int, source: tuple[str, str, str]) -> str | None:
    topic = consumer.list_topics(dlq, timeout=10).topics.get(dlq)
    if topic is None or topic.error is not None:
        return None
    starts = consumer.offsets_for_times(
        [TopicPartition(dlq, p, since_ms - DEAD_LETTER_SLACK_MS) for p in topic.partitions], timeout=10
    )
    live = [tp for tp in starts if tp.offset >= 0]  # -1: nothing that recent
    if not live:
        return None
    consumer.assign(live)
    open_partitions = {tp.partition for tp in live}
    deadline = time.monotonic() + 30
    while open_partitions and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error() is not None:
            open_partitions.discard(msg.partition() or 0)  # the end (partition EOF) or an error
            continue
        headers = {pair[0]: _text(pair[1]) for pair in msg.headers() or [] if pair[1] is not None}
        if tuple(headers.get(h, "") for h in (HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET)) == source:
            return headers.get(HEADER_REASON) or "unknown"
    return None


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode(errors="replace")
