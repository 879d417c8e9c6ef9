from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from common.boards import WindowKind
from common.periods import PeriodCache, expire_at_ms, parse_period, period_at

SH = ZoneInfo("Asia/Shanghai")


def ms(text: str, tz: ZoneInfo = SH) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=tz).timestamp() * 1000)


@pytest.mark.parametrize(
    ("kind", "instant", "pid", "start", "end"),
    [
        (WindowKind.HOUR, "2026-11-22 13:59:59", "2026-11-22T13", "2026-11-22 13:00", "2026-11-22 14:00"),
        (WindowKind.DAY, "2026-11-22 00:00:00", "2026-11-22", "2026-11-22 00:00", "2026-11-23 00:00"),
        (WindowKind.WEEK, "2026-11-22 23:00:00", "2026-W47", "2026-11-16 00:00", "2026-11-23 00:00"),
        (WindowKind.WEEK, "2027-01-01 08:00:00", "2026-W53", "2026-12-28 00:00", "2027-01-04 00:00"),
        (WindowKind.MONTH, "2026-12-31 23:59:59", "2026-12", "2026-12-01 00:00", "2027-01-01 00:00"),
        (WindowKind.YEAR, "2026-06-01 00:00:00", "2026", "2026-01-01 00:00", "2027-01-01 00:00"),
    ],
)
def test_period_at_and_parse_agree(kind, instant, pid, start, end):
    period = period_at(kind, ms(instant), SH)
    assert (period.id, period.start_ms, period.end_ms) == (pid, ms(start), ms(end))
    assert parse_period(kind, pid, SH) == period


def test_periods_follow_the_configured_zone():
    # 2026-11-22 20:00 UTC is already the 23rd in Shanghai
    instant = ms("2026-11-22 20:00:00", ZoneInfo("UTC"))
    assert period_at(WindowKind.DAY, instant, SH).id == "2026-11-23"
    assert period_at(WindowKind.DAY, instant, ZoneInfo("UTC")).id == "2026-11-22"


@pytest.mark.parametrize(
    ("kind", "bad"),
    [(WindowKind.DAY, "2026-13-01"), (WindowKind.DAY, "2026-11"), (WindowKind.WEEK, "2026-W54"),
     (WindowKind.HOUR, "2026-11-22T24"), (WindowKind.MONTH, "26-11"), (WindowKind.YEAR, "all")],
)  # fmt: skip
def test_bad_period_ids_are_refused(kind, bad):
    with pytest.raises(ValueError, match=r"is not a \w+ period id"):
        parse_period(kind, bad, SH)


def test_expiry_keeps_retention_periods():
    day = parse_period(WindowKind.DAY, "2026-11-22", SH)
    assert expire_at_ms(day, 31, SH) == ms("2026-12-23 00:00")
    month = parse_period(WindowKind.MONTH, "2026-11", SH)
    assert expire_at_ms(month, 12, SH) == ms("2027-11-01 00:00")


def test_period_cache_matches_the_uncached_math():
    cache = PeriodCache(SH)
    start = ms("2026-11-22 22:30:00")
    for step in range(0, 4 * 3600 * 1000, 7 * 60 * 1000):
        for kind in (WindowKind.HOUR, WindowKind.DAY):
            assert cache.at(kind, start + step) == period_at(kind, start + step, SH)
