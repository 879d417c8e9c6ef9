"""Redis loss never goes unnoticed (docs/contract.md §4): what Redis holds is checked against what Kafka's
committed offsets say was applied, before every batch.

Redis keeps, per consumer group and topic, one hash (`common/store/keys.py` partition_sources): the
*epoch* of its data set (a random name given when a deployment starts on an empty Redis) and, per
partition, the topic id and the last offset whose batch was applied (raised after the batch's
scripts, before its offsets are committed, never lowered: common/store/advance.py). Every offset
commit carries the epoch as its Kafka metadata. So before a batch of partition P (committed
offset C, metadata M), on the apply thread (every call here may block; that thread is the one
the shutdown deadline may abandon):

  Redis has no epoch   M set on any partition: Redis lost its data (flush, failover to an empty
                       replica) -> P is blocked. No commits anywhere: a fresh deployment -> a new
                       epoch. Commits without metadata: the previous release's -> adopted (a new
                       epoch, and its per-event id records honoured for a while, see apply.lua).
  M is another epoch   Redis holds another data set than the group applied into -> blocked
                       (unless `rankstream accept-redis` accepted that epoch).
  P's last offset < C-1 (or no record while M says this epoch applied P): Redis is behind the
                       commits (restored from a backup, or writes lost) -> blocked.

A blocked partition is paused and re-checked every few seconds; `rankstream recover` (rewind the
group to what Redis holds) or `rankstream accept-redis` (start from what Redis holds) unblocks
it. The boards' own fences carry the epoch too, so a board left from another data set is caught
by apply.lua (worker/apply.py EpochMismatch).

The group's commits are read by a consumer of the group that never joins it (`commits_reader`),
not by the admin client: librdkafka's ListConsumerGroupOffsets dereferences the consumer-group
handle an admin client does not have when the coordinator answers NOT_COORDINATOR or
COORDINATOR_NOT_AVAILABLE (a broker that just started or restarted, or one too busy to answer
in time), and the whole process dies of SIGSEGV (confluentinc/librdkafka#5040); a consumer
re-queries its coordinator and retries."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from common.clients import kafka_consumer
from common.errors import InfrastructureError
from common.settings import Settings
from common.store.advance import raise_applied
from common.store.encoding import text
from common.store.keys import partition_sources
from common.store.slotmarks import write_marks
from common.store.topology import Store
from worker.apply import Applier, Source

_log = logging.getLogger(__name__)
KAFKA_TIMEOUT_S = 10.0
EPOCH = "epoch"
ACCEPTED = "accepted"  # epochs `rankstream accept-redis` accepted the group's commits from
LEGACY_UNTIL = "legacy_until"
MARKED = "slots"  # "1" once every slot of a cluster holds its mark (common/store/slotmarks.py)
MARKING = "0"  # MARKED while the marks of a data set just begun are being written
BOARD_EPOCH = "board_epoch_mismatch"


def replay_field(partition: int) -> str:
    """Where `rankstream recover` notes "<topic id>|<offset>": the partition's commit before the
    rewind (what lies below it was dead-lettered already)."""
    return f"{partition}!replay"


def new_epoch() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class Blocked:
    partition: int
    reason: str  # redis_lost | epoch_mismatch | redis_behind
    detail: str


class PartitionsBlocked(InfrastructureError):
    """The batch holds partitions Redis does not agree with: it goes back, they are paused."""

    def __init__(self, blocked: list[Blocked]) -> None:
        super().__init__("; ".join(f"partition {b.partition}: {b.reason}" for b in blocked))
        self.blocked = blocked


@dataclass(slots=True)
class _Partition:
    source: Source  # low_water = the last committed offset (-1: none)
    metadata: str | None  # the epoch the group's last commit carried (None: no commit, or a previous release)
    known: bool = True  # False: the commit is read before the partition's next batch
    replay_until: int = -1  # `rankstream recover` rewound it: offsets below were dead-lettered before


def stored_position(raw: bytes | str | None, topic_id: str) -> int | None:
    """The last applied offset of a partition's record, None if absent or of another topic id."""
    value = text(raw)
    if value is None:
        return None
    tid, _, offset = value.rpartition("|")
    return int(offset) if tid == topic_id else None


