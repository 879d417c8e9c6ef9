"""The worker's Kafka outputs, exactly once: the dead letters and update_cache records of a batch
are produced in one Kafka transaction together with the batch's consumer offsets
(`send_offsets_to_transaction`). A worker that dies mid-batch leaves an open transaction that
is aborted (by its successor's `init_transactions`, or by the broker after
`transaction.timeout.ms`); the batch is redelivered, fenced in Redis, and produced once more.
read_committed readers (API nodes, DLQ consumers) therefore see each record once.

Every blocking call is bounded by the shutdown deadline."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from common.deadline import Deadline
from common.errors import InfrastructureError, RankstreamError

_log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0


class ProducerFenced(RankstreamError):
    """The transactional producer can't go on (fenced by a newer instance with the same
    transactional.id, or a fatal error): the process exits and is restarted."""


class TransactionalOutputs:
    def __init__(self, producer: Producer, deadline: Deadline) -> None:
        self.producer = producer
        self._deadline = deadline
        self._open = False

    def init(self) -> None:
        """Register the transactional.id; aborts what a predecessor with the same id left open."""
        self._call(self.producer.init_transactions, self._deadline.timeout(30.0))

    def produce(self, topic: str, **kwargs: Any) -> None:
        if not self._open:
            self._abort_leftover()
            self._call(self.producer.begin_transaction)
            self._open = True
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
        if not self._open:
            self._abort_leftover()
            self._call(self.producer.begin_transaction)
            self._open = True
        try:
            if offsets:
                self._retrying(self.producer.send_offsets_to_transaction, offsets, group_metadata)
            self._retrying(self.producer.commit_transaction)
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
            self._retrying(self.producer.abort_transaction)
            self._open = False
        except KafkaException as exc:
            _log.warning("abort failed", extra={"error": exc.args[0].str()})
        except ProducerFenced as exc:
            # nothing more to abort: the fencing broker has aborted it already
            self._open = False
            _log.warning("abort skipped: %s", exc)

    def _abort_leftover(self) -> None:
        self.abort()
        if self._open:
            raise InfrastructureError("a previous transaction could not be aborted yet")

    def _retrying(self, call: Any, *args: Any) -> None:
        """A call retried while librdkafka says it may be (a coordinator loading, a timeout),
        within the deadline; an abortable or fatal error is raised at once."""
        while True:
            try:
                self._call(call, *args, self._deadline.timeout(CALL_TIMEOUT_S))
            except KafkaException as exc:
                if not exc.args[0].retriable() or self._deadline.expired:
                    raise
            else:
                return

    @staticmethod
    def _call(call: Any, *args: Any) -> None:
        try:
            call(*args)
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise ProducerFenced(f"transactional producer: {exc.args[0].str()}") from None
            raise
