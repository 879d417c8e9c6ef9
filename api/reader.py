"""What a board window can answer, whether it lives in Redis or in memory (hot boards).

Positions are 0-based in the *view* order: the board's own order, or its exact reverse when
the caller asks for the other `order`. Rank rules on top of them live in common/ranking.py."""

from __future__ import annotations

from typing import Protocol

from common.store.reads import Around, Counted, Entry, Located, Lookup, Page

__all__ = ["Around", "BoardReader", "Counted", "Entry", "Located", "Lookup", "Page"]


class BoardReader(Protocol):
    source: str  # "redis" | "memory"

    async def page(self, start: int, stop: int, reverse: bool) -> Page: ...

    async def locate(self, members: list[str], reverse: bool, better: bool = True) -> Lookup:
        """better=False: Located.better may be -1 (ordinal ranks need none; Redis skips counting)."""
        ...

    async def around(self, member: str, n: int, reverse: bool, better: bool = True) -> Around:
        """`member` and the n rows above and below it in the view, as of one seq."""
        ...

    async def count_between(self, low: str, high: str) -> Counted:
        """Members with low <= score <= high; bounds in Redis syntax (`-inf`, `(5`, `10`)."""
        ...

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        """(members strictly better than `score` in the view, members equal to it, seq)."""
        ...
