"""The worker loop: consume a batch, validate, apply in Redis, dead-letter the bad, publish hot
boards, and only then commit. A Redis or Kafka failure rewinds the batch (seek back) and backs
off: nothing is committed that was not applied, and re-applying is a no-op (dedupe records).

Two stages overlap: while one thread applies batch N (Redis, then the producer's flushes), the
loop consumes and parses batch N+1; N is committed once it is fully done, before N+1 is handed
over. A failed N rewinds N and N+1 alike, and a revoke waits for N before it commits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from common.boards import BoardsConfig
from common.errors import BadEvent, InfrastructureError
from common.events import UpdateEvent, parse_message
from common.kafka_types import MessageLike, consume_available
from worker.apply import Applier, Status
from worker.dlq import DeadLetters
from worker.metrics import WorkerMetrics
from worker.publisher import CachePublisher

_log = logging.getLogger(__name__)
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True, slots=True)
class _Origin:
    msg: MessageLike
    index: int | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed batch, ready to apply."""

    messages: Sequence[MessageLike]
    pairs: list[tuple[UpdateEvent, int]]
    origins: dict[int, _Origin]
    rejections: list[tuple[MessageLike, BadEvent]]


def effective_ts(event: UpdateEvent, msg: MessageLike) -> int:
    """The event's own time, else the Kafka message timestamp, else now."""
    if event.ts is not None:
        return event.ts
    ts_type, ts = msg.timestamp()
    return ts if ts_type != 0 and ts >= 0 else int(time.time() * 1000)  # 0 = TIMESTAMP_NOT_AVAILABLE


class WorkerLoop:
    def __init__(
        self,
        *,
        consumer: Consumer,
        boards: BoardsConfig,
        applier: Applier,
        dead_letters: DeadLetters,
        metrics: WorkerMetrics,
        publisher: CachePublisher | None = None,
        batch_size: int,
        batch_timeout_s: float,
    ) -> None:
        self._consumer = consumer
        self._boards = boards
        self._applier = applier
        self._dlq = dead_letters
        self._publisher = publisher
        self.metrics = metrics
        self._batch_size = batch_size
        self._batch_timeout_s = batch_timeout_s
        self._stop = threading.Event()
        self._uncommitted: dict[tuple[str, int], int] = {}
        self._inflight: tuple[Prepared, Future[None]] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="apply")
        # a failed batch, and everything fetched after it, rewound together: one seek per
        # partition to the *earliest* offset, so a later batch can't move the position past it
        self._to_rewind: list[MessageLike] = []
        self.last_loop = time.monotonic()  # liveness: the loop is turning
        self.assigned = 0

    def request_stop(self) -> None:
        self._stop.set()

    # --- rebalance callbacks (run inside consume()) -------------------------------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned += len(partitions)
        _log.info("partitions assigned", extra={"partitions": [p.partition for p in partitions]})

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned -= len(partitions)
        self._settle()  # a failure is left in _to_rewind for the loop
        revoked = {(p.topic, p.partition) for p in partitions}
        self._commit(only=revoked)
        _log.info("partitions revoked", extra={"partitions": [p.partition for p in partitions]})

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        backoff = 0.1
        try:
            while not self._stop.is_set():
                self.last_loop = time.monotonic()
                batch = consume_available(self._consumer, self._batch_size, self._batch_timeout_s)
                messages = [m for m in batch if not self._is_error(m)]
                prepared = self.prepare(messages) if messages else None  # overlaps the apply in flight
                self._settle()
                self._commit()  # retries a commit that failed earlier (a broker coming back), even when idle
                if not self._to_rewind:
                    if prepared is not None:
                        self._inflight = (prepared, self._executor.submit(self.execute, prepared))
                        backoff = 0.1
                    continue
                # the batch in flight failed: it and everything fetched after it go back together
                self._rewind([*self._to_rewind, *messages])
                self._to_rewind = []
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            self._settle()
        finally:
            self._executor.shutdown(wait=True)

    def _settle(self) -> bool:
        """Wait for the batch in flight; commit it, or queue it for rewinding (False)."""
        if self._inflight is None:
            return True
        prepared, future = self._inflight
        self._inflight = None
        try:
            future.result()
        except (InfrastructureError, redis.RedisError, KafkaException) as exc:
            self.metrics.retries.inc()
            _log.warning("batch failed, rewinding", extra={"error": str(exc)})
            self._to_rewind.extend(prepared.messages)
            return False
        for msg in prepared.messages:
            key = (msg.topic() or "", msg.partition() or 0)
            self._uncommitted[key] = max(self._uncommitted.get(key, -1), (msg.offset() or 0) + 1)
        self._commit()
        return True

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
        pairs: list[tuple[UpdateEvent, int]] = []
        origins: dict[int, _Origin] = {}
        rejections: list[tuple[MessageLike, BadEvent]] = []
        for msg in messages:
            result = parse_message(msg.value(), self._boards)
            rejections += [(msg, bad) for bad in result.rejections]
            for event, index in zip(result.events, result.indexes, strict=True):
                pairs.append((event, effective_ts(event, msg)))
                origins[id(event)] = _Origin(msg, index)
        return Prepared(messages, pairs, origins, rejections)

    def execute(self, prepared: Prepared) -> None:
        """Apply, dead-letter, publish, and wait for every acknowledgement (the apply thread:
        all producer calls happen here, so delivery callbacks never race the loop)."""
        for msg, bad in prepared.rejections:
            self._dead_letter(msg, bad)
        if prepared.pairs:
            started = time.perf_counter()
            outcomes = self._applier.apply(prepared.pairs)
            self.metrics.apply_seconds.observe(time.perf_counter() - started)
            tally = {Status.APPLIED: 0, Status.DUPLICATE: 0}
            late = 0
            for outcome in outcomes:
                late += outcome.late_windows
                if outcome.status is Status.OUT_OF_RANGE:
                    origin = prepared.origins[id(outcome.event)]
                    bad = BadEvent(
                        "score_out_of_range", "the resulting score leaves the exact range ±(2^53-1)"
                    )
                    bad.index = origin.index
                    self._dead_letter(origin.msg, bad)
                else:
                    tally[outcome.status] += 1
            # counted per batch: a labelled inc() per event costs ~10% of the worker's CPU
            self.metrics.events.labels("applied").inc(tally[Status.APPLIED])
            self.metrics.events.labels("duplicate").inc(tally[Status.DUPLICATE])
            self.metrics.late_windows.inc(late)
            if self._publisher is not None:
                self._publisher.publish(outcomes)
        self._dlq.flush(timeout=10)
        if self._publisher is not None:
            self._publisher.flush(timeout=10)

    def _dead_letter(self, msg: MessageLike, bad: BadEvent) -> None:
        self._dlq.send(msg, bad)
        self.metrics.dead_lettered.labels(bad.reason).inc()

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

    def _commit(self, only: set[tuple[str, int]] | None = None) -> None:
        todo = {k: v for k, v in self._uncommitted.items() if only is None or k in only}
        if not todo:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in todo.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # kept for the next commit; a partition lost meanwhile is redone by its new owner
            _log.warning("commit failed", extra={"error": str(exc)})
            return
        for key in todo:
            self._uncommitted.pop(key, None)

    def close(self, attempts: int = 10) -> None:
        """Settle the batch in flight and commit, retrying briefly: a coordinator still loading
        (a broker just back) refuses commits for a moment, and a clean stop should leave none."""
        self._settle()
        for _ in range(attempts):
            self._commit()
            if not self._uncommitted:
                break
            time.sleep(0.5)
        self._consumer.close()
