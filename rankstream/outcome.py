"""Whether the worker group applied or dead-lettered one message of update_rank (what `rankstream
erase` and `reset` report): the group's commit past the message's offset says its batch is done,
Redis and the dead letters included (one transaction); the dead-letter topic says which."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition

from common.clients import kafka_consumer
from common.errors import InfrastructureError
from common.settings import Settings
from common.store.encoding import text
from worker.dlq import HEADER_OFFSET, HEADER_PARTITION, HEADER_REASON, HEADER_TOPIC
from worker.sources import commits_reader, group_commits

POLL_S = 0.2
# dead letters carry the worker's clock when it sent them: read from this long before the
# message's own time, for workers whose clocks lag the operator's
DEAD_LETTER_SLACK_MS = 10 * 60_000
SCAN_S = 60.0


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
    """The reason the message at (update_rank, partition, offset) was dead-lettered with, or None,
    once its batch is committed (wait_handled). The dead-letter topic is read committed, from
    shortly before the message was produced up to its end as it stands now: a record of ours lies
    below that end, and shows once transactions still open before it (another worker's batch, a
    dead worker's until it is aborted) are resolved. Raises if it can't tell."""
    source = (settings.topic_updates, str(partition), str(offset))
    probe, reader = _consumer(settings, "read_uncommitted"), _consumer(settings, "read_committed")
    try:
        ends = _ends(probe, settings.topic_dlq, produced_ms - DEAD_LETTER_SLACK_MS)
        return _scan(reader, settings.topic_dlq, ends, source) if ends else None
    finally:
        probe.close()
        reader.close()


def _consumer(settings: Settings, isolation: str) -> Consumer:
    return kafka_consumer(
        settings,
        {
            "group.id": f"rankstream-admin-{uuid.uuid4().hex[:8]}",  # never joins or commits
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,  # at the end (read committed: the last stable offset)
        },
    )


def _ends(probe: Consumer, dlq: str, since_ms: int) -> dict[int, tuple[int, int]]:
    """partition -> (first offset at or after `since_ms`, end offset now) of the dead-letter
    partitions that hold anything that recent (read uncommitted: the log's real end)."""
    topic = probe.list_topics(dlq, timeout=10).topics.get(dlq)
    if topic is None or topic.error is not None:
        return {}
    starts = probe.offsets_for_times([TopicPartition(dlq, p, since_ms) for p in topic.partitions], timeout=10)
    out = {}
    for tp in starts:
        if tp.offset >= 0:  # -1: nothing that recent
            _, high = probe.get_watermark_offsets(TopicPartition(dlq, tp.partition), timeout=10)
            out[tp.partition] = (tp.offset, high)
    return out


def _scan(
    reader: Consumer, dlq: str, ends: dict[int, tuple[int, int]], source: tuple[str, str, str]
) -> str | None:
    """Read each partition from its start to its end (committed records only; the position
    passes aborted ones and transaction markers too) looking for the dead letter of `source`."""
    reader.assign([TopicPartition(dlq, p, start) for p, (start, _) in ends.items()])
    pending = {p for p, (start, end) in ends.items() if start < end}
    deadline = time.monotonic() + SCAN_S
    while pending:
        if time.monotonic() >= deadline:
            raise InfrastructureError(
                f"could not tell whether the worker dead-lettered it: {dlq} was not readable to its end "
                f"within {SCAN_S:.0f} s (a transaction still open?)"
            )
        msg = reader.poll(0.5)
        if msg is not None:
            error = msg.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise InfrastructureError(
                    f"could not tell whether the worker dead-lettered it: {error.str()}"
                )
            if error is not None:  # the end as it stands: past ours once it reaches the end taken
                if (msg.offset() or 0) >= ends.get(msg.partition() or 0, (0, 0))[1]:
                    pending.discard(msg.partition() or 0)
            else:
                headers = dict(msg.headers() or [])  # only the source's and the reason's are read
                if (
                    tuple(text(headers.get(h)) for h in (HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET))
                    == source
                ):
                    return text(headers.get(HEADER_REASON)) or "unknown"
        positions = reader.position([TopicPartition(dlq, p) for p in pending])
        pending -= {tp.partition for tp in positions if tp.offset >= ends[tp.partition][1]}
    return None
