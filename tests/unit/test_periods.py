from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from common.periods import (
    Period,
    PeriodCache,
    expire_at_ms,
    no_period_span,
    parse_period,
    period_at,
    previous_period,
    recent_periods,
)
from common.windows import Season, SeasonRule, Window, WindowKind, parse_window

SH = ZoneInfo("Asia/Shanghai")
NY = ZoneInfo("America/New_York")
HOUR, DAY, WEEK, MONTH, YEAR = (
    Window(k.value, k)
    for k in (WindowKind.HOUR, WindowKind.DAY, WindowKind.WEEK, WindowKind.MONTH, WindowKind.YEAR)
)


def ms(text: str, tz: ZoneInfo = SH) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=tz).timestamp() * 1000)


@pytest.mark.parametrize(
    ("kind", "instant", "pid", "start", "end"),
    [
        (HOUR, "2026-11-22 13:59:59", "2026-11-22T13", "2026-11-22 13:00", "2026-11-22 14:00"),
        (DAY, "2026-11-22 00:00:00", "2026-11-22", "2026-11-22 00:00", "2026-11-23 00:00"),
        (WEEK, "2026-11-22 23:00:00", "2026-W47", "2026-11-16 00:00", "2026-11-23 00:00"),
        (WEEK, "2027-01-01 08:00:00", "2026-W53", "2026-12-28 00:00", "2027-01-04 00:00"),
        (MONTH, "2026-12-31 23:59:59", "2026-12", "2026-12-01 00:00", "2027-01-01 00:00"),
        (YEAR, "2026-06-01 00:00:00", "2026", "2026-01-01 00:00", "2027-01-01 00:00"),
    ],
)
def test_period_at_and_parse_agree(kind, instant, pid, start, end):
    period = at(kind, ms(instant), SH)
    assert (period.id, period.start_ms, period.end_ms) == (pid, ms(start), ms(end))
    assert parse_period(kind, pid, SH) == period


def test_periods_follow_the_configured_zone():
    # 2026-11-22 20:00 UTC is already the 23rd in Shanghai
    instant = ms("2026-11-22 20:00:00", ZoneInfo("UTC"))
    assert at(DAY, instant, SH).id == "2026-11-23"
    assert at(DAY, instant, ZoneInfo("UTC")).id == "2026-11-22"


@pytest.mark.parametrize(
    ("kind", "bad"),
    [(DAY, "2026-13-01"), (DAY, "2026-11"), (WEEK, "2026-W54"),
     (HOUR, "2026-11-22T24"), (MONTH, "26-11"), (YEAR, "all")],
)  # fmt: skip
def test_bad_period_ids_are_refused(kind, bad):
    with pytest.raises(ValueError, match=r"is not a \w+ period id"):
        parse_period(kind, bad, SH)


def test_expiry_keeps_retention_periods():
    day = parse_period(DAY, "2026-11-22", SH)
    assert expire_at_ms(DAY, day, 31, SH) == ms("2026-12-23 00:00")
    month = parse_period(MONTH, "2026-11", SH)
    assert expire_at_ms(MONTH, month, 12, SH) == ms("2027-11-01 00:00")


def test_period_cache_matches_the_uncached_math():
    cache = PeriodCache(SH)
    start = ms("2026-11-22 22:30:00")
    for step in range(0, 4 * 3600 * 1000, 7 * 60 * 1000):
        for window in (HOUR, DAY, parse_window("30min")):
            assert cache.at(window, start + step) == period_at(window, start + step, SH)


THIRTY = parse_window("30min")


def at(window: Window, ts_ms: int, tz: ZoneInfo) -> Period:
    found = period_at(window, ts_ms, tz)
    assert found is not None
    return found


def before(window: Window, period: Period, tz: ZoneInfo) -> Period:
    found = previous_period(window, period, tz)
    assert found is not None
    return found


TWO_H = parse_window("2h")


