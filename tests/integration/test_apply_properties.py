"""Property tests: the whole space of update events the contract accepts (docs/contract.md §2-3),
through the real apply path (`parse_message` -> `Applier.apply_isolated` -> apply.lua) on real
Redis, compared with an independent model after every stream.

The model shares no code with the product. Period ids come from `datetime` and `zoneinfo` by the
local wall clock; a period ends at the first millisecond whose id differs (ids never come back,
so a binary search finds it); a period expires at the start of the period `retention` periods
later, found by stepping from end to end; lateness is `now >= min(end + late_grace, expiry)`.
Ranking is a sort: the board's order on the score, then the tie rule on the time the member got
there, then Redis' bytewise order of the member in the reading direction.

Every example gets its own key prefix (under the test's) and deletes its keys when it passes.
`now` is fixed per example and lies in the future of the real clock: PEXPIREAT works on Redis'
real clock, so a period expiry earlier than the real time would delete the keys at once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast
from zoneinfo import ZoneInfo

import pytest
import redis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from common.events import MAX_BATCH, MIN_TS_MS
from tests.apply_cases import LIMIT_SCORES, cases
from tests.apply_model import (
    BASE_NOW,
    HOUR_MS,
    MAX_ARRAY,
    MIN_TS,
    Case,
    Message,
    TypeSpec,
    _ms,
    local_time,
    offset_changes,
    period_end,
    period_expiry,
    period_id,
    ranking,
    run_case,
)

pytestmark = pytest.mark.integration

# --- the properties -------------------------------------------------------------------------

BASE = hsettings(
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # no explain: slow
    database=None,  # no .hypothesis/ folder in the project; a failure prints its example
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@pytest.fixture
def client(settings, rclient):
    """Like `rclient` (which removes the test's keys afterwards), with room for a slow shared server."""
    slow_ok = redis.Redis.from_url(settings.redis_url.get_secret_value(), socket_timeout=30)
    yield slow_ok
    slow_ok.close()


def test_contract_constants_match_the_product():
    assert MIN_TS == MIN_TS_MS
    assert MAX_BATCH == MAX_ARRAY


def test_model_periods_follow_the_wall_clock():
    """The model's own period math, on instants checked by hand."""
    ny, lhi = ZoneInfo("America/New_York"), ZoneInfo("Australia/Lord_Howe")
    fall = _ms(datetime(2026, 11, 1, 5, 0, tzinfo=UTC))  # 01:00 EDT: the hour repeats
    assert period_id(ny, "hour", fall) == period_id(ny, "hour", fall + HOUR_MS) == "2026-11-01T01"
    assert period_end(ny, "hour", fall) == fall + 2 * HOUR_MS
    spring = _ms(datetime(2026, 3, 8, 6, 0, tzinfo=UTC))  # 01:00 EST: 02:00 is skipped
    assert period_end(ny, "hour", spring) == spring + HOUR_MS
    assert period_id(ny, "hour", spring + HOUR_MS) == "2026-03-08T03"
    assert period_expiry(ny, "hour", spring, 2) == spring + 2 * HOUR_MS  # 01 -> 03 -> 04
    assert period_end(ny, "day", spring) - _ms(datetime(2026, 3, 8, 5, 0, tzinfo=UTC)) == 23 * HOUR_MS
    # Lord Howe, 2026-10-04 02:00 +10:30 -> 02:30 +11: hour 02 lasts 30 minutes
    half = _ms(datetime(2026, 10, 3, 15, 30, tzinfo=UTC))
    assert half in offset_changes("Australia/Lord_Howe")
    assert period_id(lhi, "hour", half) == "2026-10-04T02"
    assert period_end(lhi, "hour", half) == half + 1_800_000
    utc = ZoneInfo("UTC")
    new_year = _ms(datetime(2027, 1, 1, tzinfo=UTC))
    assert period_id(utc, "week", new_year - 1) == "2026-W53"
    assert period_end(utc, "week", new_year) == _ms(datetime(2027, 1, 4, tzinfo=UTC))
    assert period_expiry(utc, "month", new_year - 1, 3) == _ms(datetime(2027, 3, 1, tzinfo=UTC))
    desc_first = TypeSpec("t", "desc", "first", ("total",), {}, None, "0s")
    assert ranking(desc_first, {"a": (1.0, 5), "b": (1.0, 3), "c": (2.0, 9)}) == ["c", "b", "a"]
    asc_last = TypeSpec("t", "asc", "last", ("total",), {}, None, "0s")
    assert ranking(asc_last, {"a": (1.0, 5), "b": (1.0, 3), "c": (0.5, 9)}) == ["c", "a", "b"]


# --- minimal examples of what the properties found ---------------------------------------------


def _spring_forward(zone: str) -> int:
    """The first instant after BASE_NOW where local time jumps forward (a stretch is skipped)."""
    tz = ZoneInfo(zone)
    return next(
        t
        for t in offset_changes(zone)
        if t > BASE_NOW
        and cast(timedelta, local_time(tz, t).utcoffset())
        > cast(timedelta, local_time(tz, t - 1).utcoffset())
    )


def _one_event_case(zone: str, window: str, retention: int, grace: str, *, now: int, ts: int) -> Case:
    spec = TypeSpec("t0", "desc", "first", (window,), {window: retention}, None, grace)
    event = {"id": "e1", "board": "t0", "member": "m", "score": 1, "ts": ts}
    return Case(zone, now, [spec], None, [[Message(ts, [event], array=False)]])


@pytest.mark.parametrize(("zone", "window"), [("America/Santiago", "day"), ("Australia/Lord_Howe", "hour")])
def test_a_period_starting_at_a_skipped_time_expires_when_the_next_one_starts(zone, window, client, settings):
    """Santiago skips 00:00-01:00 (the day starts at 01:00), Lord Howe 02:00-02:30 (hour 02 lasts
    30 minutes). With retention 1 the period's keys must expire when the next period starts
    (00:00 the next day / 03:00), not a gap's length later (01:00 / 03:30)."""
    start = _spring_forward(zone)
    run_case(_one_event_case(zone, window, 1, "0s", now=start, ts=start), client, settings.key_prefix)


def test_hour_retention_counts_periods_across_a_skipped_hour(client, settings):
    """New York skips 02:00-03:00. Hour 01 with retention 2 is kept until hour 04 starts (01, 03,
    then 04), so an event of hour 01 arriving at 03:30, within its 1h late grace, still counts."""
    jump = _spring_forward("America/New_York")  # 03:00 EDT
    case = _one_event_case("America/New_York", "hour", 2, "1h", now=jump + 1_800_000, ts=jump - 1_800_000)
    run_case(case, client, settings.key_prefix)


@hsettings(BASE, max_examples=300)
@given(case=cases())
def test_any_accepted_stream_matches_the_model(case, settings, client):
    """Every op, board shape, zone, time, meta, id and duplicate the contract accepts (the worker
    deciding, every board's chunk written as a transaction of commands)."""
    run_case(case, client, settings.key_prefix, turns=("native",))


@hsettings(BASE, max_examples=150)
@given(case=cases(max_messages=9))
def test_workers_taking_turns_on_the_same_boards_match_the_model(case, settings, client):
    """Batches taken in turn by two workers that decide events themselves (one writing
    transactions of commands, one through guarded.lua) and one whose Redis decides (a worker of
    the previous release, or a chunk sent to apply.lua): each finds the board changed by the
    others since it last wrote (seq, fence, id window) and must not act on what it kept of it.
    The same source for all: the fence moves under each of them."""
    run_case(case, client, settings.key_prefix, turns=("native", "script", "lua"))


@hsettings(BASE, max_examples=120)
@given(case=cases())
def test_redis_deciding_every_event_matches_the_model(case, settings, client):
    """A worker keeping no board state (RANKSTREAM_WORKER_STATE_CELLS=0): apply.lua decides."""
    run_case(case, client, settings.key_prefix, turns=("lua",))


@hsettings(BASE, max_examples=80)
@given(case=cases(max_messages=8, max_array=6, scores=LIMIT_SCORES, max_types=1, max_pool=2))
def test_scores_at_the_exact_limit_match_the_model(case, settings, client):
    """Few members, scores at ±(2**53-1): increments past the limit are refused and change nothing."""
    run_case(case, client, settings.key_prefix)


# no shrinking: a 500-event case shrinks for minutes, and its failure note already replays it
@hsettings(BASE, max_examples=8, phases=[Phase.explicit, Phase.generate])
@given(case=cases(max_messages=2, array_sizes=st.sampled_from((MAX_ARRAY, MAX_ARRAY - 1, 137)), max_types=2))
def test_full_arrays_match_the_model(case, settings, client):
    """Arrays of the largest accepted size: many chunks per board, applied in stream order."""
    run_case(case, client, settings.key_prefix)
