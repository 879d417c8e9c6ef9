"""A period and the local-time conversions every period kind uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from common.windows import WindowKind


@dataclass(frozen=True, slots=True)
class Period:
    kind: WindowKind
    id: str
    start_ms: int  # inclusive: the first instant of the period
    end_ms: int  # exclusive: after its last instant (it closes here; late grace counts from it)
    # the instants around the one it was looked up for that fall in it too, [from, until): a
    # stream of timestamps reuses the period in there (common/periods PeriodCache, the worker).
    # Empty unless the period is one contiguous span (a 30min period whose local times a DST
    # change repeats is two spans: each instant is looked up)
    reuse_from: int = field(default=0, compare=False)
    reuse_until: int = field(default=0, compare=False)

    def reusable_for(self, ts_ms: int) -> bool:
        return self.reuse_from <= ts_ms < self.reuse_until


_MINUTE = timedelta(minutes=1)


def local_period(kind: WindowKind, period_id: str, start: datetime, end: datetime, tz: ZoneInfo) -> Period:
    """The period holding every instant whose local time is in [start, end). It starts at the
    first occurrence of `start`; where a DST change repeats its last local times it runs to the
    second occurrence of `end`. Where a repeated stretch of local time straddles its start or
    its end, its instants interleave with its neighbour's: not reusable over its span."""
    end_repeated = repeated(end - _MINUTE, tz)
    end_ms = epoch_ms(end, tz, fold=1) if end_repeated else first_instant(end, tz)
    period = Period(kind, period_id, first_instant(start, tz), end_ms)
    split = (end_repeated and repeated(end, tz)) or (repeated(start, tz) and repeated(start - _MINUTE, tz))
    return period if split else contiguous(period)


def contiguous(period: Period) -> Period:
    """`period`, reusable over its whole span."""
    return Period(period.kind, period.id, period.start_ms, period.end_ms, period.start_ms, period.end_ms)


def local_of(ts_ms: int, tz: ZoneInfo) -> datetime:
    """The local wall-clock time (naive) of an instant."""
    return datetime.fromtimestamp(ts_ms / 1000, tz).replace(tzinfo=None)


def epoch_ms(local: datetime, tz: ZoneInfo, fold: int = 0) -> int:
    """The instant of a local wall-clock time: its first occurrence (fold 0) or its second, where
    a DST change repeats it; a time a DST change skips reads with the offset before it."""
    return int(local.replace(tzinfo=tz, fold=fold).timestamp() * 1000)


def first_instant(local: datetime, tz: ZoneInfo) -> int:
    """The first instant whose local time is `local` or later: its first occurrence, or where a
    DST change skips `local`, the instant the clock jumps (Pacific/Chatham skips 02:45-03:45, so
    its hour 03 starts at the jump, at 03:45)."""
    ms = epoch_ms(local, tz)
    if local_of(ms, tz) == local:
        return ms
    low, high = epoch_ms(local, tz, fold=1), ms  # before the gap, after it: local time rises between
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if local_of(middle, tz) >= local else (middle, high)
    return high


def repeated(local: datetime, tz: ZoneInfo) -> bool:
    """True if a DST change makes the local time `local` happen twice."""
    first, second = local.replace(tzinfo=tz, fold=0), local.replace(tzinfo=tz, fold=1)
    offset_first, offset_second = first.utcoffset(), second.utcoffset()
    return offset_first is not None and offset_second is not None and offset_first > offset_second
