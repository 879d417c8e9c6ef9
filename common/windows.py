"""Window kinds and their YAML spellings (docs/contract.md §3): which windows a board type keeps.

    total                       one instance, forever
    hour day week month year    calendar periods in the config's time zone
    <N>min  <N>h                fixed-length periods whose length divides 24 h, from local midnight
    season                      the type's `seasons:` (named, with start and end instants, or
                                every N days from an anchor date)
    last_<N>h|d|w|m             rolling: the sum of the newest N buckets (calendar hours, days, ISO
                                weeks or months); its periods are named by their newest bucket

The period math of each kind lives in common/periods/; this module only parses and describes.
"""

from __future__ import annotations

import re
from contextlib import suppress
from dataclasses import dataclass
from datetime import date, datetime
from enum import StrEnum
from zoneinfo import ZoneInfo

MAX_ROLLING_COUNT = 10_000
# the instances one apply.lua call holds (its window mask is a Lua double: 53 exact bits), so the
# most one event may count in (worker/apply.py; common/boards.py checks each type against it)
MAX_INSTANCES_PER_CALL = 48
# the shortest a rolling window's bucket lasts (an hour a DST change shortens: 30 min in
# Australia/Lord_Howe; a month: February), for how many closed periods late grace keeps open
SHORTEST_BUCKET_MS = {"h": 1_800_000, "d": 82_800_000, "w": 601_200_000, "m": 2_415_600_000}
SEASON_WINDOW = "season"
DAY_MINUTES = 24 * 60
EARLIEST_MS = 946_684_800_000  # 2000-01-01T00:00Z: no accepted event is older (common/events.py)
LATEST_MS = 7_258_118_400_000  # 2200-01-01T00:00Z


class WindowKind(StrEnum):
    TOTAL = "total"
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    YEAR = "year"
    FIXED = "fixed"  # <N>min / <N>h
    SEASON = "season"
    ROLLING = "rolling"


CALENDAR_KINDS = frozenset(
    {WindowKind.HOUR, WindowKind.DAY, WindowKind.WEEK, WindowKind.MONTH, WindowKind.YEAR}
)
# windows made of periods: each has period ids, retention, late grace and a previous period
PERIOD_KINDS = CALENDAR_KINDS | {WindowKind.FIXED, WindowKind.SEASON, WindowKind.ROLLING}
# a rolling window's buckets, by its unit letter: the calendar periods of that kind
ROLLING_UNITS = {"h": WindowKind.HOUR, "d": WindowKind.DAY, "w": WindowKind.WEEK, "m": WindowKind.MONTH}


@dataclass(frozen=True, slots=True)
class Season:
    """One named season: [start_ms, end_ms)."""

    name: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class SeasonRule:
    """Seasons of `every_days` local days each, the first starting at local midnight of `anchor`;
    season k is named `<anchor>+<k>`."""

    every_days: int
    anchor: date


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    kind: WindowKind
    rolling_count: int | None = None
    rolling_unit: str | None = None  # "h" | "d" | "w" | "m" (months)
    minutes: int | None = None  # FIXED: the period's length
    seasons: tuple[Season, ...] = ()  # SEASON: named seasons, in time order, not overlapping
    rule: SeasonRule | None = None  # SEASON: or every N days from an anchor

    @property
    def periodic(self) -> bool:
        return self.kind in PERIOD_KINDS

    @property
    def calendar_kind(self) -> WindowKind | None:
        """The calendar kind of the window's periods: its own, or a rolling window's bucket unit
        (a rolling period is named by, and lasts as long as, its newest bucket); None otherwise."""
        if self.kind is WindowKind.ROLLING:
            assert self.rolling_unit is not None
            return ROLLING_UNITS[self.rolling_unit]
        return self.kind if self.kind in CALENDAR_KINDS else None

    @property
    def count(self) -> int:
        """A rolling window's N: how many buckets it sums."""
        assert self.rolling_count is not None
        return self.rolling_count


class WindowError(ValueError):
    """A window name or season declaration that can't be used; the message names the problem."""


_NAMED_KINDS = {kind.value: kind for kind in (WindowKind.TOTAL, *sorted(CALENDAR_KINDS))}
_ROLLING_RE = re.compile(r"last_(\d+)([hdwm])")
_FIXED_RE = re.compile(r"(\d+)(min|h)")
EXPECTED = "total, hour, day, week, month, year, <N>min, <N>h, season or last_<N>h|d|w|m"


