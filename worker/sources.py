"""Redis loss never goes unnoticed (CONTRACT 4): what Redis holds is checked against what Kafka's
committed offsets say was applied, before every batch.

Redis keeps, per consumer group and topic, one hash (`common/keys.py` partition_sources): the
*epoch* of its data set (a random name given when a deployment starts on an empty Redis) and, per
partition, the topic id and the last offset whose batch was applied (written after the batch's
scripts, before its offsets are committed). Every offset commit carries the epoch as its Kafka
metadata. So before a batch of partition P (committed offset C, metadata M):

  Redis has no epoch   M set on any partition: Redis lost its data (flush, failover to an empty
                       replica) -> P is blocked. No commits anywhere: a fresh deployment -> a new
                       epoch. Commits without metadata: the previous release's -> adopted (a new
                       epoch, and its per-event id records honoured for a while, see apply.lua).
  M is another epoch   Redis holds another data set than the group applied into -> blocked.
  P's last offset < C-1 (or no record while M says this epoch applied P): Redis is behind the
                       commits (restored from a backup, or writes lost) -> blocked.

A blocked partition is paused and re-checked every few seconds; `rankstream recover` (rewind the
group to what Redis holds) or `rankstream accept-redis` (start from what Redis holds) unblocks
it. The boards' own fences carry the epoch too, so a board left from another data set is caught
by apply.lua (worker/apply.py EpochMismatch)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from common.errors import InfrastructureError
from common.keys import partition_sources
from worker.apply import Applier, Source

_log = logging.getLogger(__name__)
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed
KAFKA_TIMEOUT_S = 10.0
EPOCH = "epoch"
LEGACY_UNTIL = "legacy_until"
BOARD_EPOCH = "board_epoch_mismatch"


def replay_field(partition: int) -> str:
    """Where `rankstream recover` notes the offset a partition was committed at before the rewind."""
    return f"{partition}!replay"


def new_epoch() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class Blocked:
    partition: int
    reason: str  # redis_lost | epoch_mismatch | redis_behind
    detail: str


@dataclass(slots=True)
class _Partition:
    source: Source  # low_water = the last committed offset (-1: none)
    metadata: str | None  # the epoch the group's last commit carried (None: no commit, or a previous release)
    known: bool = True  # False: the committed offset could not be read yet (asked again before a batch)
    replay_until: int = -1  # `rankstream recover` rewound it: offsets below were dead-lettered before


def stored_position(raw: bytes | str | None, topic_id: str) -> int | None:
    """The last applied offset of a partition's record, None if absent or of another topic id."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    tid, _, offset = text.rpartition("|")
    return int(offset) if tid == topic_id else None


def judge(partition: int, part: _Partition, epoch: str, stored: int | None) -> Blocked | None:
    """Whether partition `part` may be applied onto Redis' data set `epoch` holding `stored`."""
    committed = part.source.low_water
    if part.metadata is not None and part.metadata != epoch:
        detail = f"the group committed into Redis epoch {part.metadata}, Redis holds epoch {epoch}"
        return Blocked(partition, "epoch_mismatch", detail)
    if committed < 0 or (stored is None and part.metadata is None):
        return None  # nothing committed yet, or the previous release's commits: adopted
    if stored is None or stored < committed:
        held = "nothing" if stored is None else f"offset {stored}"
        detail = f"Redis holds {held} of partition {partition}, the group committed up to offset {committed}"
        return Blocked(partition, "redis_behind", detail)
    return None


