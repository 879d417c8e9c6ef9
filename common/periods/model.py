"""A period and the local-time conversions every period kind uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
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


def repeated(local: datetime, tz: ZoneInfo) -> bool:
    """True if a DST change makes the local time `local` happen twice."""
    first, second = local.replace(tzinfo=tz, fold=0), local.replace(tzinfo=tz, fold=1)
    offset_first, offset_second = first.utcoffset(), second.utcoffset()
    return offset_first is not None and offset_second is not None and offset_first > offset_second
