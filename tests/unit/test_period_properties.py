"""Properties of the period math over instants anywhere in the accepted range, in zones whose
daylight-saving changes are unusual (30-minute shifts, changes at midnight, 45-minute offsets):
every instant has exactly one period, which its id names back, which the cache agrees with, and
which stays readable at least until it ends."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from common.periods import (
    PeriodCache,
    expire_at_ms,
    parse_period,
    period_at,
    previous_period,
    recent_periods,
)
from common.windows import parse_window

ZONES = [
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # DST shifts by 30 minutes
    "Pacific/Chatham",  # +12:45 / +13:45, changes at 02:45
    "America/Havana",  # DST changes at midnight
    "Asia/Tehran",
    "Asia/Shanghai",
]
WINDOWS = [
    parse_window(name) for name in ("hour", "day", "week", "month", "year", "15min", "30min", "2h", "8h")
]
START, END = 946_684_800_000, 4_102_444_800_000  # 2000 .. 2100
_STEP = 6 * 3_600_000


def _offset(tz: ZoneInfo, ts_ms: int) -> object:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).astimezone(tz).utcoffset()


@cache
def transitions(zone: str) -> list[int]:
    """The instants (to the minute) where the zone's UTC offset changes, 2001..2040."""
    tz, out = ZoneInfo(zone), []
    ts = START + 366 * 86_400_000
    while ts < 2_208_988_800_000:
        if _offset(tz, ts) != _offset(tz, ts + _STEP):
            low, high = ts, ts + _STEP
            while high - low > 60_000:
                mid = (low + high) // 2
                low, high = (mid, high) if _offset(tz, mid) == _offset(tz, ts) else (low, mid)
            out.append(high)
        ts += _STEP
    return out or [ts]


@st.composite
def near_a_change(draw: st.DrawFn) -> tuple[str, int]:
    """A zone and an instant within 4 hours of one of its offset changes (or anywhere)."""
    zone = draw(st.sampled_from(ZONES))
    if draw(st.booleans()):
        return zone, draw(st.integers(START + 86_400_000 * 400, END))
    change = draw(st.sampled_from(transitions(zone)))
    return zone, change + draw(st.integers(-4 * 3_600_000, 4 * 3_600_000))


@settings(max_examples=600, deadline=None)
@given(where=near_a_change(), window=st.sampled_from(WINDOWS), retention=st.integers(1, 5))
def test_every_instant_has_one_period_named_by_its_id(where, window, retention):
    zone, ts = where
    tz = ZoneInfo(zone)
    period = period_at(window, ts, tz)
    assert period is not None
    assert period.start_ms <= ts < period.end_ms
    assert parse_period(window, period.id, tz) == period
    assert period.reusable_for(ts) or period.reuse_until == 0
    if period.reuse_until:  # reusable over a span: every instant in it has this period
        for probe in (
            period.reuse_from,
            period.reuse_until - 1,
            (period.reuse_from + period.reuse_until) // 2,
        ):
            assert period_at(window, probe, tz) == period
    before = previous_period(window, period, tz)
    assert before is not None
    assert before.id < period.id  # ids sort in time order
    assert period_at(window, period.start_ms - 1, tz) == before
    expire = expire_at_ms(window, period, retention, tz)
    assert expire >= period.end_ms
    assert expire_at_ms(window, period, retention + 1, tz) >= expire


@settings(max_examples=200, deadline=None)
@given(
    where=near_a_change(),
    window=st.sampled_from(WINDOWS),
    steps=st.lists(st.integers(0, 40 * 60_000), min_size=1, max_size=30),
)
def test_the_cache_agrees_with_the_math_on_a_stream(where, window, steps):
    zone, ts = where
    ts -= 3 * 3_600_000
    tz = ZoneInfo(zone)
    cache = PeriodCache(tz)
    for step in steps:
        ts = min(ts + step, END)
        assert cache.at(window, ts) == period_at(window, ts, tz)


@settings(max_examples=300, deadline=None)
@given(
    where=near_a_change(),
    window=st.sampled_from(WINDOWS),
    retention=st.integers(1, 6),
    ahead=st.integers(0, 5 * 3_600_000),
)
def test_recent_periods_are_exactly_those_not_expired(where, window, retention, ahead):
    zone, now = where
    tz = ZoneInfo(zone)
    got = [(p.id, expire) for p, expire in recent_periods(window, retention, now, now + ahead, tz)]
    # from 3 h later: a DST change that repeats local times lets a later id start earlier
    expected, period = [], period_at(window, now + ahead + 3 * 3_600_000, tz)
    for _ in range(retention + 16 + ahead // 900_000):  # no period further back is kept
        assert period is not None
        kept = expire_at_ms(window, period, retention, tz) > now and period.end_ms > START  # 2000
        if period.start_ms <= now + ahead and kept:
            expected.append((period.id, expire_at_ms(window, period, retention, tz)))
        period = previous_period(window, period, tz)
    assert got == expected
