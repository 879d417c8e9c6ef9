"""Acknowledged produce: what the dead-letter sender and the update_cache publisher share.

Counts what is in flight, collects failures from delivery reports, waits for room when the
local queue is full, and raises unless everything was acknowledged, so the worker never
commits past a record that is not safely stored."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from common.errors import InfrastructureError


class Deliveries:
    def __init__(self, producer: Producer, what: str) -> None:
        self.producer = producer
        self._what = what
        self._failed: list[str] = []
        self._pending = 0

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        self._pending -= 1
        if err is not None:
            self._failed.append(err.str())

    def produce(self, topic: str, **kwargs: Any) -> None:
        while True:
            try:
                self.producer.produce(topic, on_delivery=self._delivered, **kwargs)
                break
            except BufferError:
                # the local queue is full (a big backfill, a flood of bad events): let it drain
                self.producer.poll(0.1)
        self._pending += 1

    def flush(self, timeout: float) -> None:
        """Wait for every record; raise if one failed or is still unacknowledged. The caller
        rewinds and retries, so a record may reach the topic twice, never zero times."""
        if self._pending:
            self.producer.flush(timeout)
        failed, self._failed = self._failed, []
        if failed or self._pending:
            raise InfrastructureError(f"{self._what}: {len(failed)} failed, {self._pending} unacknowledged")
