"""The worker loop: consume a batch, validate, apply in Redis, then in one Kafka transaction
dead-letter the bad, publish hot boards and commit the batch's offsets. A Redis or Kafka fault
rewinds the batch (seek back) and backs off: nothing is committed that was not applied, and
re-applying is a no-op (dedupe records); an aborted transaction leaves nothing visible.

No message can stop a partition: whatever raises while one message is parsed or applied
dead-letters that message (`internal_error`) and the batch goes on. Only infrastructure faults
(worker/faults.py) pause.

Two stages overlap: while the apply thread handles batch N (Redis, then the transaction), the
loop consumes and parses batch N+1; N+1 is handed over once N is settled. A failed N rewinds N
and N+1 alike, and a revoke waits for N (whose transaction commits its offsets).

Every wait is bounded by the shutdown deadline (common/deadline.py): after SIGTERM the loop
finishes what it can within it and abandons the rest uncommitted (redelivered, fenced)."""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from common.boards import BoardsConfig
from common.clock import Clock, system_ms
from common.control import control_kind, parse_control
from common.deadline import Deadline
from common.errors import BadEvent
from common.events import (
    CONTROL_OPS,
    MIN_TS_MS,
    Reason,
    UpdateEvent,
    parse_message,
    ts_ceiling,
    ts_out_of_range,
)
from common.kafka_types import MessageLike, consume_available
from common.store.apply import BOARD_CLOSED_MARK
from common.store.encoding import Status
from common.store.replicas import ReplicaWait
from worker.apply import Applier, EarlierFailure, EpochMismatch, Outcome, Position
from worker.dlq import DeadLetters
from worker.faults import is_infrastructure
from worker.fencing import PredecessorFence
from worker.metrics import WorkerMetrics
from worker.outputs import ProducerFenced, TransactionalOutputs
from worker.publisher import CachePublisher
from worker.results import ResultsThread
from worker.rolling import PreparerThread
from worker.sources import Blocked, PartitionsBlocked, SourceGuard
from worker.threads import DaemonThread

_log = logging.getLogger(__name__)
MAX_BACKOFF_S = 5.0
PASS_STOP_S = 10.0  # what close() waits for the rolling preparer's and the emitter's pass under way
EXIT_RESERVE_S = 0.5  # of the shutdown deadline, for what follows the loop (logs, interpreter exit)
SETTLE_SLICE_S = 0.1  # how often a wait for the batch in flight looks for a SIGTERM
LEAVE_S = 2.0  # what close() polls for the group's revoke after unsubscribing, at most
LEAVE_POLL_S = 0.05
BATCH_DROPPED = 500  # messages a poll after unsubscribing may fetch: dropped (the next owner reads them)
RECHECK_S = 5.0  # how often every partition held is checked against Redis (blocked or idle ones too)

# (message, why, what raised for internal_error)
Rejection = tuple[MessageLike, BadEvent, BaseException | None]
_Valid = tuple[UpdateEvent, int, int | None]  # a valid event, its effective ts, its array index


