"""A Redis Cluster shard losing a board's data, while the group's records live on: the board's
partition stops (board_epoch_mismatch) instead of counting the board from zero
(common/store/slotmarks.py); the rest of the stream goes on."""

from __future__ import annotations

import json
import time
import zlib

import pytest
from confluent_kafka import Producer
from redis.crc import key_slot

from common.settings import Settings
from common.store.keys import BoardKeys
from common.store.slotmarks import mark_of
from common.store.topology import SLOTS
from rankstream.recover import accept_redis
from rankstream.topics import UPDATE_PARTITIONS
from tests.helpers import running_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("topology", ["cluster"], indirect=True)]


def send(settings: Settings, board: str, first: int, n: int) -> int:
    """Produce n events of the board; the partition they went to (the board is their key)."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    partitions: set[int] = set()
    for i in range(first, first + n):
        event = {"id": f"{board}-{i}", "board": board, "member": f"m{i % 7}", "score": 1}
        producer.produce(
            settings.topic_updates, json.dumps(event).encode(), key=board.encode(),
            on_delivery=lambda err, msg: partitions.add(msg.partition() or 0),
        )  # fmt: skip
    assert producer.flush(30) == 0
    (partition,) = partitions
    return partition


def partition_of(board: str) -> int:
    """librdkafka's default partitioner (consistent_random: CRC32 of the key) over the topic's 6."""
    return zlib.crc32(board.encode()) % UPDATE_PARTITIONS


def seq(rclient, settings: Settings, board: str) -> int:
    return int(rclient.get(BoardKeys(settings.key_prefix, board).seq) or 0)


def test_a_board_whose_slot_lost_its_data_stops_its_partition(topics: Settings, rclient):
    settings = topics
    lost = "gift:lost-room"
    kept = next(f"gift:kept-{i}" for i in range(100) if partition_of(f"gift:kept-{i}") != partition_of(lost))
    with running_worker(settings) as loop:
        send(settings, lost, 0, 50)
        send(settings, kept, 0, 50)
        wait_for(lambda: seq(rclient, settings, lost) == seq(rclient, settings, kept) == 50, 60, "applied")
        marks = list(rclient.scan_iter(match=f"{settings.key_prefix}{{s*}}:slot", count=5000))
        assert len(marks) == SLOTS  # the first worker marked every slot
        # the shard holding the board loses it: every key of the test in its slot is gone
        slot = key_slot(BoardKeys(settings.key_prefix, lost).seq.encode())
        doomed = [
            k for k in rclient.scan_iter(match=f"{settings.key_prefix}*", count=5000) if key_slot(k) == slot
        ]
        assert mark_of(BoardKeys(settings.key_prefix, lost)).encode() in doomed
        rclient.delete(*doomed)
        lost_partition = send(settings, lost, 50, 20)
        kept_partition = send(settings, kept, 50, 20)
        assert lost_partition != kept_partition
        guard = loop.guard
        assert guard is not None
        wait_for(
            lambda: any(b.reason == "board_epoch_mismatch" for b in guard.blocked.values()), 60, "blocked"
        )
        details = {b.detail for b in guard.blocked.values()}
        assert any(lost in d and "lost its data" in d for d in details), details
        assert set(guard.blocked) == {lost_partition}
        wait_for(lambda: seq(rclient, settings, kept) == 70, 30, "the other partition going on")
        time.sleep(1)
        assert seq(rclient, settings, lost) == 0  # nothing counted from zero
    said = accept_redis(settings)  # the way out: the loss accepted, the slot marked again
    assert any(line.startswith("1 Redis Cluster slots had lost their mark") for line in said), said
    assert len(list(rclient.scan_iter(match=f"{settings.key_prefix}{{s*}}:slot", count=5000))) == SLOTS
