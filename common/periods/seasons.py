"""Seasons: the `season` window's periods.

Named seasons have explicit start and end instants (the config lists them in time order, without
overlap; between two seasons no season is open). A rule makes season k run `every_days` local
days from local midnight of `anchor + k * every_days`, named `<anchor>+<k>` (k >= 0).

A season is kept `retention` times its own length from its start (retention 1: until it ends),
as a calendar period is kept until the start of the period `retention` after it.
"""

from __future__ import annotations

import bisect
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from common.periods.model import Period, contiguous, epoch_ms, local_of
from common.windows import Season, SeasonRule, Window, WindowKind

# `+` unescaped in a URL's query reads as a space: `period=2026-01-05+3` names season 3 either way
_RULE_ID = re.compile(r"^(\d{4}-\d{2}-\d{2})[+ ](\d{1,9})$")


def _named(season: Season) -> Period:
    return contiguous(Period(WindowKind.SEASON, season.name, season.start_ms, season.end_ms))


def _ruled(rule: SeasonRule, k: int, tz: ZoneInfo) -> Period:
    start = datetime.combine(rule.anchor + timedelta(days=k * rule.every_days), datetime.min.time())
    end = start + timedelta(days=rule.every_days)
    name = f"{rule.anchor.isoformat()}+{k}"
    return contiguous(Period(WindowKind.SEASON, name, epoch_ms(start, tz), epoch_ms(end, tz)))


def season_index(rule: SeasonRule, ts_ms: int, tz: ZoneInfo) -> int:
    """k of the season holding the local date of `ts_ms` (negative before the anchor)."""
    days = (local_of(ts_ms, tz).date() - rule.anchor).days
    return days // rule.every_days


def _started(window: Window, ts_ms: int) -> int:
    """How many of the named seasons start at or before `ts_ms`."""
    return bisect.bisect_right([season.start_ms for season in window.seasons], ts_ms)


def named_periods(window: Window) -> list[Period]:
    """The named seasons as periods, in time order."""
    return [_named(season) for season in window.seasons]


def period_at(window: Window, ts_ms: int, tz: ZoneInfo) -> Period | None:
    """The season open at `ts_ms`; None between seasons (or before the first)."""
    latest = latest_at(window, ts_ms, tz)  # ruled seasons follow each other without a gap
    return latest if latest is not None and ts_ms < latest.end_ms else None


def gap_around(window: Window, ts_ms: int, tz: ZoneInfo) -> tuple[int, int]:
    """[from, until): the stretch between seasons holding `ts_ms` (which no season holds)."""
    if window.rule is not None:  # before the first season: from the start of time
        return 0, _ruled(window.rule, 0, tz).start_ms
    at = _started(window, ts_ms)
    after = window.seasons[at].start_ms if at < len(window.seasons) else 2**62
    return (window.seasons[at - 1].end_ms if at else 0), after


def latest_at(window: Window, ts_ms: int, tz: ZoneInfo) -> Period | None:
    """The last season that started at or before `ts_ms` (open or not)."""
    if window.rule is not None:
        k = season_index(window.rule, ts_ms, tz)
        return None if k < 0 else _ruled(window.rule, k, tz)
    at = _started(window, ts_ms) - 1
    return None if at < 0 else _named(window.seasons[at])


def parse_period(window: Window, period_id: str, tz: ZoneInfo) -> Period:
    if window.rule is not None:
        match = _RULE_ID.match(period_id)
        anchor = window.rule.anchor.isoformat()
        if match is None or match[1] != anchor:
            raise ValueError(f"{period_id!r} is not a season id ({anchor}+<k>)")
        try:
            return _ruled(window.rule, int(match[2]), tz)
        except (ValueError, OverflowError):
            raise ValueError(f"{period_id!r} lies beyond the calendar") from None
    for season in window.seasons:
        if season.name == period_id:
            return _named(season)
    names = ", ".join(season.name for season in window.seasons)
    raise ValueError(f"{period_id!r} is not a season of this board type ({names})")


def previous(window: Window, period: Period, tz: ZoneInfo) -> Period | None:
    if window.rule is not None:
        match = _RULE_ID.match(period.id)
        assert match is not None
        k = int(match[2])
        return None if k == 0 else _ruled(window.rule, k - 1, tz)
    names = [season.name for season in window.seasons]
    at = names.index(period.id)
    return None if at == 0 else _named(window.seasons[at - 1])


def expire_at_ms(window: Window, period: Period, retention: int, tz: ZoneInfo) -> int:
    if window.rule is not None:
        match = _RULE_ID.match(period.id)
        assert match is not None
        last = _ruled(window.rule, int(match[2]) + retention - 1, tz)
        return last.end_ms
    return period.start_ms + retention * (period.end_ms - period.start_ms)