def test_fixed_periods_align_to_local_midnight():
    period = period_at(THIRTY, ms("2026-11-22 13:45:00"), SH)
    assert period is not None
    assert (period.id, period.start_ms, period.end_ms) == (
        "2026-11-22T13:30",
        ms("2026-11-22 13:30"),
        ms("2026-11-22 14:00"),
    )
    assert parse_period(THIRTY, "2026-11-22T13:30", SH) == period
    two = period_at(TWO_H, ms("2026-11-22 13:45:00"), SH)
    assert two is not None and two.id == "2026-11-22T12:00"
    assert before(THIRTY, parse_period(THIRTY, "2026-11-22T00:00", SH), SH).id == "2026-11-21T23:30"


@pytest.mark.parametrize("bad", ["2026-11-22T13:15", "2026-11-22T13", "2026-11-22T24:00", "2026-13-01T00:00"])
def test_bad_fixed_ids_are_refused(bad):
    with pytest.raises(ValueError, match="period"):
        parse_period(THIRTY, bad, SH)


@pytest.mark.parametrize("name", ["7min", "0min", "05min", "5h", "25h", "1440min0"])
def test_fixed_lengths_must_divide_a_day(name):
    with pytest.raises(ValueError, match=r"divide 24 h|unknown window"):
        parse_window(name)


def test_fixed_periods_at_the_autumn_change_keep_a_repeated_time_in_one_period():
    # New York, 2026-11-01: 01:00-02:00 happens twice (EDT, then EST)
    first = int(datetime(2026, 11, 1, 1, 10, tzinfo=NY).timestamp() * 1000)
    second = int(datetime(2026, 11, 1, 1, 10, fold=1, tzinfo=NY).timestamp() * 1000)
    assert second - first == 3_600_000
    a, b = period_at(THIRTY, first, NY), period_at(THIRTY, second, NY)
    assert a == b and a is not None and a.id == "2026-11-01T01:00"
    assert a.start_ms == first - 600_000 and a.end_ms == second + 20 * 60_000  # to 01:30 EST
    middle = period_at(THIRTY, first + 30 * 60_000, NY)  # 01:40 EDT
    assert middle is not None and middle.id == "2026-11-01T01:30"
    cache = PeriodCache(NY)
    for step in range(0, 4 * 3_600_000, 60_000):
        ts = first - 3_600_000 + step
        assert cache.at(THIRTY, ts) == period_at(THIRTY, ts, NY)


def test_fixed_periods_skipped_by_the_spring_change_do_not_exist():
    # New York, 2026-03-08: 02:00-03:00 does not happen
    with pytest.raises(ValueError, match="skips"):
        parse_period(THIRTY, "2026-03-08T02:30", NY)
    three = parse_period(THIRTY, "2026-03-08T03:00", NY)
    assert before(THIRTY, three, NY).id == "2026-03-08T01:30"
    # retention counts periods that exist: the 4th after 01:00 (01:30, 03:00, 03:30, 04:00) starts at 04:00
    one = parse_period(THIRTY, "2026-03-08T01:00", NY)
    assert expire_at_ms(THIRTY, one, 4, NY) == int(datetime(2026, 3, 8, 4, 0, tzinfo=NY).timestamp() * 1000)


NAMED = Window(
    "season",
    WindowKind.SEASON,
    seasons=(
        Season("s1", ms("2026-09-01 00:00"), ms("2026-10-01 00:00")),
        Season("s2", ms("2026-10-15 00:00"), ms("2026-12-01 00:00")),
    ),
)
RULED = Window("season", WindowKind.SEASON, rule=SeasonRule(28, datetime(2026, 1, 5).date()))


def test_named_seasons_and_the_gap_between_them():
    assert at(NAMED, ms("2026-09-30 23:59:59"), SH).id == "s1"
    assert period_at(NAMED, ms("2026-10-01 00:00"), SH) is None
    assert period_at(NAMED, ms("2026-08-31 00:00"), SH) is None
    s2 = parse_period(NAMED, "s2", SH)
    assert before(NAMED, s2, SH).id == "s1"
    assert previous_period(NAMED, parse_period(NAMED, "s1", SH), SH) is None
    assert expire_at_ms(NAMED, s2, 2, SH) == s2.start_ms + 2 * (s2.end_ms - s2.start_ms)
    with pytest.raises(ValueError, match="not a season"):
        parse_period(NAMED, "s3", SH)


