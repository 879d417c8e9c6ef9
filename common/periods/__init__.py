"""Period math shared by the worker (bucketing, expiry, late events, erase) and the API
(`period=`, `at=`, `trend=1`, `period_expired`), for every window made of periods: calendar
(calendar.py), fixed-length (fixed.py) and seasons (seasons.py). A rolling window's periods are
the calendar periods of its bucket unit (its period is named by its newest bucket; which buckets
it sums is worker/rolling_slots.py's). Computed in the config's zone.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from common.periods import calendar, fixed, seasons
from common.periods.model import Period
from common.windows import EARLIEST_MS, Window, WindowKind

__all__ = [
    "Period",
    "PeriodCache",
    "expire_at_ms",
    "no_period_span",
    "parse_period",
    "period_at",
    "previous_period",
    "recent_periods",
    "shift",
]


_REPEAT_MS = 3 * 3_600_000  # longer than any stretch of local time a DST change repeats


def _minutes(window: Window) -> int:
    assert window.minutes is not None
    return window.minutes


def period_at(window: Window, ts_ms: int, tz: ZoneInfo) -> Period | None:
    """The period of `window` that holds the instant `ts_ms`; None: none (between seasons)."""
    if (kind := window.calendar_kind) is not None:
        return calendar.period_at(kind, ts_ms, tz)
    if window.kind is WindowKind.FIXED:
        return fixed.period_at(_minutes(window), ts_ms, tz)
    if window.kind is WindowKind.SEASON:
        return seasons.period_at(window, ts_ms, tz)
    raise ValueError(f"window {window.name!r} has no periods")


def no_period_span(window: Window, ts_ms: int, tz: ZoneInfo) -> tuple[int, int]:
    """[from, until) around `ts_ms`, an instant no period of `window` holds (between seasons):
    no instant in it has one either."""
    return seasons.gap_around(window, ts_ms, tz)


def parse_period(window: Window, period_id: str, tz: ZoneInfo) -> Period:
    """The period named `period_id`; ValueError (its message says why) when there is none."""
    if (kind := window.calendar_kind) is not None:
        return calendar.parse_period(kind, period_id, tz)
    if window.kind is WindowKind.FIXED:
        return fixed.parse_period(_minutes(window), period_id, tz)
    if window.kind is WindowKind.SEASON:
        return seasons.parse_period(window, period_id, tz)
    raise ValueError(f"window {window.name!r} has no periods")


def previous_period(window: Window, period: Period, tz: ZoneInfo) -> Period | None:
    """The period before `period` in the same window (trend=1's prev_rank); None: it is the first."""
    if window.kind is WindowKind.SEASON:
        return seasons.previous(window, period, tz)
    return _step(window, period, -1, tz)


def expire_at_ms(window: Window, period: Period, retention: int, tz: ZoneInfo) -> int:
    """When the period's keys expire and it stops being readable (404 period_expired): never
    before it ends (a 30min period whose local times a DST change repeats ends after the next
    one starts)."""
    if window.calendar_kind is not None:
        expire = calendar.expire_at_ms(period, retention, tz)
    elif window.kind is WindowKind.FIXED:
        expire = fixed.expire_at_ms(_minutes(window), period.id, retention, tz)
    else:
        expire = seasons.expire_at_ms(window, period, retention, tz)
    return max(expire, period.end_ms)


def recent_periods(
    window: Window, retention: int, now_ms: int, latest_ms: int, tz: ZoneInfo
) -> list[tuple[Period, int]]:
    """Every period of `window` that may hold data at `now_ms`, with its expiry: it starts no
    later than `latest_ms` (the latest accepted event time), ends after 2000, and has not
    expired. Newest first. Linear in the periods kept (an erase asks it of every window)."""
    if window.kind is WindowKind.SEASON:
        if window.rule is None:  # named: a short season after a long one expires first
            named = reversed(seasons.named_periods(window))
            kept = [(p, expire_at_ms(window, p, retention, tz)) for p in named if p.start_ms <= latest_ms]
            return [(p, expire) for p, expire in kept if expire > now_ms]
        newest = seasons.latest_at(window, latest_ms, tz)
        out: list[tuple[Period, int]] = []
        while newest is not None and (expire := expire_at_ms(window, newest, retention, tz)) > now_ms:
            out.append((newest, expire))
            newest = previous_period(window, newest, tz)
        return out
    # a calendar or fixed-length period expires when the `retention`-th period after it starts,
    # or when it ends if that is later: one walk back, from `retention` periods past the newest,
    # gives every expiry. It starts 3 h past `latest_ms`: where a DST change repeats local
    # times, a period with a later id can start before the one holding `latest_ms`.
    newest = period_at(window, latest_ms + _REPEAT_MS, tz)
    assert newest is not None
    chain = [*reversed(_following(window, newest, retention, tz)), newest]
    kept_periods: list[tuple[Period, int]] = []
    period: Period | None = newest
    while period is not None and period.end_ms > EARLIEST_MS:
        later = chain[-1 - retention]
        if later.start_ms <= now_ms and period.end_ms <= now_ms:
            break
        if period.start_ms <= latest_ms:
            kept_periods.append((period, max(later.start_ms, period.end_ms)))
        period = previous_period(window, period, tz)
        if period is not None:
            chain.append(period)
    return kept_periods


def shift(window: Window, period: Period, n: int, tz: ZoneInfo) -> Period:
    """The calendar or fixed-length period `n` periods after `period` (before it for n < 0):
    periods that exist (a DST change skips or merges local hours)."""
    if window.calendar_kind is not None:
        return calendar.shift(period, n, tz) if n else period
    direction = 1 if n > 0 else -1
    for _ in range(abs(n)):
        period = _step(window, period, direction, tz)
    return period


def _following(window: Window, period: Period, count: int, tz: ZoneInfo) -> list[Period]:
    """The `count` periods after `period`, in order."""
    out = []
    for _ in range(count):
        period = _step(window, period, 1, tz)
        out.append(period)
    return out


def _step(window: Window, period: Period, direction: int, tz: ZoneInfo) -> Period:
    """A calendar or fixed-length period's neighbour: after it (1) or before it (-1)."""
    if window.kind is WindowKind.FIXED:
        return fixed.step(_minutes(window), period, direction, tz)
    return calendar.step(period, direction, tz)


class PeriodCache:
    """Period lookup for a stream of timestamps: consecutive events almost always fall in the
    period just looked up, so this skips the period math for them."""

    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._last: dict[int, Period | None] = {}  # id(window) (the config's, kept for good)

    def at(self, window: Window, ts_ms: int) -> Period | None:
        last = self._last.get(id(window))
        if last is not None and last.reusable_for(ts_ms):
            return last
        period = period_at(window, ts_ms, self._tz)
        self._last[id(window)] = period
        return period
