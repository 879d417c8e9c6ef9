"""apply.lua on its own, against real Redis, through the Applier that builds its calls."""

from __future__ import annotations

import random
import time

import pytest

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.apply import ApplyScript
from common.store.encoding import MemberState, Status, decode_member, tie_mode
from common.store.guarded import GuardedScript
from common.store.keys import BoardKeys
from tests.redis_layout import read_general
from worker.apply import Applier

pytestmark = pytest.mark.integration

CONFIG = """
timezone: UTC
types:
  desc_first: {windows: [total, day], tie_break: first}
  desc_last: {windows: [total], tie_break: last}
  asc_first: {windows: [total], order: asc}
  capped: {windows: [total], max_members: 3}
  capped_asc: {windows: [total], max_members: 2, order: asc}
hot:
  - {board: "desc_first:hot", windows: [total]}
"""
NOW = 1_795_327_200_000  # 2026-11-22T06:00Z, a fixed clock so periods are deterministic
_counter = iter(range(10**9))


def ev(board: str, member: str, score: float, op: Op = Op.INCR, eid: str | None = None) -> UpdateEvent:
    return UpdateEvent(
        id=eid or f"e{next(_counter)}",
        board=board,
        board_type=board.split(":", maxsplit=1)[0],
        member=member,
        op=op,
        score=float(score),
        ts=None,
        meta=None,
    )


@pytest.fixture
def applier(settings, rclient):
    return Applier(rclient, parse_boards(CONFIG), settings.key_prefix, 60_000, now_ms=lambda: NOW)


def ranking(rclient, settings, board: str, instance: str = "total") -> list[tuple[str, float]]:
    boards = parse_boards(CONFIG)
    board_type = boards.type_for(board.split(":", maxsplit=1)[0])
    assert board_type is not None
    key = BoardKeys(settings.key_prefix, board).rank(instance)
    desc = board_type.order.value == "desc"
    rows = (
        rclient.zrevrange(key, 0, -1, withscores=True)
        if desc
        else rclient.zrange(key, 0, -1, withscores=True)
    )
    return [(decode_member(tie_mode(board_type), m.decode()), s) for m, s in rows]


def test_ties_desc_first_earlier_ranks_higher(applier, rclient, settings):
    b = "desc_first:r"
    applier.apply([(ev(b, "late", 10), NOW + 5), (ev(b, "early", 10), NOW + 1), (ev(b, "top", 11), NOW + 9)])
    assert ranking(rclient, settings, b) == [("top", 11), ("early", 10), ("late", 10)]
    # reaching the same score later moves you behind; an unchanged score keeps your time
    applier.apply(
        [(ev(b, "early", 0), NOW + 20), (ev(b, "early", 1), NOW + 21), (ev(b, "early", -1), NOW + 22)]
    )
    assert ranking(rclient, settings, b) == [("top", 11), ("late", 10), ("early", 10)]


def test_ties_desc_last_and_asc_first(applier, rclient, settings):
    applier.apply([(ev("desc_last:r", "a", 5), NOW + 1), (ev("desc_last:r", "b", 5), NOW + 2)])
    assert ranking(rclient, settings, "desc_last:r") == [("b", 5), ("a", 5)]
    applier.apply([(ev("asc_first:r", "a", 5), NOW + 2), (ev("asc_first:r", "b", 5), NOW + 1)])
    applier.apply([(ev("asc_first:r", "c", 1), NOW + 3)])
    assert ranking(rclient, settings, "asc_first:r") == [("c", 1), ("b", 5), ("a", 5)]


def test_set_best_delete_and_meta(applier, rclient, settings):
    b = "desc_first:ops"
    meta = UpdateEvent("m1", b, "desc_first", "x", Op.SET, 7.0, None, b'{"name":"X"}')
    applier.apply([(meta, NOW), (ev(b, "y", 3, Op.BEST), NOW), (ev(b, "y", 2, Op.BEST), NOW)])
    assert ranking(rclient, settings, b) == [("x", 7), ("y", 3)]
    assert rclient.hget(BoardKeys(settings.key_prefix, b).meta, "x") == b'{"name":"X"}'
    applier.apply([(ev(b, "x", 0, Op.DELETE), NOW), (ev(b, "y", 4.5, Op.BEST), NOW)])
    assert ranking(rclient, settings, b) == [("y", 4.5)]
    assert rclient.hget(BoardKeys(settings.key_prefix, b).meta, "x") is None


