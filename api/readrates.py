"""Which boards a node reads enough to hold them in memory by itself, and which it stopped
reading (seed 002 §4.7): per board, reads per second as two moving averages, sampled once a
second. A board not hot is promoted once its short average (PROMOTE_SPAN_S) reaches the
threshold; a promoted board is dropped once its long average (the idle setting) falls below a
quarter of it (the gap keeps a board near the threshold from going in and out).

Counting is one dict update per read; the averages are updated once a second, over the boards
read since, and the boards still being averaged."""

from __future__ import annotations

import math
from dataclasses import dataclass

PROMOTE_SPAN_S = 10.0  # the short average's time constant (s)
DEMOTE_FRACTION = 0.25  # of the threshold: below it, over the idle span, a promoted board goes
FORGET_BELOW = 0.05  # reads/s: a board averaging less is no longer followed (unless promoted)
MAX_COUNTED = 100_000  # boards counted between two samples (names are the callers'): beyond, none more
MAX_FOLLOWED = 10_000  # boards whose averages are kept: beyond, the half read least is forgotten


@dataclass
class _Rate:
    short: float = 0.0
    long: float = 0.0


class ReadRates:
    def __init__(self, threshold: float, idle_s: float, max_promoted: int) -> None:
        self.threshold = threshold  # reads/s; 0: nothing is promoted
        self._short = math.exp(-1.0 / PROMOTE_SPAN_S)
        self._long = math.exp(-1.0 / max(idle_s, 1.0))
        self.max_promoted = max_promoted
        self.counts: dict[str, int] = {}  # reads since the last sample
        self._rates: dict[str, _Rate] = {}

    def seen(self, board: str) -> None:
        counts = self.counts
        if board in counts:
            counts[board] += 1
        elif len(counts) < MAX_COUNTED:
            counts[board] = 1

    def sample(self, elapsed_s: float, hot: set[str], promoted: set[str]) -> tuple[list[str], list[str]]:
        """Fold in the reads counted over the last `elapsed_s` seconds: (boards to promote, best
        first, within max_promoted; promoted boards to drop). `hot`: boards in memory by the
        config, never promoted; `promoted`: those this node holds (or loads) by itself."""
        counts, self.counts = self.counts, {}
        if self.threshold <= 0:
            return [], []
        steps = max(elapsed_s, 1e-3)
        short_keep, long_keep = self._short**steps, self._long**steps
        for board in counts.keys() | self._rates.keys():
            per_s = counts.get(board, 0) / steps
            rate = self._rates.get(board)
            if rate is None:
                # followed once it is read at least as often as a promoted board must stay (from
                # nothing, an average of fewer reads can't reach the threshold); names are the
                # callers': a flood of them must not grow the node (_make_room)
                if per_s < self.threshold * DEMOTE_FRACTION:
                    continue
                if len(self._rates) >= MAX_FOLLOWED:
                    self._make_room(promoted)
                rate = self._rates[board] = _Rate(long=per_s)
            rate.short = rate.short * short_keep + per_s * (1 - short_keep)
            rate.long = rate.long * long_keep + per_s * (1 - long_keep)
            if rate.short < FORGET_BELOW and rate.long < FORGET_BELOW and board not in promoted:
                del self._rates[board]
        drop = [b for b in promoted if self.rate_long(b) < self.threshold * DEMOTE_FRACTION]
        room = self.max_promoted - (len(promoted) - len(drop))
        wanted = sorted(
            (
                b
                for b, r in self._rates.items()
                if r.short >= self.threshold and b not in hot and b not in promoted
            ),
            key=lambda b: -self._rates[b].short,
        )
        return wanted[: max(room, 0)], drop

    def _make_room(self, promoted: set[str]) -> None:
        """Forget the half of the boards followed, not promoted, read least (short average)."""
        followed = sorted((b for b in self._rates if b not in promoted), key=lambda b: self._rates[b].short)
        for board in followed[: len(followed) // 2 + 1]:
            del self._rates[board]

    def rate_long(self, board: str) -> float:
        found = self._rates.get(board)
        return 0.0 if found is None else found.long

    def promoted_now(self, board: str) -> None:
        """A board just promoted: its long average starts at its short one (it is read that much)."""
        found = self._rates.get(board)
        if found is not None:
            found.long = max(found.long, found.short)