class SourceGuard:
    def __init__(
        self,
        client: redis.Redis,
        admin: AdminClient,
        applier: Applier,
        *,
        key_prefix: str,
        group: str,
        topic: str,
        legacy_ttl_ms: int,
        adopt_window_ms: int,
    ) -> None:
        self._client = client
        self._admin = admin
        self._applier = applier
        self._key = partition_sources(key_prefix, group, topic)
        self._topic = topic
        self._legacy_ttl_ms = legacy_ttl_ms
        self._adopt_window_ms = adopt_window_ms
        self._topic_id = ""
        self._parts: dict[int, _Partition] = {}
        self.blocked: dict[int, Blocked] = {}
        self.epoch: str | None = None

    @property
    def topic(self) -> str:
        return self._topic

    def start(self) -> None:
        """At start-up: the topic's id, which every fence records (a worker that can't learn it
        must not apply anything: it exits, and is restarted)."""
        self._topic_id = self._describe_topic_id()

    # --- consumer thread: rebalance callbacks and the loop ---------------------------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = [tp.partition for tp in partitions if tp.topic == self._topic]
        if not mine:
            return
        try:  # a recreated topic has a new id; keep the one known if Kafka can't say now
            self._topic_id = self._describe_topic_id()
        except KafkaException as exc:
            _log.warning("could not read the topic id, keeping the last one", extra={"error": str(exc)})
        for p in mine:
            self._parts[p] = _Partition(Source(self._topic, p, self._topic_id, -1), None, known=False)
        self._read_commits(consumer, mine)

    def _read_commits(self, consumer: Consumer, partitions: list[int]) -> None:
        """The group's committed offset and epoch of each partition; left unknown on failure."""
        wanted = [TopicPartition(self._topic, p) for p in partitions]
        try:
            committed = consumer.committed(wanted, KAFKA_TIMEOUT_S)
        except KafkaException as exc:
            _log.warning("could not read committed offsets yet", extra={"error": str(exc)})
            return
        for tp in committed:
            part = self._parts.get(tp.partition)
            if part is not None:
                offset = tp.offset - 1 if tp.offset >= 0 else -1
                part.source = Source(self._topic, tp.partition, self._topic_id, offset)
                part.metadata, part.known = tp.metadata or None, True

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.pop(tp.partition, None)
            self.blocked.pop(tp.partition, None)

    def replayed(self, partition: int, offset: int) -> bool:
        """Was this message's batch committed before `rankstream recover` rewound the group? Then
        its dead letters went out already and are not sent again."""
        part = self._parts.get(partition)
        return part is not None and offset < part.replay_until

    def source(self, topic: str, partition: int) -> Source:
        part = self._parts.get(partition)
        if part is None or topic != self._topic:
            return Source(topic, partition, self._topic_id, -1)
        return part.source

    def check(self, consumer: Consumer, partitions: Iterable[int]) -> list[Blocked]:
        """Before a batch: may these partitions be applied? Sets the applier's epoch and legacy
        mode; returns the partitions that may not (and remembers them as blocked)."""
        numbers = sorted(set(partitions))
        unknown = [p for p in numbers if p in self._parts and not self._parts[p].known]
        if unknown:
            self._read_commits(consumer, unknown)
            if any(not self._parts[p].known for p in unknown):
                raise InfrastructureError("the group's committed offsets can't be read")
        fields = [EPOCH, LEGACY_UNTIL, *(str(p) for p in numbers)]
        fields += [replay_field(p) for p in numbers]
        values = self._client.hmget(self._key, fields)
        for p, raw in zip(numbers, values[2 + len(numbers) :], strict=True):
            if p in self._parts:
                self._parts[p].replay_until = int(raw) if raw is not None else -1
        values = values[: 2 + len(numbers)]
        epoch, legacy_until = (text(v) for v in values[:2])
        if epoch is None:
            epoch = self._start_epoch(consumer)
            if epoch is None:
                verdicts = [
                    Blocked(p, "redis_lost", "Redis holds no rankstream data, the group's commits say it did")
                    for p in numbers
                ]
                return self._remember(numbers, verdicts)
            legacy_until = text(self._client.hget(self._key, LEGACY_UNTIL))
        self.epoch = epoch
        self._applier.epoch = epoch
        adopting = legacy_until is not None and int(legacy_until) > time.time() * 1000
        self._applier.legacy_ttl_ms = self._legacy_ttl_ms if adopting else 0
        verdicts = []
        for p, raw in zip(numbers, values[2:], strict=True):
            part = self._parts.get(p)
            if part is None:
                continue
            verdict = judge(p, part, epoch, stored_position(raw, self._topic_id))
            if verdict is not None:
                verdicts.append(verdict)
        return self._remember(numbers, verdicts)

    def _remember(self, numbers: list[int], verdicts: list[Blocked]) -> list[Blocked]:
        """The verdicts of this check replace the last ones, except a board's own epoch mismatch,
        which only a restart (or losing the partition) clears: the check can't see boards."""
        for p in numbers:
            if p in self.blocked and self.blocked[p].reason != BOARD_EPOCH:
                del self.blocked[p]
        for verdict in verdicts:
            self.blocked.setdefault(verdict.partition, verdict)
        return [v for v in verdicts if self.blocked[v.partition] is v]

    def block_board(self, partitions: Iterable[int], detail: str) -> list[Blocked]:
        """apply.lua found a board written in another epoch: its partitions stop for good."""
        verdicts = [Blocked(p, BOARD_EPOCH, detail) for p in sorted(partitions)]
        for verdict in verdicts:
            self.blocked[verdict.partition] = verdict
        return verdicts

    def held(self) -> list[int]:
        return sorted(self._parts)

    def _start_epoch(self, consumer: Consumer) -> str | None:
        """Redis has no epoch: start one (fresh deployment, or adopting the previous release's
        data), or None when the group's commits say Redis lost what it held."""
        metadata = consumer.list_topics(self._topic, timeout=KAFKA_TIMEOUT_S).topics[self._topic]
        everything = [TopicPartition(self._topic, p) for p in sorted(metadata.partitions)]
        committed = [tp for tp in consumer.committed(everything, KAFKA_TIMEOUT_S) if tp.offset >= 0]
        if any(tp.metadata for tp in committed):
            return None
        mapping = {EPOCH: new_epoch()}
        if committed:  # commits without an epoch: the previous release's
            mapping[LEGACY_UNTIL] = str(int(time.time() * 1000) + self._adopt_window_ms)
        pipe = self._client.pipeline(transaction=True)
        pipe.hsetnx(self._key, EPOCH, mapping[EPOCH])
        if LEGACY_UNTIL in mapping:
            pipe.hsetnx(self._key, LEGACY_UNTIL, mapping[LEGACY_UNTIL])
        pipe.hget(self._key, EPOCH)
        epoch = text(pipe.execute()[-1])
        _log.warning(
            "Redis had no epoch: started one",
            extra={"epoch": epoch, "adopting_previous_release": bool(committed)},
        )
        return epoch

    # --- apply thread: after a batch is applied, before and after its commit --------------------
    def advance(self, last: dict[int, int]) -> None:
        """Record in Redis that the batch's partitions are applied up to `last` (before the commit)."""
        if last:
            mapping: dict[str | bytes, str | bytes] = {
                str(p): f"{self._topic_id}|{offset}" for p, offset in last.items()
            }
            self._client.hset(self._key, mapping=mapping)  # type: ignore[arg-type]  # Mapping is invariant

    def committed(self, last: dict[int, int]) -> None:
        for p, offset in last.items():
            part = self._parts.get(p)
            if part is not None:
                part.source = Source(self._topic, p, self._topic_id, offset)
                part.metadata = self.epoch

    def _describe_topic_id(self) -> str:
        futures = self._admin.describe_topics(TopicCollection([self._topic]), request_timeout=KAFKA_TIMEOUT_S)
        return str(futures[self._topic].result().topic_id)


def text(raw: bytes | str | None) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw
