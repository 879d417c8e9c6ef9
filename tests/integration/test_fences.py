"""apply.lua's offset fences and id window, against real Redis: what a redelivery and a producer
retry do, what a recreated topic, another epoch and the previous release's boards do, and that
the id window's buckets stay compact and exact however many ids a board holds."""

from __future__ import annotations

import time
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.idwindow import fingerprint, key_ttl_ms
from common.store.advance import raise_applied
from common.store.encoding import Status
from common.store.keys import BoardKeys
from tests.helpers import wait_for
from tests.redis_layout import read_general
from worker.apply import Applier, EpochMismatch, Position, Source

pytestmark = pytest.mark.integration

CONFIG = "types:\n  gift: {windows: [total]}\n"
NOW = int(time.time() * 1000)
SRC = Source("update_rank", 0, "topic-a", -1)
_ids = iter(range(10**9))


def ev(member: str = "m", score: float = 1, eid: str | None = None, op: Op = Op.INCR) -> UpdateEvent:
    return UpdateEvent(eid or f"e{next(_ids)}", "gift:r", "gift", member, op, float(score), None, None)


def at(offset: int, index: int | None = None, source: Source = SRC) -> Position:
    return Position(source, offset, index)


@pytest.fixture
def applier(rclient, settings) -> Applier:
    return Applier(rclient, parse_boards(CONFIG), settings.key_prefix, 3600, epoch="E1")


def score(rclient, settings, member: str = "m") -> float | None:
    """The member's exact score (tests/redis_layout.py reads the tie index and zsets)."""
    state = read_general(rclient, BoardKeys(settings.key_prefix, "gift:r").tag, "total", False, "first").get(
        member
    )
    return None if state is None else state[0]


def statuses(applier: Applier, events: list[UpdateEvent], positions: list[Position | None]) -> list[Status]:
    return [o.status for o in applier.apply([(e, NOW) for e in events], positions)]


def test_a_redelivery_changes_nothing_however_old(applier, rclient, settings):
    first = [ev(score=2), ev(score=3)]
    assert statuses(applier, first, [at(10, 0), at(10, 1)]) == [Status.APPLIED] * 2
    assert statuses(applier, [ev(score=5)], [at(11)]) == [Status.APPLIED]
    # the same positions again, even with ids the window never saw: the fence alone decides
    assert statuses(applier, [ev(score=2), ev(score=3)], [at(10, 0), at(10, 1)]) == [Status.REDELIVERED] * 2
    assert statuses(applier, [ev(score=9)], [at(3)]) == [Status.REDELIVERED]
    assert score(rclient, settings) == 10
    # the next position is new
    assert statuses(applier, [ev(score=1)], [at(11, 0)]) == [Status.APPLIED]
    assert score(rclient, settings) == 11


def test_a_redelivered_rejection_is_reported_again_until_committed(applier, rclient, settings):
    applier.apply([(ev(score=2**53 - 2), NOW)], [at(1)])
    events = [ev(score=5), ev(score=-1)]
    assert statuses(applier, events, [at(2, 0), at(2, 1)]) == [Status.OUT_OF_RANGE, Status.APPLIED]
    assert statuses(applier, events, [at(2, 0), at(2, 1)]) == [Status.OUT_OF_RANGE, Status.REDELIVERED]
    assert score(rclient, settings) == 2**53 - 3
    # once the worker committed past it, the rejection is forgotten (offsets below are never redelivered)
    committed = Source(SRC.topic, SRC.partition, SRC.topic_id, 2)
    applier.apply([(ev(score=1), NOW)], [at(3, source=committed)])
    fence = rclient.hgetall(BoardKeys(settings.key_prefix, "gift:r").fence)
    assert b"update_rank:0!r" not in fence
    assert fence[b"update_rank:0"] == b"topic-a|3|0"


def test_a_redelivered_event_that_raised_is_failed_again(applier, rclient, settings):
    marker = ev(member="ResponseError", op=Op.FAILED_MARKER)
    assert statuses(applier, [marker], [at(4)]) == [Status.FAILED]
    outcomes = applier.apply([(ev(score=7), NOW), (ev(score=1), NOW)], [at(4), at(5)])
    assert [(o.status, o.failed_as) for o in outcomes] == [
        (Status.FAILED, "ResponseError"),
        (Status.APPLIED, None),
    ]
    assert score(rclient, settings) == 1


def test_a_recreated_topic_starts_its_fences_over(applier, rclient, settings):
    assert statuses(applier, [ev()], [at(100)]) == [Status.APPLIED]
    recreated = Source(SRC.topic, SRC.partition, "topic-b", -1)
    assert (
        statuses(applier, [ev(), ev()], [at(0, source=recreated), at(1, source=recreated)])
        == [Status.APPLIED] * 2
    )
    assert score(rclient, settings) == 3


def test_each_source_partition_has_its_own_fence(applier, rclient, settings):
    other = Source(SRC.topic, 1, SRC.topic_id, -1)
    assert statuses(applier, [ev(), ev()], [at(50), at(7, source=other)]) == [Status.APPLIED] * 2
    assert statuses(applier, [ev(), ev()], [at(8, source=other), at(49)]) == [
        Status.APPLIED,
        Status.REDELIVERED,
    ]


WINDOW_S = 5