def test_duplicate_changes_nothing_and_returns_current_state(applier, rclient, settings):
    b = "desc_first:hot"
    first = applier.apply([(ev(b, "m", 5, eid="same"), NOW + 1), (ev(b, "m", 2), NOW + 2)])
    assert [o.status for o in first] == [Status.APPLIED, Status.APPLIED]
    again = applier.apply([(ev(b, "m", 5, eid="same"), NOW + 3)])
    assert again[0].status is Status.DUPLICATE
    assert again[0].seq == 2
    assert again[0].states == {
        "total": MemberState(7.0, NOW + 2),
        "day:2026-11-22": MemberState(7.0, NOW + 2),
    }
    assert ranking(rclient, settings, b) == [("m", 7)]


def test_score_out_of_range_changes_nothing(applier, rclient, settings):
    b = "desc_first:big"
    ok = applier.apply([(ev(b, "m", 2**53 - 1), NOW)])
    assert ok[0].status is Status.APPLIED
    over = applier.apply([(ev(b, "m", 2, eid="over"), NOW)])
    assert over[0].status is Status.OUT_OF_RANGE
    assert ranking(rclient, settings, b) == [("m", 2**53 - 1)]
    # not remembered as applied: the same id is refused again, not silently swallowed
    assert applier.apply([(ev(b, "m", 2, eid="over"), NOW)])[0].status is Status.OUT_OF_RANGE


@pytest.mark.parametrize("board", ["capped:r", "capped_asc:r"])
def test_max_members_keeps_the_exact_top_and_every_score(applier, rclient, settings, board):
    rng = random.Random(3)
    model: dict[str, float] = {}
    for step in range(400):
        member, delta = f"m{rng.randrange(12)}", rng.randint(-30, 30)
        op = Op.DELETE if rng.random() < 0.05 else Op.INCR
        applier.apply([(ev(board, member, delta, op), NOW + step)])
        if op is Op.DELETE:
            model.pop(member, None)
        else:
            model[member] = model.get(member, 0) + delta
    keys = BoardKeys(settings.key_prefix, board)
    cap = 3 if board == "capped:r" else 2
    desc = board == "capped:r"
    top = ranking(rclient, settings, board)
    assert len(top) == min(cap, len(model))
    best = sorted(model.values(), reverse=desc)[:cap]
    assert [s for _, s in top] == best
    states = read_general(rclient, keys.tag, "total", not desc, "first")
    assert {member: score for member, (score, _) in states.items()} == model
    assert rclient.zcard(keys.rank("total")) + rclient.zcard(keys.overflow("total")) == len(model)


def test_period_keys_expire_and_late_events_skip_closed_periods(applier, rclient, settings):
    b = "desc_first:p"
    day_ms = 86_400_000
    out = applier.apply([(ev(b, "m", 1), NOW), (ev(b, "m", 1), NOW - 3 * day_ms)])
    assert [o.late_windows for o in out] == [0, 1]
    keys = BoardKeys(settings.key_prefix, b)
    day = rclient.zrevrange(keys.rank("day:2026-11-22"), 0, -1, withscores=True)
    assert [s for _, s in day] == [1.0]
    assert ranking(rclient, settings, b) == [("m", 2)]
    assert rclient.ttl(keys.rank("total")) == -1
    ttl_s = rclient.pttl(keys.rank("day:2026-11-22")) / 1000
    # day retention defaults to 31 days from the period's start (a real clock, so a range)
    expected = (1_795_305_600_000 + 31 * day_ms) / 1000 - time.time()
    assert abs(ttl_s - expected) < 60
    # every key of the period expires with it (the state hash too; this type has no overflow)
    day_keys = [k for k in rclient.scan_iter(match=f"{keys.tag}:*:day:*") if rclient.exists(k)]
    assert len(day_keys) == 2
    assert all(abs(rclient.pttl(k) / 1000 - expected) < 60 for k in day_keys)


