"""The board configuration every scenario runs on, written for the run's start: every window kind
(calendar, fixed-length, seasons, rolling), a league, a sharded type, period results, a default
type, and hot boards (one of them a league) served from the API nodes' memory."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from rankstream.topics import UPDATE_PARTITIONS

ZONE = "Asia/Kathmandu"  # +05:45: local hours, half hours and midnights are not UTC's
TZ = ZoneInfo(ZONE)
DAY_MS = 86_400_000
GRACE_MS = DAY_MS  # every type but `cup`: an event of the last day counts in its periods
CUP_GRACE_MS = 30_000
CUP_EVENTS = 1_500  # the period-results type takes events among the stream's first ones only
RESULTS_TOP = 5
DIVISION_SIZE = 6
TIERS = ("bronze", "silver", "gold")

BOARDS: dict[str, list[str]] = {
    "gift": [f"gift:r{i}" for i in range(6)],
    "score": [f"score:s{i}" for i in range(4)],
    "plain": [f"plain:p{i}" for i in range(3)],
    "split": [f"split:h{i}" for i in range(3)],
    "cup": [f"cup:c{i}" for i in range(2)],
    "arena": [f"arena:a{i}" for i in range(2)],
    "misc": [f"misc:x{i}" for i in range(2)],  # no such type: the `default` type takes them
}
ALL_BOARDS = [board for boards in BOARDS.values() for board in boards]
# the soak's boards: big ones (every one of SOAK_MEMBERS members on each, named with 24
# characters), of the type and windows `make bench` measures Redis' bytes per member and window on
# (bench/redis_cost.py); one on each partition of update_rank (the producer's partitioner: CRC32 of
# the key), so that every worker gets its share
SOAK_MEMBERS = 10_000
SOAK_BOARDS = [
    next(f"bulk:b{i}" for i in range(1000) if zlib.crc32(f"bulk:b{i}".encode()) % UPDATE_PARTITIONS == p)
    for p in range(UPDATE_PARTITIONS)
]


def soak_member(index: int) -> str:
    return f"player-{index:017d}"


WHALE_BOARD = "misc:x0"  # a member walks into the exact limit there
HOT: dict[str, tuple[str, ...]] = {
    "gift:r0": ("total", "day", "last_2h"),
    "score:s0": ("total", "week"),
    "arena:a0": ("season",),
    "bulk:b1": ("total",),
}


@dataclass(frozen=True)
class TypeSpec:
    windows: tuple[str, ...]
    order: str = "desc"
    tie: str = "first"
    grace_ms: int = GRACE_MS


TYPES = {
    "gift": TypeSpec(("total", "hour", "day", "30min", "last_2h")),
    "score": TypeSpec(("total", "day", "week"), order="asc", tie="last"),
    "plain": TypeSpec(("total", "month", "season"), tie="none"),
    "split": TypeSpec(("total", "day")),
    "cup": TypeSpec(("total", "1min"), grace_ms=CUP_GRACE_MS),
    "arena": TypeSpec(("total", "season")),
    "misc": TypeSpec(("total",)),
    "bulk": TypeSpec(("total", "day", "week")),
}


def kind(board: str) -> str:
    return board.split(":", 1)[0]


@dataclass(frozen=True)
class Seasons:
    """Named seasons around the run's start: s0 ended ten days before it, s1 runs 30 days from
    three days before it (edge timestamps stay inside s1)."""

    start_ms: int

    def spans(self) -> dict[str, tuple[int, int]]:
        """name -> (start, end), on whole minutes (as the config writes them)."""
        minute = 60_000
        at = self.start_ms // minute * minute
        return {"s0": (at - 40 * DAY_MS, at - 10 * DAY_MS), "s1": (at - 3 * DAY_MS, at + 30 * DAY_MS)}


def _local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, TZ).strftime("%Y-%m-%dT%H:%M")


def boards_yaml(start_ms: int) -> str:
    """The config of a run started at `start_ms` (its seasons are written relative to it, on
    whole local minutes)."""
    seasons = ", ".join(
        f'{{name: {name}, start: "{_local(low)}", end: "{_local(high)}"}}'
        for name, (low, high) in Seasons(start_ms).spans().items()
    )
    hot = "\n".join(f'  - {{board: "{b}", windows: [{", ".join(w)}]}}' for b, w in HOT.items())
    return f"""# written by the chaos suite (chaos/config.py) for one run
timezone: {ZONE}
types:
  gift: {{windows: [total, hour, day, 30min, last_2h], late_grace: 1d}}
  score: {{order: asc, tie_break: last, windows: [total, day, week], late_grace: 1d}}
  plain: {{tie_break: none, windows: [total, month, season], late_grace: 1d, seasons: [{seasons}]}}
  split: {{windows: [total, day], shards: 3, late_grace: 1d}}
  cup: {{windows: [total, 1min], late_grace: 30s, period_results: {{windows: [1min], top: {RESULTS_TOP}}}}}
  arena:
    windows: [total, season]
    late_grace: 1d
    seasons: [{seasons}]
    league:
      division_size: {DIVISION_SIZE}
      tiers: [{", ".join(TIERS)}]
      promote: {{bronze: 2, silver: 0.2}}
      demote: {{silver: 1, gold: 0.2}}
      rewards: {{top: 2}}
  bulk: {{windows: [total, day, week], late_grace: 1d}}
  default: {{windows: [total], late_grace: 1d}}
hot:
{hot}
"""
