"""One error tree. The class decides the policy: `retriable` errors pause and retry,
the others are bad input that is rejected (dead-lettered, 4xx, or a one-line exit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class RankstreamError(Exception):
    """Root of every error rankstream raises on purpose."""

    retriable: ClassVar[bool] = False


class ConfigError(RankstreamError):
    """Bad settings or board config: the process exits non-zero with this one line."""


class BadEvent(RankstreamError):
    """An update event that can never be applied. `reason` is a stable machine-readable code."""

    def __init__(self, reason: str, message: str, index: int | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.index = index


class InfrastructureError(RankstreamError):
    """Kafka or Redis is unavailable: pause, back off, retry; never dead-letter."""

    retriable: ClassVar[bool] = True


class StackError(RankstreamError):
    """The local development stack cannot start: says what is missing in one line."""


class TopicsDifferError(RankstreamError):
    """Existing Kafka topics differ from what `rankstream topics` would create them as: one line
    per difference (`topic update_rank: partitions 3, configured 6 (...)`); nothing was changed."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = tuple(lines)