@dataclass(frozen=True, slots=True)
class _Origin:
    msg: MessageLike
    index: int | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed batch, ready to apply."""

    messages: Sequence[MessageLike]
    pairs: list[tuple[UpdateEvent, int]]
    positions: list[Position | None]
    origins: dict[int, _Origin]
    rejections: list[Rejection]


@dataclass
class _Tally:
    applied: int = 0
    duplicate: int = 0
    redelivered: int = 0
    late: int = 0
    dead: dict[str, int] = field(default_factory=dict)


def internal_error(exc: BaseException, index: int | None) -> BadEvent:
    return BadEvent(Reason.INTERNAL_ERROR, f"processing raised {type(exc).__name__}: {exc}", index)


def kafka_ts(msg: MessageLike, now_ms: int) -> int:
    """The message timestamp that stands in for a missing `ts` (now when the message has none)."""
    ts_type, ts = msg.timestamp()
    return ts if ts_type != 0 else now_ms  # 0 = TIMESTAMP_NOT_AVAILABLE


class WorkerLoop:
    def __init__(
        self,
        *,
        consumer: Consumer,
        boards: BoardsConfig,
        applier: Applier,
        outputs: TransactionalOutputs,
        dead_letters: DeadLetters,
        metrics: WorkerMetrics,
        deadline: Deadline,
        publisher: CachePublisher | None = None,
        fence: PredecessorFence | None = None,
        guard: SourceGuard | None = None,
        preparer: PreparerThread | None = None,
        results: ResultsThread | None = None,
        replicas: ReplicaWait | None = None,
        batch_size: int,
        batch_timeout_s: float,
        max_future_skew_s: int,
        shutdown_deadline_s: float,
        clock: Clock = system_ms,
    ) -> None:
        self._clock = clock
        self._consumer = consumer
        self._boards = boards
        self._applier = applier
        self._outputs = outputs
        self._dlq = dead_letters
        self._publisher = publisher
        self._fence = fence
        self.guard = guard
        self.preparer = preparer  # rolling windows' next periods (worker/rolling.py), beside the loop
        self.results = results  # period results (worker/results.py), beside the loop
        self._replicas = replicas  # WAIT before each commit (RANKSTREAM_REDIS_WAIT_REPLICAS)
        self._checked = 0.0  # when every partition held was last checked against Redis
        self._paused: set[int] = set()  # partitions paused because they are blocked
        self._told: set[int] = set()  # blocked partitions whose ERROR line named a board
        self._told_idle: set[int] = set()  # blocked partitions said while idle (no board yet)
        self.metrics = metrics
        self.deadline = deadline
        self._batch_size = batch_size
        self._batch_timeout_s = batch_timeout_s
        self._skew_s = max_future_skew_s
        self._shutdown_s = shutdown_deadline_s
        self._inflight: tuple[Prepared, Future[None]] | None = None
        self._apply_thread = DaemonThread("apply")
        # a failed batch, and everything fetched after it, rewound together: one seek per
        # partition to the *earliest* offset, so a later batch can't move the position past it
        self._to_rewind: list[MessageLike] = []
        # a call still blocked when close() returns (a batch in flight at the deadline, a pass, the
        # consumer's close): the process exits without waiting for it (os._exit), nor for librdkafka's
        # destructors, which could block its exit past the deadline
        self.abandoned = False
        self.last_loop = time.monotonic()  # liveness: the loop is turning
        self.assigned = 0

    def request_stop(self, deadline_s: float | None = None) -> None:
        """SIGTERM: finish, commit and close within the deadline (default the configured one),
        keeping a reserve for the process' own exit so it is gone by the configured deadline."""
        budget = self._shutdown_s if deadline_s is None else deadline_s
        self.deadline.start(budget - exit_reserve(budget))

    # --- rebalance callbacks (run inside consume()) -------------------------------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned += len(partitions)
        if self._fence is not None:  # first: reading the commits waits on a dead owner's transaction
            self._fence.on_assign(partitions)
        if self.guard is not None:
            self.guard.on_assign(partitions)
        _log.info("partitions assigned", extra={"partitions": [p.partition for p in partitions]})

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned -= len(partitions)
        self._settle()  # its transaction commits its offsets; a failure is left for the loop
        self._forget(partitions)
        if self._fence is not None:
            self._fence.on_revoke(partitions)
        _log.info("partitions revoked", extra={"partitions": [p.partition for p in partitions]})

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Taken away without a revoke (we missed the session timeout): our transaction can't
        commit them any more, and the next owner must fence us, so nothing is given back."""
        self.assigned -= len(partitions)
        self._settle()
        self._forget(partitions)
        _log.warning("partitions lost", extra={"partitions": [p.partition for p in partitions]})

    def _forget(self, partitions: list[TopicPartition]) -> None:
        if self.guard is not None:
            self.guard.on_revoke(partitions)
            gone = {tp.partition for tp in partitions}
            self._paused -= gone
            self._told -= gone
            self._told_idle -= gone

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        if self.preparer is not None:
            self.preparer.start()
        if self.results is not None:
            self.results.start()
        backoff = 0.1
        while not self.deadline.started.is_set():
            self.last_loop = time.monotonic()
            batch = consume_available(self._consumer, self._batch_size, self._batch_timeout_s)
            messages = [m for m in batch if not self._is_error(m)]
            prepared = self.prepare(messages) if messages else None  # overlaps the apply in flight
            self._settle()
            self._reconcile()
            if not self._to_rewind:
                full_check = self.guard is not None and time.monotonic() - self._checked >= RECHECK_S
                if prepared is None and full_check:
                    prepared = Prepared([], [], [], {}, [])  # while idle: only the check
                if prepared is not None:
                    if full_check:
                        self._checked = time.monotonic()
                    self._inflight = (
                        prepared,
                        self._apply_thread.submit(
                            # taken here: on the apply thread it would deadlock against a rebalance
                            # callback waiting on this very batch (librdkafka's consumer lock)
                            functools.partial(
                                self.execute, prepared, self._consumer.consumer_group_metadata(), full_check
                            )
                        ),
                    )
                    backoff = 0.1
                continue
            # the batch in flight failed: it and everything fetched after it go back together
            self._rewind([*self._to_rewind, *messages])
            self._to_rewind = []
            self.deadline.started.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        self._settle()

    def _reconcile(self) -> None:
        """On the consumer's thread, with nothing in flight: say what the checks blocked
        (worker/sources.py), pause what a batch met (so the line names its board), resume what
        they freed."""
        guard = self.guard
        if guard is None:
            return
        blocked = dict(guard.blocked)
        unseen = [blocked[p] for p in sorted(set(blocked) - self._told - self._told_idle)]
        self._told_idle |= {b.partition for b in unseen}
        self._tell(unseen, {}, met=False)  # no message of it in hand: no board to name yet
        to_pause = (set(blocked) & self._told) - self._paused
        if to_pause:
            self._consumer.pause([TopicPartition(guard.topic, p) for p in sorted(to_pause)])
        freed = self._paused - set(blocked)
        if freed:
            self._consumer.resume([TopicPartition(guard.topic, p) for p in sorted(freed)])
            _log.warning("partitions unblocked: Redis agrees", extra={"partitions": sorted(freed)})
        self._paused = (self._paused | to_pause) - freed
        self._told &= set(blocked)
        self._told_idle &= set(blocked)

    def _tell(self, blocked: Sequence[Blocked], boards: dict[int, str], met: bool) -> None:
        """One ERROR line per blocked partition: which, why, the board it was met on, the fix.
        `met`: a batch of it was in hand (it is paused next, and not told again)."""
        for b in blocked:
            if met:
                self._told.add(b.partition)
            _log.error(
                "partition blocked: Redis does not hold what Kafka's commits say was applied",
                extra={"partition": b.partition, "board": boards.get(b.partition, ""), "reason": b.reason,
                       "detail": b.detail, "fix": "rankstream recover | rankstream accept-redis"},
            )  # fmt: skip
        self.metrics.name_boards(boards)

    def _blocked_batch(
        self, prepared: Prepared, blocked: Sequence[Blocked], board: str | None = None
    ) -> None:
        """The batch goes back; its blocked partitions are named with the first board met on
        each (`board` when the script named it); _reconcile pauses them."""
        self._to_rewind.extend(prepared.messages)
        boards: dict[int, str] = {}
        for event, _ in prepared.pairs:
            boards.setdefault(prepared.origins[id(event)].msg.partition() or 0, board or event.board)
        self._tell([b for b in blocked if b.partition not in self._told], boards, met=True)

    def _settle(self) -> None:
        """Wait (within the deadline) for the batch in flight; on failure queue it for rewinding."""
        if self._inflight is None:
            return
        prepared, future = self._inflight
        try:
            self._wait(future)
        except FutureTimeout:
            # SIGTERM and the deadline passed: leave it uncommitted; it is redelivered and fenced
            self.abandoned = True
            _log.warning("deadline passed with a batch in flight: left uncommitted")
            return
        except ProducerFenced:
            raise
        except PartitionsBlocked as exc:
            self._blocked_batch(prepared, exc.blocked)
            return
        except EpochMismatch as exc:  # a board from another data set: its partitions stop
            assert self.guard is not None
            origins = [prepared.origins[id(e)] for e, _ in prepared.pairs if e.board == exc.board]
            partitions = {o.msg.partition() or 0 for o in origins}
            self._blocked_batch(prepared, self.guard.block_board(partitions, str(exc)), exc.board)
            return
        except Exception as exc:  # noqa: BLE001 - every other failure rewinds and backs off
            self.metrics.retries.inc()
            level = logging.WARNING if is_infrastructure(exc) else logging.ERROR
            _log.log(level, "batch failed, rewinding", extra={"error": f"{type(exc).__name__}: {exc}"})
            self._to_rewind.extend(prepared.messages)
            return
        finally:
            if future.done():  # settled either way: a revoke (or close) must not wait for it again
                self._inflight = None

    def _wait(self, future: Future[None]) -> None:
        """future.result(), in slices: a SIGTERM that arrives while we wait bounds the rest of it."""
        while True:
            started = self.deadline.started.is_set()
            try:
                future.result(timeout=self.deadline.remaining() if started else SETTLE_SLICE_S)
            except FutureTimeout:
                if started:
                    raise
            else:
                return

    def _is_error(self, msg: MessageLike) -> bool:
        err = msg.error()
        if err is None:
            return False
        if err.code() == KafkaError._PARTITION_EOF:
            return True
        if err.fatal():
            raise KafkaException(err)
        _log.warning("consumer error", extra={"error": err.str()})
        return True

    def process(self, messages: Sequence[MessageLike]) -> None:
        """Apply one batch at once (no overlap); raises on infrastructure failure."""
        self.execute(self.prepare(messages))

    def prepare(self, messages: Sequence[MessageLike]) -> Prepared:
        """Parse and validate (the loop's thread, overlapping the previous batch's apply)."""
        self.metrics.consumed.inc(len(messages))
        self.metrics.batch_size.observe(len(messages))
        now = self._clock()
        pairs: list[tuple[UpdateEvent, int]] = []
        positions: list[Position | None] = []
        origins: dict[int, _Origin] = {}
        rejections: list[Rejection] = []
        for msg in messages:
            try:
                stamp = kafka_ts(msg, now)
                kind = control_kind(msg.headers())
                if kind is None:
                    mine, valid = self._events(msg, stamp, now)
                else:
                    mine, valid = self._control(msg, kind, stamp)
            except Exception as exc:  # noqa: BLE001 - a parser bug must not stop the partition
                rejections.append((msg, internal_error(exc, None), exc))
                continue
            rejections += mine
            source = (
                None if self.guard is None else self.guard.source(msg.topic() or "", msg.partition() or 0)
            )
            for event, ts, index in valid:
                pairs.append((event, ts))
                positions.append(None if source is None else Position(source, msg.offset() or 0, index))
                origins[id(event)] = _Origin(msg, index)
        return Prepared(messages, pairs, positions, origins, rejections)

    def _events(self, msg: MessageLike, stamp: int, now: int) -> tuple[list[Rejection], list[_Valid]]:
        """An ordinary message's rejections and valid events."""
        # the latest accepted ts: the message's own (plausible) time plus the skew, so a
        # redelivery is judged as its first delivery was (the fence would otherwise skip an
        # event refused then and valid now); now for a message without a sane one
        max_ts = ts_ceiling(self._skew_s, stamp if MIN_TS_MS <= stamp <= now else now)
        result = parse_message(msg.value(), self._boards, max_ts)
        mine: list[Rejection] = [(msg, bad, None) for bad in result.rejections]
        valid: list[_Valid] = []
        for event, index in zip(result.events, result.indexes, strict=True):
            ts = event.ts
            if ts is None:
                ts = stamp
                bad = ts_out_of_range(ts, max_ts, index, "the Kafka message timestamp (no ts)")
                if bad is not None:
                    mine.append((msg, bad, None))
                    continue
            valid.append((event, ts, index))
        return mine, valid

    def _control(self, msg: MessageLike, kind: bytes, stamp: int) -> tuple[list[Rejection], list[_Valid]]:
        """An erase or reset (common/control.py): its time is the message's, unbounded (it picks
        no period), and no activity end stops it."""
        try:
            return [], [(parse_control(kind, msg.value(), self._boards), stamp, None)]
        except BadEvent as bad:
            return [(msg, bad, None)], []

    def execute(
        self, prepared: Prepared, group_metadata: object | None = None, full_check: bool = False
    ) -> None:
        """Check Redis against the commits, apply, then in one transaction dead-letter, publish
        and commit the offsets (the apply thread: every Redis and producer call happens here, so
        the shutdown deadline can abandon any of them)."""
        guard = self.guard
        if guard is not None:
            wanted = {m.partition() or 0 for m in prepared.messages}
            verdicts = guard.check(guard.held() if full_check else wanted)
            blocked = [v for v in verdicts if v.partition in wanted]
            if blocked:
                raise PartitionsBlocked(blocked)
        if not prepared.messages:
            return
        tally = _Tally()
        outcomes, rejections = self._apply(prepared, tally)
        offsets = _next_offsets(prepared.messages, None if guard is None else guard.epoch)
        last = {tp.partition: tp.offset - 1 for tp in offsets}
        if guard is not None:
            guard.advance(last)  # Redis holds these now (the last Redis write: Kafka's turn next)
        if self._replicas is not None:
            self._replicas.wait()  # and so do the replicas
        if group_metadata is None:  # process(): called on the consumer's own thread
            group_metadata = self._consumer.consumer_group_metadata()
        try:
            for msg, bad, error in rejections:
                if guard is not None and guard.replayed(msg.partition() or 0, msg.offset() or 0):
                    continue  # dead-lettered before `rankstream recover` rewound it
                self._dlq.send(msg, bad, error)
                tally.dead[bad.reason] = tally.dead.get(bad.reason, 0) + 1
            if self._publisher is not None and outcomes:
                self._publisher.publish(outcomes)
            self._outputs.commit(offsets, group_metadata)
        except BaseException:
            self._outputs.abort()  # what the failed batch produced must not ride along with its retry
            raise
        if guard is not None:
            guard.committed(last)
        self._count(tally)

    def _apply(self, prepared: Prepared, tally: _Tally) -> tuple[list[Outcome], list[Rejection]]:
        """Apply the batch's events in Redis; what to dead-letter: the parser's rejections, the
        events whose processing raised, and what the script rejected."""
        rejections = list(prepared.rejections)
        if not prepared.pairs:
            return [], rejections
        started = time.perf_counter()
        outcomes, failures = self._applier.apply_isolated(prepared.pairs, prepared.positions)
        self.metrics.apply_seconds.observe(time.perf_counter() - started)
        for failure in failures:
            origin = prepared.origins[id(failure.event)]
            _log.error("event failed, dead-lettering", extra={"error": repr(failure.error)})
            rejections.append((origin.msg, internal_error(failure.error, origin.index), failure.error))
        for outcome in outcomes:
            tally.late += outcome.late_windows
            rejection = _rejection(outcome, prepared.origins[id(outcome.event)])
            if rejection is not None:
                rejections.append(rejection)
            elif outcome.status is Status.APPLIED:
                if outcome.event.op in CONTROL_OPS:  # counted now: Redis changed, whatever follows
                    self.metrics.admin_ops.labels(outcome.event.op.value).inc()
                else:
                    tally.applied += 1
            elif outcome.status is Status.REDELIVERED:
                tally.redelivered += 1
            else:
                tally.duplicate += 1
        return outcomes, rejections

    def _count(self, tally: _Tally) -> None:
        """Counted per committed batch: a labelled inc() per event costs ~10% of the worker's CPU."""
        self.metrics.events.labels("applied").inc(tally.applied)
        self.metrics.events.labels("duplicate").inc(tally.duplicate)
        self.metrics.events.labels("redelivered").inc(tally.redelivered)
        self.metrics.late_windows.inc(tally.late)
        for reason, count in tally.dead.items():
            self.metrics.dead_lettered.labels(reason).inc(count)

    def _rewind(self, messages: Sequence[MessageLike]) -> None:
        first: dict[tuple[str, int], int] = {}
        for msg in messages:
            key = (msg.topic() or "", msg.partition() or 0)
            first[key] = min(first.get(key, msg.offset() or 0), msg.offset() or 0)
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # revoked meanwhile: its new owner starts from the commit
                _log.info("rewind skipped", extra={"partition": partition, "error": str(exc)})

    def close(self) -> None:
        """Settle the batch in flight, abort what is left open, leave the group: each step only
        within what is left of the deadline (the process exits at it regardless)."""
        passes = [t for t in (self.preparer, self.results) if t is not None]
        for thread in passes:
            thread.request_stop()
        stuck = [t.name for t in passes if not t.stop(self.deadline.timeout(PASS_STOP_S))]
        if stuck:  # its Kafka or Redis call is left to the process' exit, which does not wait for it
            self.abandoned = True
            _log.warning(
                "a pass still under way when close() stopped waiting: abandoned", extra={"threads": stuck}
            )
        self._apply_thread.shutdown()
        if self._inflight is not None:
            self._settle()
        if self.deadline.expired:  # the consumer is left open: its destructor would leave the group
            self.abandoned = True
            return
        self._leave_group()
        self._outputs.abort()
        if self.guard is not None:
            self.guard.close()  # the apply thread is idle (settled above): no check runs any more
        closer = threading.Thread(target=self._consumer.close, name="consumer-close", daemon=True)
        closer.start()
        closer.join(None if math.isinf(self.deadline.remaining()) else self.deadline.remaining())
        if closer.is_alive():
            self.abandoned = True
            _log.warning("deadline passed while leaving the consumer group")

    def _leave_group(self) -> None:
        """Unsubscribe, and serve what the group sends back (the revoke) in polls of our own
        before close(): a rebalance event that close() serves after its group has ended waits
        forever for an answer librdkafka no longer gives, with the GIL held (confluent-kafka
        asks the group for its rebalance protocol inside the callback), freezing every thread
        of the process, the deadline's too. Messages fetched meanwhile are not ours to apply."""
        try:
            self._consumer.unsubscribe()
        except KafkaException as exc:
            _log.info("unsubscribe failed; closing anyway", extra={"error": str(exc)})
            return
        until = time.monotonic() + self.deadline.timeout(LEAVE_S)
        while True:  # one poll at least: a rebalance event already queued is served here
            try:
                self._consumer.consume(BATCH_DROPPED, LEAVE_POLL_S)
            except KafkaException as exc:
                _log.info("poll after unsubscribing failed; closing", extra={"error": str(exc)})
                return
            if self.assigned <= 0 or time.monotonic() >= until:
                return


