"""The update_cache records of a moved hot board's old shards, deleted (rankstream/reshard.py).

API nodes already ignore a shard of another count than the config's (common/boards.py
`hot_windows`); deleting its records (a null value per key, which compaction keeps for its
delete retention, then drops with the key) keeps the compacted topic from carrying them
forever. Every record of an old shard is found by reading its board's partition to its end:
the state records of members since deleted too."""

from __future__ import annotations

import time
from collections.abc import Collection
from uuid import uuid4

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from common.cache_records import partition_for
from common.clients import kafka_consumer, kafka_producer
from common.errors import InfrastructureError
from common.settings import Settings
from common.store.shards import board_of

KAFKA_TIMEOUT_S = 30.0


def delete_records(settings: Settings, names: Collection[str], partitions: int) -> int:
    """Delete every live update_cache record of the shards `names`; how many."""
    topic = settings.topic_cache
    wanted = {n.encode() for n in names}
    keys = _live_keys(settings, wanted, {partition_for(board_of(n), partitions) for n in names})
    producer = kafka_producer(settings, {"enable.idempotence": True, "acks": "all"})
    failed: list[str] = []

    def delivered(error: object, _msg: object) -> None:
        if error is not None:
            failed.append(str(error))

    for partition, key in keys:
        producer.produce(topic, value=None, key=key, partition=partition, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(KAFKA_TIMEOUT_S) or failed:
        raise InfrastructureError(
            f"Kafka did not take the update_cache deletions: {failed[:1] or 'timed out'}"
        )
    return len(keys)


def _live_keys(settings: Settings, names: set[bytes], partitions: set[int]) -> list[tuple[int, bytes]]:
    """(partition, key) of each record of `names` whose latest value is not a deletion."""
    topic = settings.topic_cache
    consumer = kafka_consumer(
        settings,
        {
            "group.id": f"rankstream-reshard-{uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        },
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=KAFKA_TIMEOUT_S)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        live: dict[bytes, int] = {}
        deadline = time.monotonic() + 600
        while not _at_end(consumer, topic, ends):
            if time.monotonic() > deadline:
                raise InfrastructureError(f"{topic} could not be read to its end within 600 s")
            msg = consumer.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            key = msg.key() or b""
            if key.partition(b"\0")[0] in names:
                if msg.value() is None:
                    live.pop(key, None)
                else:
                    live[key] = msg.partition() or 0
        return [(p, k) for k, p in live.items()]
    finally:
        consumer.close()


def _at_end(consumer: Consumer, topic: str, ends: dict[int, int]) -> bool:
    """Every partition read to its high watermark (a transaction's last offset is its marker)."""
    positions = consumer.position([TopicPartition(topic, p) for p in ends])
    return all(ends[tp.partition] == 0 or tp.offset >= ends[tp.partition] for tp in positions)