def test_seasons_every_n_days_from_an_anchor():
    period = period_at(RULED, ms("2026-02-02 00:00"), SH)
    assert period is not None and period.id == "2026-01-05+1"
    assert (period.start_ms, period.end_ms) == (ms("2026-02-02 00:00"), ms("2026-03-02 00:00"))
    assert period_at(RULED, ms("2026-01-04 23:59"), SH) is None
    assert parse_period(RULED, "2026-01-05+1", SH) == period
    assert before(RULED, period, SH).id == "2026-01-05+0"
    for bad in ("2026-01-06+1", "2026-01-05-1", "2026-01-05+999999999"):
        with pytest.raises(ValueError, match=r"season id|beyond the calendar"):
            parse_period(RULED, bad, SH)


def test_recent_periods_are_those_not_expired_up_to_the_latest_event_time():
    now = ms("2026-11-22 13:45")
    got = [p for p, _ in recent_periods(THIRTY, 4, now, now + 3_600_000, SH)]
    assert [p.id for p in got] == [
        "2026-11-22T14:30",
        "2026-11-22T14:00",
        "2026-11-22T13:30",
        "2026-11-22T13:00",
        "2026-11-22T12:30",
        "2026-11-22T12:00",  # expires at 14:00: four periods after it
    ]
    assert [
        p.id for p, _ in recent_periods(NAMED, 4, ms("2026-10-05 00:00"), ms("2026-10-06 00:00"), SH)
    ] == ["s1"]


def test_the_stretch_between_seasons_holds_no_season():
    for window in (NAMED, RULED):
        for instant in ("2026-10-01 00:00", "2026-10-10 12:00", "2026-10-14 23:59:59", "2025-12-31 00:00"):
            ts = ms(instant)
            if period_at(window, ts, SH) is not None:
                continue
            low, high = no_period_span(window, ts, SH)
            assert low <= ts < high
            assert period_at(window, low, SH) is None and period_at(window, high - 1, SH) is None
            assert high == 2**62 or period_at(window, high, SH) is not None
    assert no_period_span(NAMED, ms("2026-10-05 00:00"), SH) == (
        ms("2026-10-01 00:00"),
        ms("2026-10-15 00:00"),
    )


def test_recent_named_seasons_include_a_long_one_kept_after_a_short_one_expired():
    long_short = Window(
        "season",
        WindowKind.SEASON,
        seasons=(
            Season("long", ms("2027-01-01 00:00"), ms("2027-04-01 00:00")),
            Season("short", ms("2027-04-02 00:00"), ms("2027-04-03 00:00")),
        ),
    )
    got = recent_periods(long_short, 4, ms("2027-04-10 00:00"), ms("2027-04-11 00:00"), SH)
    assert [(p.id, expire) for p, expire in got] == [("long", ms("2027-01-01 00:00") + 4 * 90 * 86_400_000)]


def test_recent_periods_stay_linear_and_after_2000_at_the_largest_retentions():
    now = ms("2027-04-10 00:00")
    assert len(recent_periods(DAY, 36_600, now, now, SH)) == (now - ms("2000-01-01 00:00")) // 86_400_000 + 1
    hours = recent_periods(HOUR, 9_600, now, now + 86_400_000, SH)
    assert len(hours) == 9_600 + 24
    assert all(expire == expire_at_ms(HOUR, p, 9_600, SH) for p, expire in hours[::997])


def test_the_last_fixed_period_of_the_calendar_is_a_bad_id():
    with pytest.raises(ValueError, match="period id"):
        parse_period(THIRTY, "9999-12-31T23:30", SH)
