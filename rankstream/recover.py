"""`rankstream recover` and `rankstream accept-redis`: what an operator does when a worker says
Redis does not hold what Kafka's commits say was applied (worker/sources.py).

recover       Redis was restored from a backup (or lost recent writes): rewind the consumer group
              to what Redis holds, per partition the offset after the last one it applied. What
              the backup missed is re-applied; what it already held is skipped by the boards'
              offset fences, so everything counts exactly once. The workers must be stopped
              (Kafka only moves an empty group's offsets).
accept-redis  Start from what Redis holds now, deliberately: an empty Redis gets a new epoch, and
              every partition is recorded as applied up to its committed offset. Events before
              those offsets that Redis lost stay lost. Workers may keep running: a blocked
              partition resumes within seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from common.clients import is_authorization, kafka_error, redis_client
from common.errors import ConfigError
from common.settings import Settings
from common.store.advance import raise_applied
from common.store.encoding import text
from common.store.keys import partition_sources
from common.store.slotmarks import write_marks
from worker.sources import (
    ACCEPTED,
    EPOCH,
    KAFKA_TIMEOUT_S,
    MARKED,
    commits_reader,
    describe_topic,
    group_commits,
    new_epoch,
    replay_field,
    stored_position,
)


@dataclass(frozen=True, slots=True)
class Group:
    topic_id: str
    partitions: list[int]
    committed: dict[int, tuple[int, str | None]]  # partition -> (offset, metadata)


def committed_group(settings: Settings, admin: AdminClient) -> Group:
    topic = settings.topic_updates
    try:
        topic_id, partitions = describe_topic(admin, topic)
    except Exception as exc:
        refused = kafka_error(exc)
        if refused is not None and is_authorization(refused):
            raise  # rankstream.cli says which permission is missing
        raise ConfigError(f"topic {topic}: {exc if refused is None else refused.str()}") from None
    reader = commits_reader(settings)
    try:
        return Group(topic_id, partitions, group_commits(reader, topic, partitions))
    finally:
        reader.close()


def require_stopped(settings: Settings, admin: AdminClient, command: str) -> None:
    """Raise ConfigError unless the worker group has no running member."""
    group_state = admin.describe_consumer_groups([settings.worker_group], request_timeout=KAFKA_TIMEOUT_S)
    if group_state[settings.worker_group].result().members:
        raise ConfigError(
            f"consumer group {settings.worker_group} has running members: stop the workers first "
            f"(scale them to 0), then run {command} again"
        )


def recover(settings: Settings) -> list[str]:
    """Rewind the group to what Redis holds; one line per partition that moved."""
    admin = AdminClient(settings.librdkafka())
    require_stopped(settings, admin, "recover")
    group = committed_group(settings, admin)
    client = redis_client(settings)
    key = partition_sources(settings.key_prefix, settings.worker_group, settings.topic_updates)
    stored = client.hgetall(key)
    epoch = text(stored.get(EPOCH.encode()))
    if epoch is None:
        raise ConfigError(
            "Redis holds no rankstream epoch: restore the backup first, or run `rankstream accept-redis` "
            "to start from an empty Redis"
        )
    earliest = _earliest(settings, group.partitions)
    commits: list[TopicPartition] = []  # every committed partition, with Redis' epoch
    records: dict[int, int] = {}  # what Redis holds, for partitions it had no record of
    replays: dict[str, str] = {}  # the workers do not dead-letter again what was committed before
    lines: list[str] = []
    for p in group.partitions:
        offset, _ = group.committed.get(p, (-1, None))
        if offset < 0:
            continue
        held = stored_position(stored.get(str(p).encode()), group.topic_id)
        target = min(offset, held + 1 if held is not None else earliest[p])
        commits.append(TopicPartition(settings.topic_updates, p, target, metadata=epoch))
        if held is None:
            records[p] = target - 1
        if target == offset:
            continue
        replays[replay_field(p)] = f"{group.topic_id}|{offset}"
        lines.append(f"partition {p}: {offset} -> {target} ({offset - target} offsets to re-apply)")
        if held is None and earliest[p] > 0:
            lines.append(
                f"  warning: partition {p} starts at offset {earliest[p]}: retention deleted older events"
            )
    raise_applied(client, key, group.topic_id, records)
    if replays:
        client.hset(key, mapping=replays)  # type: ignore[arg-type]  # Mapping is invariant
    if commits:
        request = [ConsumerGroupTopicPartitions(settings.worker_group, commits)]
        result = admin.alter_consumer_group_offsets(request, request_timeout=KAFKA_TIMEOUT_S)
        for tp in result[settings.worker_group].result().topic_partitions:
            if tp.error is not None:
                raise ConfigError(f"partition {tp.partition}: Kafka refused the rewind: {tp.error}")
    return lines or ["nothing to rewind: Redis holds everything the group committed"]


def accept_redis(settings: Settings) -> list[str]:
    """Record Redis as holding every partition up to its committed offset (never lowering what
    it records), in the epoch the commits name (a new one if they name none or several), and
    accept the commits' epochs."""
    admin = AdminClient(settings.librdkafka())
    group = committed_group(settings, admin)
    client = redis_client(settings)
    key = partition_sources(settings.key_prefix, settings.worker_group, settings.topic_updates)
    named = sorted({m for _, m in group.committed.values() if m})
    lines: list[str] = []
    # an empty Redis keeps the epoch the commits name, so boards written meanwhile (a batch in
    # flight when Redis was emptied) stay valid; a worker that started one first wins (HSETNX)
    if client.hsetnx(key, EPOCH, named[-1] if len(named) == 1 else new_epoch()):
        lines.append(f"Redis starts over in epoch {text(client.hget(key, EPOCH))}")
    epoch = text(client.hget(key, EPOCH))
    accepted = set((text(client.hget(key, ACCEPTED)) or "").split(",")) | set(named)
    accepted -= {"", epoch}
    if accepted:
        client.hset(key, ACCEPTED, ",".join(sorted(accepted)))
        lines.append(f"commits of epoch {', '.join(sorted(accepted))} accepted in epoch {epoch}")
    raise_applied(client, key, group.topic_id, {p: offset - 1 for p, (offset, _) in group.committed.items()})
    if settings.redis_cluster:
        written = write_marks(client, settings.key_prefix)
        client.hset(key, MARKED, "1")  # the workers check the marks from now on
        if written:
            lines.append(
                f"{written} Redis Cluster slots had lost their mark (and their data) or had none: "
                "marked; restart the workers whose boards were blocked (board_epoch_mismatch)"
            )
    lines += [
        f"partition {p}: Redis taken as holding everything before offset {offset}"
        for p, (offset, _) in sorted(group.committed.items())
    ]
    return lines or ["nothing committed yet: nothing to accept"]


def _earliest(settings: Settings, partitions: list[int]) -> dict[int, int]:
    consumer = Consumer(settings.librdkafka({"group.id": f"{settings.worker_group}-recover"}))
    try:
        return {
            p: consumer.get_watermark_offsets(
                TopicPartition(settings.topic_updates, p), timeout=KAFKA_TIMEOUT_S
            )[0]
            for p in partitions
        }
    finally:
        consumer.close()