def _canonical(digits: str) -> int | None:
    """The number a window name spells, if it is spelled without leading zeros."""
    return int(digits) if digits == str(int(digits)) else None


def parse_window(name: str, seasons: tuple[Season, ...] = (), rule: SeasonRule | None = None) -> Window:
    """The window `name` names (WindowError otherwise); `season` takes the type's seasons."""
    kind = _NAMED_KINDS.get(name)
    if kind is not None:
        return Window(name=name, kind=kind)
    if name == SEASON_WINDOW:
        if not seasons and rule is None:
            raise WindowError("window 'season' needs the type's 'seasons' (a list, or every_days and anchor)")
        return Window(name=name, kind=WindowKind.SEASON, seasons=seasons, rule=rule)
    fixed = _FIXED_RE.fullmatch(name)
    if fixed is not None:
        # the name doubles as the API's window parameter and a Redis key part: one spelling each
        count = _canonical(fixed[1])
        minutes = None if count is None else count * (60 if fixed[2] == "h" else 1)
        if minutes is None or minutes == 0 or DAY_MINUTES % minutes:
            raise WindowError(
                f"fixed-length window {name!r}: the length must divide 24 h (e.g. 15min, 30min, 2h), "
                "written without leading zeros"
            )
        return Window(name=name, kind=WindowKind.FIXED, minutes=minutes)
    rolling = _ROLLING_RE.fullmatch(name)
    if rolling is None:
        raise WindowError(f"unknown window {name!r} (expected {EXPECTED})")
    count = _canonical(rolling[1])
    if count is None or not 1 <= count <= MAX_ROLLING_COUNT:
        raise WindowError(f"rolling window {name!r}: N must be 1..{MAX_ROLLING_COUNT} without leading zeros")
    return Window(name=name, kind=WindowKind.ROLLING, rolling_count=count, rolling_unit=rolling[2])


# --- seasons and instants in the config ---------------------------------------------------------

SEASON_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_instant(value: object, tz: ZoneInfo) -> int:
    """ms since the epoch of a config instant: ISO 8601 text or a YAML timestamp; without an
    offset it is local time in the config's zone (its first occurrence where DST repeats it)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value, datetime.min.time())
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            example = "e.g. 2026-12-01T00:00+08:00"
            raise WindowError(f"{value!r} is not an ISO 8601 date-time ({example})") from None
    else:
        raise WindowError(f"expected an ISO 8601 date-time, got {type(value).__name__}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    ms = int(moment.timestamp() * 1000)
    if not EARLIEST_MS <= ms < LATEST_MS:
        raise WindowError(f"{value!s} lies outside 2000-01-01..2200-01-01")
    return ms


def parse_anchor(value: object) -> date:
    """A season rule's anchor: a date from 2000-01-01 to 2199-12-31 (seasons far past the
    calendar's end would make every event of the type fail)."""
    anchor = None
    if isinstance(value, date) and not isinstance(value, datetime):
        anchor = value
    elif isinstance(value, str):
        with suppress(ValueError):
            anchor = date.fromisoformat(value)
    if anchor is None or not date(2000, 1, 1) <= anchor < date(2200, 1, 1):
        raise WindowError(f"anchor must be a date (YYYY-MM-DD) in 2000..2199, got {value!r}")
    return anchor


def check_seasons(seasons: list[Season]) -> tuple[Season, ...]:
    """Named seasons in time order, each with a valid name, start before end, none overlapping."""
    if not seasons:
        raise WindowError("at least one season is required")
    seen: set[str] = set()
    for index, season in enumerate(seasons):
        if SEASON_NAME_RE.fullmatch(season.name) is None:
            raise WindowError(f"[{index}].name: {season.name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
        if season.name in seen:
            raise WindowError(f"[{index}].name: season {season.name!r} is listed twice")
        seen.add(season.name)
        if season.start_ms >= season.end_ms:
            raise WindowError(f"[{index}]: season {season.name!r} must start before it ends")
        if index and season.start_ms < seasons[index - 1].end_ms:
            raise WindowError(
                f"[{index}]: season {season.name!r} starts before {seasons[index - 1].name!r} ends "
                "(list seasons in time order, without overlap)"
            )
    return tuple(seasons)
