"""The part of confluent_kafka.Message rankstream uses, as a Protocol: pure logic takes this,
so it can be unit-tested with a stub; everything crossing Kafka is also tested for real."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class MessageLike(Protocol):
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> Any: ...
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...


def consume_available(consumer: Any, max_messages: int, timeout: float) -> list[Any]:
    """Up to `max_messages`: blocks at most `timeout` for the *first* one, then takes what is
    already fetched without waiting. `consume(n, timeout)` would wait the whole timeout unless n
    messages arrive, which at moderate rates adds the timeout to every event's latency."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)] if max_messages > 1 else [first]