def judge(
    partition: int, part: _Partition, epoch: str, stored: int | None, accepted: frozenset[str] = frozenset()
) -> Blocked | None:
    """Whether partition `part` may be applied onto Redis' data set `epoch` holding `stored`."""
    committed = part.source.low_water
    if part.metadata is not None and part.metadata != epoch and part.metadata not in accepted:
        detail = f"the group committed into Redis epoch {part.metadata}, Redis holds epoch {epoch}"
        return Blocked(partition, "epoch_mismatch", detail)
    if committed < 0 or part.metadata is None:
        return None  # nothing committed yet, or the previous release's commit (rolling upgrade): adopted
    if stored is None or stored < committed:
        held = "nothing" if stored is None else f"offset {stored}"
        detail = f"Redis holds {held} of partition {partition}, the group committed up to offset {committed}"
        return Blocked(partition, "redis_behind", detail)
    return None


class SourceGuard:
    def __init__(
        self,
        client: Store,
        make_admin: Callable[[], AdminClient],
        applier: Applier,
        *,
        make_reader: Callable[[], Consumer],
        key_prefix: str,
        group: str,
        topic: str,
        legacy_ttl_ms: int,
        adopt_window_ms: int,
        slot_marks: bool = False,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._slot_marks = slot_marks  # a cluster: every slot marked (common/store/slotmarks.py)
        self._told_unmarked = False
        self._make_admin = make_admin
        self._admin = make_admin()  # the topic's id and partitions
        self._make_reader = make_reader
        self._reader = make_reader()  # the group's commits (group_commits)
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
        self._topic_id = self._describe_topic()[0]

    # --- consumer thread: rebalance callbacks (no blocking call: the commits are read later) -----
    def on_assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self._topic:
                self._parts[tp.partition] = _Partition(
                    Source(self._topic, tp.partition, self._topic_id, -1), None, known=False
                )

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.pop(tp.partition, None)
            self.blocked.pop(tp.partition, None)

    def held(self) -> list[int]:
        return sorted(self._parts)

    def source(self, topic: str, partition: int) -> Source:
        part = self._parts.get(partition)
        if part is None or topic != self._topic:
            return Source(topic, partition, self._topic_id, -1)
        return part.source

    # --- apply thread ---------------------------------------------------------------------------
    def replayed(self, partition: int, offset: int) -> bool:
        """Was this message's batch committed before `rankstream recover` rewound the group? Then
        its dead letters went out already and are not sent again."""
        part = self._parts.get(partition)
        return part is not None and offset < part.replay_until

    def check(self, partitions: Iterable[int]) -> list[Blocked]:
        """Before a batch: may these partitions be applied? Sets the applier's epoch and legacy
        mode; returns the partitions that may not (and remembers them as blocked)."""
        numbers = sorted(p for p in set(partitions) if p in self._parts)
        self._read_commits([p for p in numbers if not self._parts[p].known])
        fields = [EPOCH, LEGACY_UNTIL, ACCEPTED, MARKED, *(str(p) for p in numbers)]
        values = self._client.hmget(self._key, [*fields, *(replay_field(p) for p in numbers)])
        epoch, legacy_until, accepted, marked = (text(v) for v in values[:4])
        for p, raw in zip(numbers, values[len(fields) :], strict=True):
            self._parts[p].replay_until = self._replay_until(p, raw)
        if epoch is None:
            epoch = self._start_epoch()
            if epoch is None:
                lost = "Redis holds no rankstream data, the group's commits say it did"
                return self._remember(numbers, [Blocked(p, "redis_lost", lost) for p in numbers])
            legacy_until, marked = (text(v) for v in self._client.hmget(self._key, [LEGACY_UNTIL, MARKED]))
        self.epoch = epoch
        self._applier.epoch = epoch
        if self._slot_marks and not self._applier.slot_marks:
            # marked when the data set began (_start_epoch): "0" until every mark is written (a
            # worker that stopped half-way, or a second one starting at the same moment, finishes
            # it: nothing is applied meanwhile); an older data set unmarked is not checked (marking
            # it now could mark a slot that already lost its data as sound)
            if marked == MARKING:
                self._mark_slots()
                marked = "1"
            self._applier.slot_marks = marked is not None
            if marked is None and not self._told_unmarked:
                self._told_unmarked = True
                _log.warning(
                    "the Redis Cluster's slots are not marked: a shard losing its data goes unseen "
                    "until `rankstream accept-redis` marks them (README: Redis loss)"
                )
        adopting = legacy_until is not None and int(legacy_until) > time.time() * 1000
        self._applier.legacy_ttl_ms = self._legacy_ttl_ms if adopting else 0
        ok_epochs = frozenset((accepted or "").split(",")) - {""}
        verdicts = []
        for p, raw in zip(numbers, values[4 : len(fields)], strict=True):
            stored = stored_position(raw, self._topic_id)
            verdict = judge(p, self._parts[p], epoch, stored, ok_epochs)
            if verdict is not None:
                verdicts.append(verdict)
        return self._remember(numbers, verdicts)

    def _replay_until(self, partition: int, raw: bytes | str | None) -> int:
        """`rankstream recover`'s note, while the partition's commits are still below it."""
        until = stored_position(raw, self._topic_id)
        if until is None or until <= self._parts[partition].source.low_water + 1:
            if raw is not None:
                self._client.hdel(self._key, replay_field(partition))  # passed, or another topic's
            return -1
        return until

    def _read_commits(self, partitions: list[int]) -> None:
        """The group's committed offset and epoch of each partition (Kafka's stable commits: a
        dead owner's open transaction does not hold this up), and the topic id again (a
        recreated topic has a new one)."""
        if not partitions:
            return
        try:
            self._topic_id = self._describe_topic()[0]
        except KafkaException as exc:
            _log.warning("could not read the topic id, keeping the last one", extra={"error": str(exc)})
        commits = self._commits(partitions)
        for p in partitions:
            offset, metadata = commits.get(p, (-1, None))
            part = self._parts[p]
            part.source = Source(self._topic, p, self._topic_id, offset - 1 if offset >= 0 else -1)
            part.metadata, part.known = metadata, True

    def _commits(self, partitions: list[int]) -> dict[int, tuple[int, str | None]]:
        try:
            return group_commits(self._reader, self._topic, partitions)
        except KafkaException as exc:
            # a new client next time (one that lived through a broker restart kept timing out);
            # the old one is closed here, on the one thread that uses it, after its last call
            old, self._reader = self._reader, self._make_reader()
            with suppress(KafkaException, RuntimeError):
                old.close()
            raise InfrastructureError(f"the group's committed offsets can't be read: {exc}") from exc

    def _remember(self, numbers: list[int], verdicts: list[Blocked]) -> list[Blocked]:
        """The verdicts of this check replace the last ones, except a board's own epoch mismatch,
        which only a restart (or losing the partition) clears: the check can't see boards."""
        for p in numbers:
            if p in self.blocked and self.blocked[p].reason != BOARD_EPOCH:
                del self.blocked[p]
        for verdict in verdicts:
            self.blocked.setdefault(verdict.partition, verdict)
        return [self.blocked[p] for p in numbers if p in self.blocked]

    def block_board(self, partitions: Iterable[int], detail: str) -> list[Blocked]:
        """apply.lua found a board written in another epoch: its partitions stop for good."""
        verdicts = [Blocked(p, BOARD_EPOCH, detail) for p in sorted(partitions)]
        for verdict in verdicts:
            self.blocked[verdict.partition] = verdict
        return verdicts

    def _mark_slots(self) -> None:
        """A data set beginning on a cluster marks every slot (nothing can be lost yet), then
        says so; a second worker starting at the same moment marks nothing more (NX)."""
        written = write_marks(self._client, self._prefix)
        self._client.hset(self._key, MARKED, "1")
        _log.info("marked every Redis Cluster slot", extra={"written": written})

    def _start_epoch(self) -> str | None:
        """Redis has no epoch: start one (fresh deployment, or adopting the previous release's
        data), or None when the group's commits say Redis lost what it held."""
        _, partitions = self._describe_topic()
        committed = self._commits(partitions)
        # another worker may have started one meanwhile (and committed into it): take that
        started = text(self._client.hget(self._key, EPOCH))
        if started is not None:
            return started
        if any(metadata for _, metadata in committed.values()):
            return None
        mapping = {EPOCH: new_epoch()}
        if committed:  # commits without an epoch: the previous release's
            mapping[LEGACY_UNTIL] = str(int(time.time() * 1000) + self._adopt_window_ms)
        pipe = self._client.pipeline(transaction=True)
        pipe.hsetnx(self._key, EPOCH, mapping[EPOCH])
        if self._slot_marks and not committed:  # a data set beginning: marked before any apply
            pipe.hsetnx(self._key, MARKED, MARKING)
        if LEGACY_UNTIL in mapping:
            pipe.hsetnx(self._key, LEGACY_UNTIL, mapping[LEGACY_UNTIL])
        pipe.hget(self._key, EPOCH)
        stored: bytes | str | None = pipe.execute()[-1]
        epoch = text(stored)
        _log.warning(
            "Redis had no epoch: started one",
            extra={"epoch": epoch, "adopting_previous_release": bool(committed)},
        )
        return epoch

    def advance(self, last: dict[int, int]) -> None:
        """Record in Redis that the batch's partitions are applied up to `last` (before the commit)."""
        raise_applied(self._client, self._key, self._topic_id, last)

    def committed(self, last: dict[int, int]) -> None:
        for p, offset in last.items():
            part = self._parts.get(p)
            if part is not None:
                part.source = Source(self._topic, p, self._topic_id, offset)
                part.metadata = self.epoch

    def _describe_topic(self) -> tuple[str, list[int]]:
        return describe_topic(self._admin, self._topic)

    def close(self) -> None:
        """Close the commits' reader. Only once no check can run any more (the apply thread idle,
        worker/consumer.py close()): a call racing the close would use a destroyed client."""
        with suppress(KafkaException, RuntimeError):
            self._reader.close()


def describe_topic(admin: AdminClient, topic: str) -> tuple[str, list[int]]:
    """The topic's id and partition numbers (raises KafkaException)."""
    futures = admin.describe_topics(TopicCollection([topic]), request_timeout=KAFKA_TIMEOUT_S)
    description = futures[topic].result()
    return str(description.topic_id), [p.id for p in description.partitions]


def commits_reader(settings: Settings) -> Consumer:
    """What reads the worker group's commits (group_commits): a consumer of the group that never
    subscribes, so it never joins the group; read_uncommitted, so it asks for the commits Kafka
    has made stable without waiting on one still pending (a dead owner's open transaction does
    not hold the answer up), as the admin client's call did."""
    extra = {"group.id": settings.worker_group, "isolation.level": "read_uncommitted"}
    return kafka_consumer(settings, {**extra, "enable.auto.commit": False})


def group_commits(reader: Consumer, topic: str, partitions: list[int]) -> dict[int, tuple[int, str | None]]:
    """partition -> (committed offset, epoch metadata) of those of `partitions` of `topic` the
    group of `reader` (commits_reader) has committed (raises KafkaException; a partition the
    answer has no offset for, because of an error, raises too rather than pass for uncommitted)."""
    found = reader.committed([TopicPartition(topic, p) for p in partitions], timeout=KAFKA_TIMEOUT_S)
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return {tp.partition: (tp.offset, tp.metadata or None) for tp in found if tp.offset >= 0}
