"""Stand-ins for Kafka and Redis in pure-logic worker tests: a Message (common/kafka_types.py's
MessageLike), a Consumer, a transactional Producer and apply.lua's script object. Each records what
it was asked and can be told to fail, so a test asserts outcomes without a broker or a Redis."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from common.periods import Period, PeriodCache
from common.store.apply import ApplyReply, ApplyRequest, ApplyScript
from common.store.encoding import format_score
from worker.apply import Applier

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2
UPDATES_TOPIC = "updates"

Header = tuple[str, bytes]


# --- Kafka: messages ------------------------------------------------------------------------------


class MessageStub:
    """What confluent_kafka.Message answers; `timestamp` is (type, ms): (1, ms) CreateTime,
    (0, -1) not available."""

    __slots__ = ("_error", "_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        value: bytes | None,
        *,
        offset: int = 0,
        partition: int = 0,
        topic: str = UPDATES_TOPIC,
        key: bytes | None = None,
        timestamp: tuple[int, int] = (TIMESTAMP_NOT_AVAILABLE, -1),
        error: KafkaError | None = None,
        headers: list[Header] | None = None,
    ) -> None:
        self._value = value
        self._offset = offset
        self._partition = partition
        self._topic = topic
        self._key = key
        self._timestamp = timestamp
        self._error = error
        self._headers = headers

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def error(self) -> KafkaError | None:
        return self._error

    def headers(self) -> list[Header] | None:
        return self._headers

    def __repr__(self) -> str:
        return f"MessageStub({self._topic}[{self._partition}]@{self._offset})"


# --- Kafka: the consumer --------------------------------------------------------------------------


class ConsumerStub:
    """Hands out scripted batches: poll() returns a batch's first message, consume() the rest of
    it. Once the batches run out, poll() calls `on_exhausted` (a test stops the loop there) and
    returns None. `on_poll(n)` runs at the start of the n-th poll (1-based)."""

    def __init__(
        self,
        batches: Iterable[Sequence[MessageStub]],
        *,
        on_exhausted: Callable[[], None] | None = None,
        on_poll: Callable[[int], None] | None = None,
    ) -> None:
        self._batches: deque[list[MessageStub]] = deque(list(b) for b in batches)
        self._rest: list[MessageStub] = []
        self._on_exhausted = on_exhausted
        self._on_poll = on_poll
        self.polls = 0
        self.seeks: list[tuple[str, int, int]] = []
        self.closed = False
        self.unsubscribed = False
        self.metadata = object()  # what consumer_group_metadata() returns

    def add(self, *batches: Sequence[MessageStub]) -> None:
        self._batches.extend(list(b) for b in batches)

    def poll(self, timeout: float | None = None) -> MessageStub | None:
        self.polls += 1
        if self._on_poll is not None:
            self._on_poll(self.polls)
        if not self._batches:
            if self._on_exhausted is not None:
                self._on_exhausted()
            return None
        batch = self._batches.popleft()
        if not batch:
            return None
        self._rest = batch[1:]
        return batch[0]

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[MessageStub]:
        taken, self._rest = self._rest[:num_messages], self._rest[num_messages:]
        if self._rest:
            self._batches.appendleft(self._rest)
            self._rest = []
        return taken

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append((partition.topic, partition.partition, partition.offset))

    def consumer_group_metadata(self) -> object:
        return self.metadata

    def unsubscribe(self) -> None:
        self.unsubscribed = True

    def close(self) -> None:
        self.closed = True

    def as_consumer(self) -> Consumer:
        return cast(Consumer, self)


# --- Kafka: the transactional producer ------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[Header]

    def header(self, name: str) -> bytes | None:
        found = [v for k, v in self.headers if k == name]
        assert len(found) <= 1, f"header {name} appears {len(found)} times"
        return found[0] if found else None


def kafka_exception(
    code: int, *, retriable: bool = False, txn_requires_abort: bool = False, fatal: bool = False
) -> KafkaException:
    """What librdkafka raises: a KafkaException carrying a KafkaError."""
    error = KafkaError(code, None, fatal=fatal, retriable=retriable, txn_requires_abort=txn_requires_abort)
    return KafkaException(error)


_TXN_CALLS = (
    "init_transactions",
    "begin_transaction",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
)


class ProducerStub:
    """A transactional producer: records every call, keeps what a transaction produced and the
    offsets it sent apart until it commits (then they are `committed_*`; an abort drops them).
    `fail(method, *exceptions)` makes the next calls of `method` raise those, in order. As in
    librdkafka, after a fatal error every later transactional call raises it too (`sticky_fatal`)."""

    def __init__(self, *, sticky_fatal: bool = True) -> None:
        self.calls: list[str] = []
        self._failures: dict[str, deque[BaseException]] = {}
        self._sticky_fatal = sticky_fatal
        self._fatal: KafkaException | None = None
        self.in_transaction = False
        self._records: list[Record] = []
        self._offsets: list[tuple[str, int, int]] = []
        self.committed_records: list[Record] = []
        self.committed_offsets: list[tuple[str, int, int]] = []
        self.commits = 0
        self.aborts = 0
        self.group_metadata: list[object] = []

    def fail(self, method: str, *exceptions: BaseException) -> None:
        self._failures.setdefault(method, deque()).extend(exceptions)

    def count(self, method: str) -> int:
        return self.calls.count(method)

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        if self._fatal is not None and method in _TXN_CALLS:
            raise self._fatal
        pending = self._failures.get(method)
        if pending:
            exc = pending.popleft()
            if isinstance(exc, KafkaException) and exc.args[0].fatal() and self._sticky_fatal:
                self._fatal = exc
            raise exc

    def init_transactions(self, timeout: float | None = None) -> None:
        self._enter("init_transactions")

    def begin_transaction(self) -> None:
        self._enter("begin_transaction")
        assert not self.in_transaction, "begin_transaction with a transaction open"
        self.in_transaction = True

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[Header] | None = None,
        **kwargs: Any,
    ) -> None:
        self._enter("produce")
        assert self.in_transaction, "produce outside a transaction"
        self._records.append(Record(topic, value, key, list(headers or [])))

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], group_metadata: object, timeout: float | None = None
    ) -> None:
        self._enter("send_offsets_to_transaction")
        assert self.in_transaction, "send_offsets_to_transaction outside a transaction"
        self.group_metadata.append(group_metadata)
        self._offsets += [(tp.topic, tp.partition, tp.offset) for tp in offsets]

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._enter("commit_transaction")
        assert self.in_transaction, "commit_transaction outside a transaction"
        self.committed_records += self._records
        self.committed_offsets += self._offsets
        self._records, self._offsets = [], []
        self.in_transaction = False
        self.commits += 1

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._enter("abort_transaction")
        self._records, self._offsets = [], []
        self.in_transaction = False
        self.aborts += 1

    def poll(self, timeout: float | None = None) -> int:
        self.calls.append("poll")
        return 0

    def flush(self, timeout: float | None = None) -> int:
        self.calls.append("flush")
        return 0

    def as_producer(self) -> Producer:
        return cast(Producer, self)


class SinkStub:
    """A dead-letter sink (worker/dlq.py's Sink) that keeps what it was given. Records whose value
    is longer than `refuse_above` are refused the way librdkafka refuses them (MSG_SIZE_TOO_LARGE)."""

    def __init__(self, refuse_above: int | None = None) -> None:
        self.records: list[Record] = []
        self.refused = 0
        self._refuse_above = refuse_above

    def produce(self, topic: str, **kwargs: Any) -> None:
        value: bytes | None = kwargs.get("value")
        if self._refuse_above is not None and len(value or b"") > self._refuse_above:
            self.refused += 1
            raise kafka_exception(KafkaError.MSG_SIZE_TOO_LARGE)
        self.records.append(Record(topic, value, kwargs.get("key"), list(kwargs.get("headers") or [])))

    def flush(self, timeout: float) -> None:
        """Nothing buffered."""


# --- Redis: apply.lua ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SentEvent:
    """One event as apply.lua receives it (from the typed request)."""

    id: str
    op: str
    member: str
    score: str
    ts: int
    meta: str
    instances: tuple[str, ...]  # the chunk's instances whose bit is set in the event's mask


@dataclass(frozen=True)
class SentCall:
    board: str
    instances: tuple[str, ...]  # in slot order
    expires: tuple[int, ...]
    want_state: bool
    events: tuple[SentEvent, ...]

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]


def decode_call(req: ApplyRequest) -> SentCall:
    """What one typed apply.lua request carries, checked for consistency."""
    board = req.keys.board
    instances = tuple(inst.name for inst in req.instances)
    assert len(req.ids) == len(req.events)
    events: list[SentEvent] = []
    for event_id, ev in zip(req.ids, req.events, strict=True):
        assert ev.mask < 2 ** len(instances), "mask names an instance the call does not carry"
        events.append(
            SentEvent(
                id=event_id,
                op=ev.op,
                member=ev.member,
                score=format_score(ev.score),
                ts=ev.tie_ms,
                meta=ev.meta,
                # a control op (erase, reset) counts in every instance of its call (mask 0)
                instances=instances
                if ev.op in ("erase", "reset")
                else tuple(name for i, name in enumerate(instances) if ev.mask >> i & 1),
            )
        )
    return SentCall(
        board, instances, tuple(inst.expire_at_ms for inst in req.instances), req.want_state, tuple(events)
    )


Failer = Callable[[SentCall], Exception | None]


def fail_member(member: str, error: Exception) -> Failer:
    """Every call that carries an event of `member` fails as a whole (apply.lua writes nothing)."""

    def failer(call: SentCall) -> Exception | None:
        return error if any(e.member == member for e in call.events) else None

    return failer


@dataclass
class ScriptStub:
    """apply.lua's LuaScript: `run_many` records each round trip, and answers each call like
    apply.lua (per event: status, seq, and for hot boards the state per instance and the meta),
    from a small model of the boards: an applied event bumps the board's seq, a repeated id is a
    duplicate. A call `failer` names fails whole and changes nothing.

    `raise_next`: exceptions raised by the next round trips themselves (a lost connection).
    `block`: run_many waits for this event first (a Redis that does not answer), then raises
    `after_block` if set."""

    failer: Failer | None = None
    raise_next: list[BaseException] = field(default_factory=list)
    block: threading.Event | None = None
    after_block: BaseException | None = None
    round_trips: list[list[SentCall]] = field(default_factory=list)
    applied: list[tuple[str, str]] = field(default_factory=list)  # (board, event id), in order
    entered: threading.Event = field(default_factory=threading.Event)
    _seq: dict[str, int] = field(default_factory=dict)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _scores: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def run_many(self, client: Any, calls: Sequence[ApplyRequest]) -> list[ApplyReply | Exception]:
        self.entered.set()
        if self.block is not None:
            self.block.wait()
            if self.after_block is not None:
                raise self.after_block
        sent = [decode_call(c) for c in calls]
        self.round_trips.append(sent)
        if self.raise_next:
            raise self.raise_next.pop(0)
        results: list[ApplyReply | Exception] = []
        for req, call in zip(calls, sent, strict=True):
            error = self.failer(call) if self.failer is not None else None
            results.append(error if error is not None else ApplyScript.decode(req, self._apply(call)))
        return results

    @property
    def calls(self) -> list[SentCall]:
        return [c for trip in self.round_trips for c in trip]

    def applied_ids(self, board: str) -> list[str]:
        return [i for b, i in self.applied if b == board]

    def _apply(self, call: SentCall) -> list[Any]:
        reply: list[Any] = []
        for event in call.events:
            failed_as = None
            if (call.board, event.id) in self._seen:
                status = 0
            elif event.op == "closed":  # apply.lua: refused after the id window, nothing written
                status, failed_as = 4, "board_closed"
            else:
                status = 1
                self._seen.add((call.board, event.id))
                self._seq[call.board] = self._seq.get(call.board, 0) + 1
                self.applied.append((call.board, event.id))
                for name in event.instances:
                    key = (call.board, name, event.member)
                    score = float(event.score)
                    if event.op == "reset":
                        for gone in [k for k in self._scores if k[:2] == (call.board, name)]:
                            del self._scores[gone]
                    elif event.op in ("delete", "erase"):
                        self._scores.pop(key, None)
                    elif event.op == "incr":
                        self._scores[key] = self._scores.get(key, 0.0) + score
                    elif event.op == "best":
                        self._scores[key] = max(self._scores.get(key, score), score)
                    else:
                        self._scores[key] = score
            reply += [status, self._seq.get(call.board, 0)]
            if failed_as is not None:
                reply.append(failed_as.encode())
            if call.want_state:
                for name in event.instances:
                    if event.op == "reset":  # per instance the seq of its latest reset
                        reply.append(str(self._seq.get(call.board, 0)).encode())
                        continue
                    current = self._scores.get((call.board, name, event.member))
                    reply.append("" if current is None else f"{current:g}|{event.ts}".encode())
                reply.append(event.meta.encode())
        return reply


def install_script(applier: Applier, script: ScriptStub) -> None:
    """The applier calls `self._script.run_many(self._client, requests)`; it keeps no board state
    (with it, chunks it decides itself would go to Redis instead of the stub)."""
    object.__setattr__(applier, "_script", script)
    applier.states = None


class ExplodingPeriods(PeriodCache):
    """The applier's period lookup, raising for the chosen event times (a calendar-math bug)."""

    def __init__(self, cache: PeriodCache, bad_ts: set[int], error: Exception) -> None:
        self._inner = cache
        self._bad = bad_ts
        self._error = error

    def at(self, kind: Any, ts_ms: int) -> Period | None:
        if ts_ms in self._bad:
            raise self._error
        return self._inner.at(kind, ts_ms)


def explode_periods(applier: Applier, bad_ts: set[int], error: Exception) -> None:
    inner: PeriodCache = object.__getattribute__(applier, "_periods")
    object.__setattr__(applier, "_periods", ExplodingPeriods(inner, bad_ts, error))


def unused_redis() -> redis.Redis:
    """The client the applier hands to its script; the stub script never uses it."""
    return cast(redis.Redis, object())