def test_producer_duplicates_within_the_window_and_after_it(applier, rclient, settings):
    # the window is counted in whole seconds of Redis' clock: 5 s leave the duplicates below 4
    # whole seconds to arrive in, whichever second the first applied in
    applier_5s = Applier(rclient, parse_boards(CONFIG), settings.key_prefix, WINDOW_S, epoch="E1")
    assert statuses(applier_5s, [ev(eid="x"), ev(eid="y")], [at(0), at(1)]) == [Status.APPLIED] * 2
    assert statuses(applier_5s, [ev(eid="x"), ev(eid="x")], [at(2), at(3)]) == [Status.DUPLICATE] * 2
    bucket = f"{BoardKeys(settings.key_prefix, 'gift:r').id_window}:0:0"
    applied = int(rclient.zscore(bucket, fingerprint("x")) or 0)
    wait_for(lambda: int(rclient.time()[0]) - applied >= WINDOW_S, 30, "Redis' clock past the window")
    assert statuses(applier_5s, [ev(eid="x")], [at(4)]) == [Status.APPLIED]
    assert score(rclient, settings) == 3
    # the bucket's next write dropped what left the window: only x, applied again, is left
    assert rclient.zrange(bucket, 0, -1) == [fingerprint("x")]


def test_a_board_of_another_epoch_is_refused(applier, rclient, settings):
    applier.apply([(ev(), NOW)], [at(1)])
    applier.epoch = "E2"
    with pytest.raises(EpochMismatch, match="epoch E1"):
        applier.apply([(ev(), NOW)], [at(2)])
    assert score(rclient, settings) == 1


def test_the_previous_releases_id_records_are_honoured_while_adopting(applier, rclient, settings):
    keys = BoardKeys(settings.key_prefix, "gift:r")
    rclient.set(keys.legacy_id("old"), "1", px=60_000)  # what the previous release left
    applier.legacy_ttl_ms = 60_000
    assert statuses(applier, [ev(eid="old"), ev(eid="new")], [at(1), at(2)]) == [
        Status.DUPLICATE,
        Status.APPLIED,
    ]
    assert (
        0 < rclient.pttl(keys.legacy_id("new")) <= 60_000
    )  # a previous-release worker still running sees it
    applier.legacy_ttl_ms = 0
    assert statuses(applier, [ev(eid="new")], [at(3)]) == [Status.DUPLICATE]  # the id window has it too


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rounds=st.lists(st.lists(st.integers(0, 3000), min_size=100, max_size=500), min_size=2, max_size=5),
    cap=st.sampled_from([2, 5, 128]),
)
def test_the_id_window_is_exact_through_bucket_splits(rclient, settings, rounds, cap):
    """Ids drawn with repeats, applied in calls: each is applied the first time only, whatever
    the buckets split into (a small cap forces deep splits); every bucket stays within the cap
    (listpack) unless all its ids share one slot value (no split can separate them)."""
    prefix = f"{settings.key_prefix}w{next(_ids)}:"
    applier = Applier(rclient, parse_boards(CONFIG), prefix, 3600, epoch="E1")
    applier.listpack_cap = cap
    seen: set[int] = set()
    for ids in rounds:
        events = [ev(eid=f"id-{i}") for i in ids]
        expected: list[Status] = []
        for i in ids:
            expected.append(Status.DUPLICATE if i in seen else Status.APPLIED)
            seen.add(i)
        assert statuses(applier, events, [None] * len(events)) == expected
    window = BoardKeys(prefix, "gift:r").id_window
    buckets = list(rclient.scan_iter(match=f"{window}:*", count=1000))
    stored = {f for b in buckets for f in rclient.zrange(b, 0, -1)}
    assert stored == {fingerprint(f"id-{i}") for i in seen}
    for bucket in buckets:
        fps = cast(list[bytes], rclient.zrange(bucket, 0, -1))
        assert len(fps) <= cap or len({fp[:3] for fp in fps}) == 1, bucket
    assert len(buckets) >= len(seen) / cap  # it did split
    longest = key_ttl_ms(3600)
    assert all(0 < rclient.pttl(k) <= longest for k in [*buckets, *([window] if len(buckets) > 1 else [])])


def test_partition_records_are_only_raised(rclient, settings):
    """worker/sources.py's per-partition records (common/lua/advance.lua): a late writer (a worker
    that lost the partition, accept-redis racing a worker) can't move one back; a recreated
    topic's record replaces the old one."""
    key = f"{settings.key_prefix}{{sources:g}}:t"
    raise_applied(rclient, key, "tid", {0: 10, 1: 5})
    raise_applied(rclient, key, "tid", {0: 7, 1: 6})
    raise_applied(rclient, key, "new-tid", {2: 3})
    raise_applied(rclient, key, "new-tid", {0: 1})
    assert rclient.hgetall(key) == {b"0": b"new-tid|1", b"1": b"tid|6", b"2": b"new-tid|3"}


def test_fences_hold_at_offsets_beyond_lua_number_text(applier, rclient, settings):
    """Offsets of 10^15 and more (Lua prints 1e+15): the fence and the rejection list stay exact."""
    big = 10**15 + 7
    applier.apply([(ev(score=2**53 - 2), NOW)], [at(big)])
    events = [ev(score=5), ev(score=-1)]
    assert statuses(applier, events, [at(big + 1, 0), at(big + 1, 1)]) == [
        Status.OUT_OF_RANGE,
        Status.APPLIED,
    ]
    again = statuses(applier, events, [at(big + 1, 0), at(big + 1, 1)])
    assert again == [Status.OUT_OF_RANGE, Status.REDELIVERED]
    assert statuses(applier, [ev(score=1)], [at(big + 2)]) == [Status.APPLIED]
    assert score(rclient, settings) == 2**53 - 2
    fence = rclient.hgetall(BoardKeys(settings.key_prefix, "gift:r").fence)
    assert fence[b"update_rank:0"] == f"topic-a|{big + 2}|0".encode()
    assert fence[b"update_rank:0!r"] == f"{big + 1}:1".encode()