def test_noscript_fallback_after_script_flush(applier, rclient, settings):
    """Both scripts a worker runs are loaded again after a SCRIPT FLUSH: the guarded writes of
    events it decides, and apply.lua (a worker keeping no board state sends it everything)."""
    rclient.script_flush()
    assert applier.apply([(ev("desc_first:ns", "m", 1), NOW)])[0].status is Status.APPLIED
    assert rclient.script_exists(GuardedScript().lua.sha) == [True]
    rclient.script_flush()
    stateless = Applier(
        rclient, parse_boards(CONFIG), settings.key_prefix, 60_000, now_ms=lambda: NOW, state_cells=0
    )
    assert stateless.apply([(ev("desc_first:ns", "m", 1, eid="again"), NOW)])[0].status is Status.APPLIED
    assert rclient.script_exists(ApplyScript().lua.sha) == [True]


def test_max_members_lowered_on_a_big_board_moves_the_excess_in_one_call(settings, rclient):
    """A board of 5000 members whose type then gets max_members: 10: the next call moves 4990
    members to the overflow zset (more than one Lua unpack() takes) and keeps the order exact."""
    uncapped_boards = parse_boards(CONFIG.replace(", max_members: 3", ""))
    capped_boards = parse_boards(CONFIG.replace("max_members: 3", "max_members: 10"))
    uncapped = Applier(rclient, uncapped_boards, settings.key_prefix, 60_000, now_ms=lambda: NOW)
    capped = Applier(rclient, capped_boards, settings.key_prefix, 60_000, now_ms=lambda: NOW)
    board = f"capped:big{next(_counter)}"
    for start in range(0, 5000, 500):
        uncapped.apply([(ev(board, f"m{i}", i), NOW) for i in range(start, start + 500)])
    capped.apply([(ev(board, "m0", 10_000), NOW)])
    board_type = capped_boards.type_for("capped")
    assert board_type is not None
    keys = BoardKeys(settings.key_prefix, board)
    ranked = rclient.zrevrange(keys.rank("total"), 0, -1, withscores=True)
    assert [decode_member(tie_mode(board_type), m.decode()) for m, _ in ranked] == [
        "m0",
        *[f"m{i}" for i in range(4999, 4990, -1)],
    ]
    assert rclient.zcard(keys.overflow("total")) == 4990
    best_overflow = rclient.zrevrange(keys.overflow("total"), 0, 0, withscores=True)[0][1]
    assert best_overflow == 4990 < ranked[-1][1]


def test_a_packed_hour_takes_an_event_of_a_daylight_saving_gap_off_the_hour(rclient, settings):
    """Pacific/Chatham jumps 02:45 -> 03:45 local on 2027-09-26 (14:00Z): an event at 14:05Z lands
    in the hour `T03`, which starts at 14:15Z, after the event (common/periods.py). A packed
    window counts ties from 2 h before its period's start (common/store/packing.py), so the
    event is applied like any other, not refused as outside its period."""
    config = "timezone: Pacific/Chatham\ntypes:\n  g: {windows: [total, hour], score_range: [0, 1000]}\n"
    ts = 1_821_881_100_000  # 2027-09-25T14:05Z (ahead of the clock: the period's keys must not expire)
    applier = Applier(rclient, parse_boards(config), settings.key_prefix, 60_000, now_ms=lambda: ts + 1)
    event = UpdateEvent("gap-1", "g:x", "g", "m", Op.INCR, 5.0, ts, None)
    (outcome,) = applier.apply([(event, ts)], positions=None)
    assert outcome.status is Status.APPLIED
    keys = BoardKeys(settings.key_prefix, "g:x")
    [hour] = [k.decode().rsplit(":p:", 1)[1] for k in rclient.scan_iter(match=f"{keys.tag}:p:*")]
    assert hour == "hour:2027-09-26T03"
    assert rclient.zcard(keys.rank(hour, True)) == 1
