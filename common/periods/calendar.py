"""Calendar periods (hour, day, week, month, year) in the config's time zone.

Period ids: hour `2026-11-22T13`, day `2026-11-22`, week `2026-W47` (ISO), month `2026-11`,
year `2026`. In a zone with daylight saving, the repeated local hour of the autumn change is
one bucket (its id names the local hour) and covers both real hours.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from common.periods.model import Period, first_instant, local_of, local_period
from common.windows import WindowKind

_HOUR = timedelta(hours=1)
_PATTERNS = {
    WindowKind.HOUR: re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2})$"),
    WindowKind.DAY: re.compile(r"^(\d{4})-(\d{2})-(\d{2})$"),
    WindowKind.WEEK: re.compile(r"^(\d{4})-W(\d{2})$"),
    WindowKind.MONTH: re.compile(r"^(\d{4})-(\d{2})$"),
    WindowKind.YEAR: re.compile(r"^(\d{4})$"),
}


def _start_local(kind: WindowKind, local: datetime) -> datetime:
    """The local wall-clock start of the period containing `local` (naive)."""
    if kind is WindowKind.HOUR:
        return local.replace(minute=0, second=0, microsecond=0)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind is WindowKind.DAY:
        return day
    if kind is WindowKind.WEEK:
        return day - timedelta(days=day.weekday())
    if kind is WindowKind.MONTH:
        return day.replace(day=1)
    return day.replace(month=1, day=1)


def _shift(kind: WindowKind, start: datetime, n: int) -> datetime:
    """The local start `n` periods after the one starting at `start`."""
    if kind is WindowKind.HOUR:
        return start + timedelta(hours=n)
    if kind is WindowKind.DAY:
        return start + timedelta(days=n)
    if kind is WindowKind.WEEK:
        return start + timedelta(weeks=n)
    if kind is WindowKind.MONTH:
        months = start.year * 12 + start.month - 1 + n
        return start.replace(year=months // 12, month=months % 12 + 1)
    return start.replace(year=start.year + n)


def _label(kind: WindowKind, start: datetime) -> str:
    if kind is WindowKind.HOUR:
        return start.strftime("%Y-%m-%dT%H")
    if kind is WindowKind.DAY:
        return start.strftime("%Y-%m-%d")
    if kind is WindowKind.WEEK:
        iso = start.isocalendar()
        return f"{iso.year:04d}-W{iso.week:02d}"
    if kind is WindowKind.MONTH:
        return start.strftime("%Y-%m")
    return start.strftime("%Y")


def _make(kind: WindowKind, start: datetime, tz: ZoneInfo) -> Period:
    end = _shift(kind, start, 1)
    return local_period(kind, _label(kind, start), start, end, tz)


def period_at(kind: WindowKind, ts_ms: int, tz: ZoneInfo) -> Period:
    """The period of `kind` that contains the instant `ts_ms`."""
    local = local_of(ts_ms, tz)
    return _make(kind, _start_local(kind, local), tz)


def parse_period(kind: WindowKind, period_id: str, tz: ZoneInfo) -> Period:
    """The period named `period_id`; ValueError when it is not a valid id of `kind`."""
    match = _PATTERNS[kind].match(period_id)
    if match is None:
        raise ValueError(f"{period_id!r} is not a {kind} period id")
    parts = [int(p) for p in match.groups()]
    try:
        if kind is WindowKind.WEEK:
            start = datetime.combine(date.fromisocalendar(parts[0], parts[1], 1), datetime.min.time())
        else:
            fields = [*parts, *(1, 1, 0)[len(parts) - 1 :]]  # missing month/day -> 1, hour -> 0
            start = datetime(fields[0], fields[1], fields[2], fields[3])
        # the period after the last one of year 9999 does not exist: OverflowError/ValueError
        period = _make(kind, start, tz)
    except (ValueError, OverflowError):
        raise ValueError(f"{period_id!r} is not a {kind} period id") from None
    if period.end_ms <= period.start_ms:
        raise ValueError(f"{period_id!r} names local times that a daylight-saving change skips in {tz.key}")
    return period


@lru_cache(maxsize=65_536)  # an hour's walks the retention: asked per API read and per period change
def expire_at_ms(period: Period, retention: int, tz: ZoneInfo) -> int:
    """When a period's keys expire: at the start of the period `retention` after it (hour with
    retention 72: the start of the 72nd hour after it). Counted from the period's nominal local
    start (a day that begins inside a DST gap starts, on the clock, after it), and counting only
    periods that exist: a local hour a DST change skips entirely is no period."""
    start = _start_local(period.kind, local_of(period.start_ms, tz))
    if period.kind is not WindowKind.HOUR:
        return first_instant(_shift(period.kind, start, retention), tz)
    label, counted = start, 0
    while counted < retention:
        label += _HOUR
        if first_instant(label + _HOUR, tz) > first_instant(label, tz):  # some instant reads this hour
            counted += 1
    return first_instant(label, tz)


def step(period: Period, direction: int, tz: ZoneInfo) -> Period:
    """The period after `period` (direction 1) or before it (-1); an hour a DST change skips
    entirely is no period."""
    label = _shift(period.kind, _start_local(period.kind, local_of(period.start_ms, tz)), direction)
    found = _make(period.kind, label, tz)
    while found.end_ms <= found.start_ms:
        label = _shift(period.kind, label, direction)
        found = _make(period.kind, label, tz)
    return found


@lru_cache(maxsize=65_536)  # a rolling window asks it per bucket change, per window
def shift(period: Period, n: int, tz: ZoneInfo) -> Period:
    """The period `n` periods after `period` (before it for n < 0), counting only periods that
    exist (an hour a DST change skips entirely is none)."""
    if period.kind is not WindowKind.HOUR:
        found = _make(
            period.kind, _shift(period.kind, _start_local(period.kind, local_of(period.start_ms, tz)), n), tz
        )
        return found if found.end_ms > found.start_ms else step(found, 1 if n > 0 else -1, tz)
    direction = 1 if n > 0 else -1
    label = _start_local(period.kind, local_of(period.start_ms, tz))
    counted = 0
    while counted < abs(n):
        label += direction * _HOUR
        if first_instant(label + _HOUR, tz) > first_instant(label, tz):  # some instant reads this hour
            counted += 1
    return _make(period.kind, label, tz)