def exit_reserve(budget_s: float) -> float:
    """What a shutdown deadline of `budget_s` keeps for the process' own exit after the loop's."""
    return min(EXIT_RESERVE_S, budget_s / 4)


def _rejection(outcome: Outcome, origin: _Origin) -> Rejection | None:
    """What the script rejected (now, or on the event's first delivery) goes to the dead letters."""
    if outcome.status is Status.OUT_OF_RANGE:
        message = "the resulting score leaves the exact range ±(2^53-1)"
        return origin.msg, BadEvent(Reason.SCORE_OUT_OF_RANGE, message, origin.index), None
    if outcome.status is Status.FAILED and outcome.failed_as == BOARD_CLOSED_MARK:
        message = (
            "the board's activity has ended (ts at or after its end, or processed after it + late_grace)"
        )
        return origin.msg, BadEvent(Reason.BOARD_CLOSED, message, origin.index), None
    if outcome.status is Status.FAILED:  # redelivered; its processing raised on its first delivery
        error = EarlierFailure(outcome.failed_as or "")
        return origin.msg, internal_error(error, origin.index), error
    return None


def _next_offsets(messages: Sequence[MessageLike], epoch: str | None) -> list[TopicPartition]:
    """Per partition, the offset after the last message of the batch: what the transaction
    commits, with the epoch of the Redis data set it was applied into (worker/sources.py)."""
    last: dict[tuple[str, int], int] = {}
    for msg in messages:
        key = (msg.topic() or "", msg.partition() or 0)
        last[key] = max(last.get(key, -1), (msg.offset() or 0) + 1)
    if epoch is None:
        return [TopicPartition(t, p, o) for (t, p), o in last.items()]
    return [TopicPartition(t, p, o, metadata=epoch) for (t, p), o in last.items()]
