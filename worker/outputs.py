"""The worker's Kafka outputs, exactly once: the dead letters and update_cache records of a batch
are produced in one Kafka transaction together with the batch's consumer offsets
(`send_offsets_to_transaction`). A worker that dies mid-batch leaves an open transaction that
is aborted (by its successor's `init_transactions`, or by the broker after
`transaction.timeout.ms`); the batch is redelivered, fenced in Redis, and produced once more.
read_committed readers (API nodes, DLQ consumers) therefore see each record once.

Every blocking call runs under a watchdog bounded by its timeout and the shutdown deadline:
librdkafka's `send_offsets_to_transaction` can block past its own timeout when the group
coordinator goes away (confluentinc/librdkafka#5456, #5511: seen here when the broker
restarts). A call that overstays is abandoned with its producer, and a new producer with the
same transactional.id takes over: its `init_transactions` fences the stuck one and aborts its
transaction, and the batch is rewound."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from common.deadline import Deadline
from common.errors import InfrastructureError, RankstreamError
from worker.threads import DaemonThread

_log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0
INIT_TIMEOUT_S = 30.0
RETRY_BUDGET_S = 30.0
WATCHDOG_GRACE_S = 5.0  # beyond its own timeout, before a call is taken for stuck


class ProducerFenced(RankstreamError):
    """The transactional producer can't go on (fenced by a newer instance with the same
    transactional.id, or a fatal error): the process exits and is restarted."""


class TransactionalOutputs:
    def __init__(self, make_producer: Callable[[], Producer], deadline: Deadline) -> None:
        self._make_producer = make_producer
        self._deadline = deadline
        self.producer = make_producer()
        self._calls = DaemonThread("kafka-txn")
        self._ready = False  # init_transactions done for the current producer
        self._open = False
        self._stuck: list[Producer] = []  # abandoned producers, kept from the garbage collector
        self.replaced = 0

    def init(self, timeout_s: float = INIT_TIMEOUT_S) -> None:
        """Register the transactional.id; aborts what a predecessor with the same id left open."""
        self._call("init_transactions", self._deadline.timeout(timeout_s))
        self._ready = True

    def produce(self, topic: str, **kwargs: Any) -> None:
        self._begin()
        while True:
            try:
                self.producer.produce(topic, **kwargs)
            except BufferError:
                # the local queue is full (a flood of bad events): let it drain
                if self._deadline.expired:
                    raise InfrastructureError("producer queue full at the shutdown deadline") from None
                self.producer.poll(0.1)
            else:
                return

    def flush(self, timeout: float) -> None:
        """Nothing to do: the transaction's commit waits for every record."""

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Commit this batch's records and offsets as one; on failure abort and raise
        InfrastructureError (the caller rewinds: nothing of the batch became visible)."""
        self._begin()
        try:
            if offsets:
                self._retrying("send_offsets_to_transaction", offsets, group_metadata)
            self._retrying("commit_transaction")
        except KafkaException as exc:
            self.abort()
            raise InfrastructureError(f"transaction aborted: {exc.args[0].str()}") from None
        self._open = False

    def abort(self) -> None:
        """Abort the open transaction, if any. Left open if even that fails (broker away): the
        next batch retries the abort first, and the broker aborts it after its timeout anyway."""
        if not self._open:
            return
        try:
            self._retrying("abort_transaction")
            self._open = False
        except (KafkaException, InfrastructureError) as exc:
            _log.warning("abort failed", extra={"error": str(exc)})
        except ProducerFenced as exc:
            # nothing more to abort: the fencing broker has aborted it already
            self._open = False
            _log.warning("abort skipped: %s", exc)

    def _begin(self) -> None:
        if self._open:
            return
        if not self._ready:
            self.init()  # a replaced producer
        self.abort()
        if self._open:
            raise InfrastructureError("a previous transaction could not be aborted yet")
        self._call("begin_transaction")
        self._open = True

    def _retrying(self, name: str, *args: Any) -> None:
        """A call retried while librdkafka says it may be (a coordinator loading, a timeout),
        for at most RETRY_BUDGET_S and within the deadline; an abortable or fatal error, or a
        spent budget, is raised (the batch is aborted and rewound, with back-off)."""
        give_up = time.monotonic() + RETRY_BUDGET_S
        while True:
            try:
                self._call(name, *args, self._deadline.timeout(CALL_TIMEOUT_S))
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or self._deadline.expired or time.monotonic() >= give_up:
                    raise
                _log.warning("transaction call refused, retrying", extra={"call": name, "error": err.str()})
                self._deadline.started.wait(0.1)
            else:
                return

    def _call(self, name: str, *args: Any) -> None:
        """`producer.<name>(*args)` on the watchdog thread; the last arg, if any, is its timeout."""
        timeout = args[-1] if args and isinstance(args[-1], float) else 0.0
        future = self._calls.submit(functools.partial(getattr(self.producer, name), *args))
        try:
            future.result(timeout=self._deadline.timeout(timeout + WATCHDOG_GRACE_S))
        except FutureTimeout:
            if self._deadline.expired:  # the process is about to exit: nothing to replace
                raise InfrastructureError(f"{name} still running at the shutdown deadline") from None
            self._replace(name)
            raise InfrastructureError(
                f"{name} did not return within its timeout; producer replaced"
            ) from None
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise ProducerFenced(f"transactional producer: {exc.args[0].str()}") from None
            raise

    def _replace(self, stuck_call: str) -> None:
        """Abandon the producer whose call is stuck; the next batch initialises a new one."""
        _log.warning("transactional producer stuck, replacing it", extra={"call": stuck_call})
        self._stuck.append(self.producer)
        self._calls = DaemonThread("kafka-txn")
        self.producer = self._make_producer()
        self._ready = self._open = False
        self.replaced += 1
