"""Each Lua script's typed wrapper on its own, against real Redis (common/store/): the fields go
where the script reads them and the typed reply says what the script did. The scripts' whole
behaviour is tested elsewhere (apply: test_apply_lua.py and the property tests; advance:
test_fences.py; order: test_store_order.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from common.idwindow import fingerprint
from common.store import reads, scan
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript, FenceSource, ForeignEpoch, Instance
from common.store.encoding import TIE_WIDTH, MemberState, Packing, Status, TieMode
from common.store.keys import BoardKeys
from common.store.pipe import RedisPipe

pytestmark = pytest.mark.integration


def request(keys: BoardKeys, events: list[ApplyEvent], **overrides: object) -> ApplyRequest:
    fields: dict[str, object] = {
        "keys": keys,
        "instances": [Instance("total", 0), Instance("day:2026-11-22", 0)],
        "mode": TieMode.INV,
        "desc": True,
        "max_members": 2,
        "want_state": True,
        "epoch": "ep1",
        "id_window_s": 60,
        "listpack_cap": 128,
        "legacy_ttl_ms": 0,
        "sources": [FenceSource("updates:0", "tid", -1)],
        "events": events,
    }
    fields.update(overrides)
    return ApplyRequest(**fields)  # type: ignore[arg-type]


def event(
    member: str, score: float, tie: int, offset: int, *, mask: int = 0b11, op: str = "incr"
) -> ApplyEvent:
    return ApplyEvent(
        op, member, float(score), tie, '{"n":1}', mask, offset, 1001, fingerprint(f"{member}{offset}")
    )


@pytest.fixture
def keys(settings) -> BoardKeys:
    return BoardKeys(settings.key_prefix, f"s:{uuid.uuid4().hex[:8]}")


def test_apply_reports_each_event_and_its_states_per_instance_of_its_mask(rclient, keys):
    script = ApplyScript()
    events = [event("a", 5, 100, 0), event("b", 7, 200, 1, mask=0b01), event("a", 1, 300, 2)]
    (reply,) = script.run_many(rclient, [request(keys, events)])
    assert isinstance(reply, list)
    assert [(r.status, r.seq) for r in reply] == [
        (Status.APPLIED, 1),
        (Status.APPLIED, 2),
        (Status.APPLIED, 3),
    ]
    assert reply[0].states == (MemberState(5, 100), MemberState(5, 100))
    assert reply[1].states == (MemberState(7, 200),)  # only the instance of its mask
    assert reply[2].states == (MemberState(6, 300), MemberState(6, 300))
    assert reply[2].meta == b'{"n":1}'
    # redelivered at the same positions: nothing changes, each reports REDELIVERED
    (again,) = script.run_many(rclient, [request(keys, events)])
    assert isinstance(again, list)
    assert [r.status for r in again] == [Status.REDELIVERED] * 3
    assert rclient.get(keys.seq) == b"3"


def test_apply_on_a_board_of_another_epoch_changes_nothing(rclient, keys):
    script = ApplyScript()
    (first,) = script.run_many(rclient, [request(keys, [event("a", 5, 100, 0)])])
    assert isinstance(first, list)
    (reply,) = script.run_many(rclient, [request(keys, [event("a", 5, 100, 1)], epoch="ep2")])
    assert reply == ForeignEpoch("ep1")
    assert rclient.get(keys.seq) == b"1"


def test_apply_error_comes_back_in_its_calls_place(rclient, keys):
    bad = ApplyEvent("incr", "a", float("nan"), 1, "", 1, 0, 0, fingerprint("x"))
    good = request(keys, [event("b", 1, 1, 0)])
    broken, fine = ApplyScript().run_many(rclient, [request(keys, [bad], sources=[]), good])
    assert isinstance(broken, Exception) and isinstance(fine, list)


def test_top_and_locate_read_the_rank_then_the_overflow_zset(rclient, keys, settings):
    # max_members 2: the third member lives in the overflow zset
    events = [event("a", 5, 100, 0, mask=1), event("b", 9, 200, 1, mask=1), event("c", 7, 300, 2, mask=1)]
    (reply,) = ApplyScript().run_many(rclient, [request(keys, events, instances=[Instance("total", 0)])])
    assert isinstance(reply, list)
    assert rclient.zcard(keys.overflow("total")) == 1
    ref = reads.WindowRef(keys, "total", True, TieMode.INV)

    async def go() -> None:
        client = RedisPipe(settings.redis_url.get_secret_value())
        try:
            page = await reads.top(client, ref, 1, 3, reverse=False)
            assert (page.total, page.seq) == (3, 3)
            assert [(r.member, r.score, r.meta) for r in page.entries] == [
                ("c", 7, b'{"n":1}'),
                ("a", 5, b'{"n":1}'),
            ]
            back = await reads.top(client, ref, 0, 2, reverse=True)
            assert [r.member for r in back.entries] == ["a", "c"]
            found = await reads.locate(client, ref, ["a", "nobody", "b"], reverse=False)
            assert found.found[1] is None
            a, b = found.found[0], found.found[2]
            assert a is not None and (a.entry.score, a.position, a.better) == (5, 2, 2)
            assert b is not None and (b.entry.score, b.position, b.better) == (9, 0, 0)
            assert await reads.count_between(client, ref, "6", "+inf") == reads.Counted(2, 3)
            assert await reads.better_and_equal(client, ref, 7, reverse=True) == (1, 1, 3)
        finally:
            await client.aclose()

    asyncio.run(go())


DAY = 1_795_276_800_000  # 2026-11-22T00:00+08:00: the day instance's period start
EXPIRE_AT = 4_102_444_800_000  # 2100-01-01: far ahead, so the keys live through the test


def packed_request(keys: BoardKeys, events: list[ApplyEvent], **overrides: object) -> ApplyRequest:
    """A declared range [-10, 100]: total in the general layout, the day packed (27 tie bits)."""
    day = Instance("day:2026-11-22", EXPIRE_AT, Packing(27, DAY, inv=True))
    fields: dict[str, object] = {"instances": [Instance("total", 0), day], "score_range": (-10, 100)}
    return request(keys, events, **{**fields, **overrides})


def test_packed_window_keeps_one_entry_per_member_and_reports_its_exact_state(rclient, keys):
    script = ApplyScript()
    events = [event("a", 5, DAY + 100, 0), event("b", 5, DAY + 50, 1), event("a", 2, DAY + 86_399_999, 2)]
    (reply,) = script.run_many(rclient, [packed_request(keys, events, max_members=0)])
    assert isinstance(reply, list)
    assert [r.status for r in reply] == [Status.APPLIED] * 3
    assert reply[2].states == (MemberState(7, DAY + 86_399_999), MemberState(7, DAY + 86_399_999))
    rows = rclient.zrevrange(keys.rank("day:2026-11-22", True), 0, -1, withscores=True)
    mask = 2**27 - 1
    assert rows == [(b"a", 7 * 2**27 + mask - 86_399_999), (b"b", 5 * 2**27 + mask - 50)]
    assert not rclient.exists(keys.state("day:2026-11-22"), keys.rank("day:2026-11-22"))
    assert rclient.hlen(keys.tie_index("total") + ":0:0") == 2  # total keeps the general layout
    assert rclient.pexpiretime(keys.rank("day:2026-11-22", True)) == EXPIRE_AT  # the period's expiry


@pytest.mark.parametrize(
    ("op", "score"),
    [("incr", 96), ("set", 101), ("set", -11), ("set", 2.5), ("incr", 0.5), ("best", 1e300)],
)
def test_a_score_outside_the_declared_range_is_refused_and_changes_nothing(rclient, keys, op, score):
    script = ApplyScript()
    (first,) = script.run_many(rclient, [packed_request(keys, [event("a", 5, DAY + 1, 0)])])
    assert isinstance(first, list)
    before = rclient.zrange(keys.rank("day:2026-11-22", True), 0, -1, withscores=True)
    (reply,) = script.run_many(rclient, [packed_request(keys, [event("a", score, DAY + 2, 1, op=op)])])
    assert isinstance(reply, list)
    assert reply[0].status is Status.OUT_OF_RANGE
    assert reply[0].states == (MemberState(5, DAY + 1), MemberState(5, DAY + 1))
    assert rclient.zrange(keys.rank("day:2026-11-22", True), 0, -1, withscores=True) == before
    assert rclient.get(keys.seq) == b"1"


def test_an_event_time_outside_the_packed_period_fails_its_call(rclient, keys):
    """The worker never sends one (the event's time picks the period); if it did, the order would
    break, so the script refuses the whole call and writes nothing."""
    (reply,) = ApplyScript().run_many(rclient, [packed_request(keys, [event("a", 5, DAY - 1, 0)])])
    assert isinstance(reply, Exception) and "outside the packed period" in str(reply)
    assert rclient.get(keys.seq) is None


@pytest.mark.parametrize("packed", [False, True], ids=["general", "packed"])
def test_removing_max_members_brings_the_overflow_back_into_the_ranking(rclient, keys, packed):
    """max_members 2 parks three of five members in the overflow zset; once the type has no
    max_members, the next call of the board moves them back, and their scores stay exact."""
    script = ApplyScript()
    packing = Packing(27, DAY, inv=True) if packed else None
    day = [Instance("day:2026-11-22", 0, packing)]
    extra = {"score_range": (-10, 100)} if packed else {}
    events = [
        event(m, s, DAY + i, i, mask=1) for i, (m, s) in enumerate(zip("abcde", (5, 9, 7, 3, 1), strict=True))
    ]
    (first,) = script.run_many(rclient, [request(keys, events, instances=day, **extra)])
    assert isinstance(first, list)
    assert rclient.zcard(keys.overflow("day:2026-11-22", packed)) == 3
    (reply,) = script.run_many(
        rclient, [request(keys, [event("e", 2, DAY + 9, 9, mask=1)], instances=day, max_members=0, **extra)]
    )
    assert isinstance(reply, list)
    assert reply[0].states == (MemberState(3, DAY + 9),)  # 1 + 2: e's score was read from its old place
    assert not rclient.exists(keys.overflow("day:2026-11-22", packed))
    ranked = rclient.zrevrange(keys.rank("day:2026-11-22", packed), 0, -1)
    prefix = 0 if packed else TIE_WIDTH
    assert [m.decode()[prefix:] for m in ranked] == ["b", "c", "a", "d", "e"]


def test_backfill_pages_a_packed_window_by_value_across_both_zsets(rclient, keys, monkeypatch):
    """packedpage.lua: pages of 2 over the rank and overflow zsets together return every member
    once, with its exact state, even where a page would cut a group of equal packed values."""
    packing = Packing(27, DAY, inv=True)
    day = [Instance("day:2026-11-22", 0, packing)]
    scores = {"a": 5, "b": 5, "c": 9, "d": 7, "e": 5, "f": 1}  # a, b, e: one packed value
    events = [
        event(m, s, DAY + (50 if m == "f" else 10), i, mask=1) for i, (m, s) in enumerate(scores.items())
    ]
    (reply,) = ApplyScript().run_many(rclient, [request(keys, events, instances=day, score_range=(-10, 100))])
    assert isinstance(reply, list)
    assert rclient.zcard(keys.overflow("day:2026-11-22", True)) == 4  # max_members 2
    monkeypatch.setattr(scan, "SCAN_COUNT", 2)
    pages = list(scan.state_pages(rclient, keys, "day:2026-11-22", packing, TieMode.INV))
    rows = [row for page in pages for row in page]
    # page 1: f, then the group of 5s whole (the limit of 2 fell inside it); page 2: d, c
    assert [sorted(row.member for row in page) for page in pages] == [["a", "b", "e", "f"], ["c", "d"]]
    assert sorted(row.member for row in rows) == sorted(scores)
    assert {row.member: row.state for row in rows} == {
        m: MemberState(s, DAY + (50 if m == "f" else 10)) for m, s in scores.items()
    }
