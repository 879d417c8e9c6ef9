"""Reads a topic the way `rankstream dlq` must: committed records only (isolation.level
read_committed: a worker's aborted batch left dead letters no reader may see), from the beginning
of each partition up to the end it had when the read began, then stops; it never follows.

The end is the high watermark (a read_uncommitted probe's: a read_committed client's own
watermark is the last stable offset, short of records a transaction still open at the start may
yet commit), so the read waits for such a transaction to end; a read that gets nothing for
READ_TIMEOUT_S fails."""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from common.errors import InfrastructureError
from common.settings import Settings
from rankstream.dlq.clients import METADATA_TIMEOUT_S, consumer, topic_partitions

READ_TIMEOUT_S = 60.0
POLL_S = 0.5


def read_topic(settings: Settings, topic: str, setting: str) -> Generator[Message, None, None]:
    """Every committed record of `topic` (named by the setting `setting`, for the line that says
    it is missing), partition by partition in offset order, up to the ends taken at the start."""
    probe = _consumer(settings, "read_uncommitted")
    try:
        ends = {}
        for partition in topic_partitions(probe, settings, topic, setting):
            low, high = probe.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
            )
            if high > low:
                ends[partition] = high
    finally:
        probe.close()
    if not ends:
        return
    reader = _consumer(settings, "read_committed")
    try:
        yield from _read(reader, topic, ends)
    finally:
        reader.close()


def _consumer(settings: Settings, isolation: str) -> Consumer:
    return consumer(
        settings,
        {
            "group.id": f"rankstream-admin-dlq-{uuid.uuid4().hex[:8]}",  # assigns; never joins or commits
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        },
    )


def _read(reader: Consumer, topic: str, ends: dict[int, int]) -> Generator[Message, None, None]:
    """Each partition from its beginning until its position reaches its end (the position passes
    aborted records and transaction markers too, which are never delivered)."""
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    pending = dict(ends)
    deadline = time.monotonic() + READ_TIMEOUT_S
    while pending:
        if time.monotonic() >= deadline:
            left = ", ".join(f"{p} (end {end})" for p, end in sorted(pending.items()))
            raise InfrastructureError(
                f"could not read {topic} to its end: nothing came for {READ_TIMEOUT_S:g} s; "
                f"partitions left: {left} (a transaction still open?)"
            )
        msg = reader.poll(POLL_S)
        if msg is not None:
            deadline = time.monotonic() + READ_TIMEOUT_S  # the bound is on a read that stalls
            error = msg.error()
            partition, offset = msg.partition() or 0, msg.offset() or 0
            if error is None:
                if offset < pending.get(partition, -1):  # later records are not this read's
                    yield msg
            elif error.code() == KafkaError._PARTITION_EOF:
                if partition in pending and offset >= pending[partition]:
                    del pending[partition]
            else:
                raise KafkaException(error)
        if pending:
            for tp in reader.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= pending[tp.partition]:
                    del pending[tp.partition]
