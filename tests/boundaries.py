"""Calendar boundaries crossed on purpose: which local day, ISO week and month boundaries a span
of event times crosses, worked out from zoneinfo alone (nothing from common/), and the session's
choice for the suites whose services run on the real clock.

The session's boundary. tests/oracle.py's streams (the worker, API, hot-board, erase/reset
suites and those built on them) put their events' times within 45 minutes either side of one
instant B, a local midnight of the boards' zone: B is the exact UTC hour 45 to 105 minutes before
the session began and the zone the whole-hour UTC offset (Etc/GMT±N) whose midnight falls on it.
Every run of those suites crosses a local day boundary, with no event ahead of the clock, events
at most a few hours old (within every late grace), and the services on the real clock.
RANKSTREAM_TEST_BOUNDARY_MS=<B> replays a choice (pytest prints it in its header); B must be an
exact UTC hour. The suites on a simulated clock (periods, rolling windows, period results) cross
weeks and months too, and each asserts what it claims (assert_crosses)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

ENV = "RANKSTREAM_TEST_BOUNDARY_MS"
HOUR_MS = 3_600_000
KINDS = ("day", "week", "month")


@dataclass(frozen=True)
class SessionBoundary:
    at_ms: int  # B: a local midnight of `zone`
    zone: str

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    def describe(self) -> str:
        at = datetime.fromtimestamp(self.at_ms / 1000, UTC)
        return (
            f"calendar boundary: events around {at:%Y-%m-%dT%H:%MZ}, local midnight in {self.zone} "
            f"(replay: {ENV}={self.at_ms})"
        )


def zone_with_midnight_at(at_ms: int) -> str:
    """The fixed-offset zone (whole hours, UTC-12..UTC+14) whose local midnight is `at_ms`."""
    assert at_ms % HOUR_MS == 0, f"{at_ms} is not an exact UTC hour"
    east = -datetime.fromtimestamp(at_ms / 1000, UTC).hour % 24  # hours ahead of UTC
    if east > 14:
        east -= 24
    # POSIX names count the other way: Etc/GMT-8 is UTC+8
    return "Etc/UTC" if east == 0 else f"Etc/GMT{'-' if east > 0 else '+'}{abs(east)}"


@cache
def session_boundary() -> SessionBoundary:
    """The session's choice (once per process): from RANKSTREAM_TEST_BOUNDARY_MS, or the exact UTC
    hour 45 to 105 minutes before now."""
    given = os.environ.get(ENV)
    if given:
        at = int(given)
    else:
        now = int(time.time() * 1000)
        at = (now - 45 * 60_000) // HOUR_MS * HOUR_MS
    return SessionBoundary(at, zone_with_midnight_at(at))


def _starts(tz: ZoneInfo, day: date) -> int:
    """The instant the local date `day` begins."""
    return int(datetime(day.year, day.month, day.day, tzinfo=tz).timestamp() * 1000)


def crossed(tz: ZoneInfo, low_ms: int, high_ms: int) -> set[str]:
    """The kinds of boundary (a local day, an ISO week: a Monday, a month: the 1st) that begin in
    (low_ms, high_ms]."""
    found: set[str] = set()
    day = datetime.fromtimestamp(low_ms / 1000, tz).date() + timedelta(days=1)
    while _starts(tz, day) <= high_ms:
        found.add("day")
        if day.weekday() == 0:
            found.add("week")
        if day.day == 1:
            found.add("month")
        if found == set(KINDS):
            break
        day += timedelta(days=1)
    return found


def assert_crosses(
    what: str, tz: ZoneInfo, times: list[int] | tuple[int, ...], kinds: tuple[str, ...]
) -> None:
    """Fails unless the span of `times` (ms) crosses a boundary of each of `kinds` in `tz`."""
    assert times, f"{what}: no events"
    low, high = min(times), max(times)
    missing = set(kinds) - crossed(tz, low, high)
    span = " to ".join(f"{datetime.fromtimestamp(t / 1000, tz):%Y-%m-%d %H:%M %Z}" for t in (low, high))
    assert not missing, f"{what}: its events ({span}, {tz.key}) cross no {sorted(missing)} boundary"
