"""Fixed-length periods (`<N>min`, `<N>h`, N dividing 24 h), aligned to local midnight.

A period is named by its local start, `2026-11-22T13:30`, and holds every instant whose local
wall-clock time falls in [start, start + N). Where a DST change repeats local times, a period
whose times repeat is one period spanning both occurrences (as the calendar `hour` does); its
span then runs to the second occurrence of its end and is not one contiguous stretch when N is
shorter than the repeat. A local time a DST change skips names no period.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from common.periods.model import Period, epoch_ms, first_instant, local_of, local_period
from common.windows import WindowKind

_PATTERN = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})$")
_MINUTE = timedelta(minutes=1)


def _label(start: datetime) -> str:
    return start.strftime("%Y-%m-%dT%H:%M")


def _start_local(minutes: int, local: datetime) -> datetime:
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    into = (local.hour * 60 + local.minute) // minutes * minutes
    return midnight + timedelta(minutes=into)


def _make(minutes: int, start: datetime, tz: ZoneInfo) -> Period:
    return local_period(WindowKind.FIXED, _label(start), start, start + timedelta(minutes=minutes), tz)


def _exists(minutes: int, start: datetime, tz: ZoneInfo) -> bool:
    """Some instant reads a local time in [start, start + N)."""
    return (
        _start_local(minutes, local_of(epoch_ms(start, tz), tz)) == start
        or _start_local(
            minutes, local_of(epoch_ms(start + timedelta(minutes=minutes) - _MINUTE, tz, fold=1), tz)
        )
        == start
    )


def period_at(minutes: int, ts_ms: int, tz: ZoneInfo) -> Period:
    return _make(minutes, _start_local(minutes, local_of(ts_ms, tz)), tz)


def parse_period(minutes: int, period_id: str, tz: ZoneInfo) -> Period:
    match = _PATTERN.match(period_id)
    what = f"{period_id!r} is not a {minutes}-minute period id (YYYY-MM-DDTHH:MM)"
    if match is None:
        raise ValueError(what)
    try:
        year, month, day, hour, minute = (int(part) for part in match.groups())
        start = datetime(year, month, day, hour, minute)
    except ValueError:
        raise ValueError(what) from None
    if (start.hour * 60 + start.minute) % minutes:
        reason = "they start at local midnight, every"
        raise ValueError(f"{period_id!r} does not start a period ({reason} {minutes} minutes)")
    try:
        if not _exists(minutes, start, tz):
            raise ValueError(
                f"{period_id!r} names local times that a daylight-saving change skips in {tz.key}"
            )
        return _make(minutes, start, tz)
    except OverflowError:  # the last period of year 9999 ends beyond the calendar
        raise ValueError(what) from None


def step(minutes: int, period: Period, direction: int, tz: ZoneInfo) -> Period:
    """The period after `period` (direction 1) or before it (-1), skipping local times that a
    DST change skips."""
    shift = timedelta(minutes=minutes * direction)
    label = datetime.strptime(period.id, "%Y-%m-%dT%H:%M") + shift
    while not _exists(minutes, label, tz):
        label += shift
    return _make(minutes, label, tz)


@lru_cache(maxsize=65_536)  # one per period kept: the hot nodes' sweep asks each
def expire_at_ms(minutes: int, period_id: str, retention: int, tz: ZoneInfo) -> int:
    """The start of the period `retention` after it, counting only periods that exist."""
    label, counted = datetime.strptime(period_id, "%Y-%m-%dT%H:%M"), 0
    step = timedelta(minutes=minutes)
    while counted < retention:
        label += step
        if _exists(minutes, label, tz):
            counted += 1
    return first_instant(label, tz)
