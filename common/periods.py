"""Calendar period math shared by the worker (bucketing, expiry, late events) and the API
(`period=` and `at=`). Periods are computed in the config's time zone.

Period ids: hour `2026-11-22T13`, day `2026-11-22`, week `2026-W47` (ISO), month `2026-11`,
year `2026`. In a zone with daylight saving, the repeated local hour of the autumn change is
one bucket (its id names the local hour) and covers both real hours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from common.boards import WindowKind

_HOUR = timedelta(hours=1)
CALENDAR_KINDS = (WindowKind.HOUR, WindowKind.DAY, WindowKind.WEEK, WindowKind.MONTH, WindowKind.YEAR)
_PATTERNS = {
    WindowKind.HOUR: re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2})$"),
    WindowKind.DAY: re.compile(r"^(\d{4})-(\d{2})-(\d{2})$"),
    WindowKind.WEEK: re.compile(r"^(\d{4})-W(\d{2})$"),
    WindowKind.MONTH: re.compile(r"^(\d{4})-(\d{2})$"),
    WindowKind.YEAR: re.compile(r"^(\d{4})$"),
}


@dataclass(frozen=True, slots=True)
class Period:
    kind: WindowKind
    id: str
    start_ms: int  # inclusive
    end_ms: int  # exclusive

    def contains(self, ts_ms: int) -> bool:
        return self.start_ms <= ts_ms < self.end_ms


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


def _epoch_ms(local: datetime, tz: ZoneInfo) -> int:
    return int(local.replace(tzinfo=tz).timestamp() * 1000)


def _make(kind: WindowKind, start: datetime, tz: ZoneInfo) -> Period:
    end = _shift(kind, start, 1)
    return Period(kind, _label(kind, start), _epoch_ms(start, tz), _epoch_ms(end, tz))


def period_at(kind: WindowKind, ts_ms: int, tz: ZoneInfo) -> Period:
    """The period of `kind` that contains the instant `ts_ms`."""
    local = datetime.fromtimestamp(ts_ms / 1000, tz).replace(tzinfo=None)
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
        return _make(kind, start, tz)
    except (ValueError, OverflowError):
        raise ValueError(f"{period_id!r} is not a {kind} period id") from None


def expire_at_ms(period: Period, retention: int, tz: ZoneInfo) -> int:
    """When a period's keys expire: at the start of the period `retention` after it (hour with
    retention 72: the start of the 72nd hour after it). Counted from the period's nominal local
    start (a day that begins inside a DST gap starts, on the clock, after it), and counting only
    periods that exist: a local hour a DST change skips entirely is no period."""
    start = _start_local(period.kind, datetime.fromtimestamp(period.start_ms / 1000, tz).replace(tzinfo=None))
    if period.kind is not WindowKind.HOUR:
        return _epoch_ms(_shift(period.kind, start, retention), tz)
    label, counted = start, 0
    while counted < retention:
        label += _HOUR
        if _epoch_ms(label + _HOUR, tz) > _epoch_ms(label, tz):  # some instant reads this hour
            counted += 1
    return _epoch_ms(label, tz)


class PeriodCache:
    """Period lookup for a stream of timestamps: consecutive events almost always fall in the
    period just looked up, so this skips the calendar math for them."""

    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._last: dict[WindowKind, Period] = {}

    def at(self, kind: WindowKind, ts_ms: int) -> Period:
        last = self._last.get(kind)
        if last is not None and last.start_ms <= ts_ms < last.end_ms:
            return last
        period = period_at(kind, ts_ms, self._tz)
        self._last[kind] = period
        return period
