"""What a board window can answer, whether it lives in Redis or in memory (hot boards).

Positions are 0-based in the *view* order: the board's own order, or its exact reverse when
the caller asks for the other `order`. Rank rules on top of them live in common/ranking.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Entry:
    member: str
    score: float
    meta: bytes | None = None


@dataclass(frozen=True, slots=True)
class Page:
    total: int
    seq: int
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Located:
    entry: Entry
    position: int  # 0-based, in the view
    better: int  # members strictly better in the view


@dataclass(frozen=True, slots=True)
class Lookup:
    total: int
    seq: int
    found: list[Located | None]  # in the order asked; None: not on the board


@dataclass(frozen=True, slots=True)
class Counted:
    count: int
    seq: int


class BoardReader(Protocol):
    source: str  # "redis" | "memory"

    async def page(self, start: int, stop: int, reverse: bool) -> Page: ...

    async def locate(self, members: list[str], reverse: bool) -> Lookup: ...

    async def count_between(self, low: str, high: str) -> Counted:
        """Members with low <= score <= high; bounds in Redis syntax (`-inf`, `(5`, `10`)."""
        ...

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        """(members strictly better than `score` in the view, members equal to it, seq)."""
        ...
