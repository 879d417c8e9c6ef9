"""The general layout's tie index (common/store/lua/tieindex.lua on xhash.lua) against real
Redis: it splits into listpack-sized buckets and stays exact, its keys expire with the period,
backfill's walk over it survives splits, and an instance the previous release wrote keeps its
state hash. tests/redis_layout.py reads Redis independently of common/store."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from typing import Any

import pytest

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.idwindow import fingerprint
from common.store import reads, scan
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript, FenceSource, Instance
from common.store.encoding import MemberState, Status, TieMode
from common.store.keys import BoardKeys, index_expiry
from common.store.pipe import RedisPipe
from tests.redis_layout import TIE_MAX, index_keys, read_general
from worker.apply import Applier

pytestmark = pytest.mark.integration

CAP = 4  # buckets split beyond 4 entries, so a few dozen members make a deep directory
DAY_EXPIRE = 4_102_444_800_000  # 2100-01-01
INSTANCES = [Instance("total", 0), Instance("day:2026-11-22", DAY_EXPIRE)]


@pytest.fixture
def keys(settings) -> BoardKeys:
    return BoardKeys(settings.key_prefix, f"t:{uuid.uuid4().hex[:8]}")


def request(
    keys: BoardKeys,
    events: list[ApplyEvent],
    max_members: int = 5,
    instances: list[Instance] = INSTANCES,
    tie_index: bool = True,
) -> ApplyRequest:
    return ApplyRequest(
        keys=keys,
        instances=instances,
        mode=TieMode.INV,
        desc=True,
        max_members=max_members,
        want_state=False,
        epoch="ep1",
        id_window_s=60,
        listpack_cap=CAP,
        legacy_ttl_ms=0,
        sources=[FenceSource("u:0", "tid", -1)],
        events=events,
        tie_index=tie_index,
    )


def event(member: str, op: str, score: float, tie: int, offset: int) -> ApplyEvent:
    return ApplyEvent(op, member, score, tie, "", 0b11, offset, 1001, fingerprint(f"{member}:{offset}"))


def apply(rclient, keys: BoardKeys, events: list[ApplyEvent], **overrides: Any) -> None:
    (reply,) = ApplyScript().run_many(rclient, [request(keys, events, **overrides)])
    assert isinstance(reply, list)
    assert all(r.status is Status.APPLIED for r in reply)


def test_the_tie_index_splits_into_small_buckets_and_stays_exact(rclient, settings, keys):
    rng = random.Random(7)
    model: dict[str, tuple[float, int]] = {}
    offset = 0
    for _ in range(6):
        events = []
        for _ in range(60):
            member, tie = f"member-{rng.randrange(150)}", 1_000 + offset
            if rng.random() < 0.1:
                events.append(event(member, "delete", 0, tie, offset))
                model.pop(member, None)
            else:
                delta = rng.randint(-5, 9)
                events.append(event(member, "incr", delta, tie, offset))
                old = model.get(member)
                unchanged = old is not None and delta == 0  # an unchanged score keeps its tie
                model[member] = old if unchanged and old else ((old[0] if old else 0) + delta, tie)
            offset += 1
        apply(rclient, keys, events)
    for inst in ("total", "day:2026-11-22"):
        assert read_general(rclient, keys.tag, inst, False, "first") == model, inst
        index = index_keys(rclient, keys.tag, inst)
        assert len(index) > 10, "the index split"  # the directory and its buckets
        assert all(rclient.hlen(k) <= CAP for k in index if k != keys.tie_index(inst))
        assert {rclient.object("encoding", k) for k in index if k != keys.tie_index(inst)} == {b"listpack"}
        want = -1 if inst == "total" else DAY_EXPIRE
        wants = {k: index_expiry(want, k) if want > 0 else -1 for k in index}
        assert {k: rclient.pexpiretime(k) for k in index} == wants, (
            f"{inst}: the index expires with the period"
        )
    # backfill and the API read the same states through the index
    pages = list(scan.state_pages(rclient, keys, "total", None, TieMode.INV))
    assert {row.member: (row.state.score, row.state.tie_ms) for page in pages for row in page} == model
    ref = reads.WindowRef(keys, "day:2026-11-22", True, TieMode.INV)

    async def go() -> None:
        client = RedisPipe(settings.redis_url.get_secret_value())
        try:
            members = [*sorted(model), "nobody"]
            found = await reads.locate(client, ref, members, reverse=False)
            got = {m: (f.entry.score, f.position) for m, f in zip(members, found.found, strict=True) if f}
            order = sorted(model, key=lambda m: (-model[m][0], model[m][1], m))  # desc, earlier tie first
            assert got == {m: (model[m][0], order.index(m)) for m in model}
        finally:
            await client.aclose()

    asyncio.run(go())


def test_backfill_walks_the_index_once_while_buckets_split(rclient, keys, monkeypatch):
    """statepage.lua pages whole buckets in reverse-bit order: a member present throughout is
    read exactly once, however many splits happen between pages."""
    first = [f"old-{i}" for i in range(40)]
    apply(rclient, keys, [event(m, "incr", i, 10, i) for i, m in enumerate(first)])
    monkeypatch.setattr(scan, "SCAN_COUNT", 3)
    pages = scan.state_pages(rclient, keys, "total", None, TieMode.INV)
    seen = [row.member for row in next(pages)]
    # 400 more members: buckets split and the directory doubles several times mid-walk
    apply(rclient, keys, [event(f"new-{i}", "incr", 1, 20, 100 + i) for i in range(400)])
    for page in pages:
        seen += [row.member for row in page]
    assert len(seen) == len(set(seen)), "a member read twice"
    assert set(first) <= set(seen)


def test_an_instance_with_a_state_hash_keeps_it(rclient, settings, keys):
    """The previous release's layout: hash member -> "<score>|<tie>" beside the zsets. Writing
    and reading it keep that layout (no tie index appears)."""
    rclient.hset(keys.state("total"), "old", "5|100")
    rclient.zadd(keys.rank("total"), {f"{TIE_MAX - 100:012x}old": 5})
    apply(rclient, keys, [event("old", "incr", 2, 200, 0), event("new", "incr", 1, 300, 1)])
    assert rclient.hgetall(keys.state("total")) == {b"old": b"7|200", b"new": b"1|300"}
    assert index_keys(rclient, keys.tag, "total") == []
    assert rclient.zrange(keys.rank("total"), 0, -1, withscores=True) == [
        (f"{TIE_MAX - 300:012x}new".encode(), 1.0),
        (f"{TIE_MAX - 200:012x}old".encode(), 7.0),
    ]
    pages = list(scan.state_pages(rclient, keys, "total", None, TieMode.INV))
    assert {row.member: row.state for page in pages for row in page} == {
        "old": MemberState(7, 200),
        "new": MemberState(1, 300),
    }
    ref = reads.WindowRef(keys, "total", True, TieMode.INV)

    async def go() -> None:
        client = RedisPipe(settings.redis_url.get_secret_value())
        try:
            found = await reads.locate(client, ref, ["new", "old"], reverse=False)
            assert [(f.entry.score, f.position) for f in found.found if f] == [(1, 1), (7, 0)]
        finally:
            await client.aclose()

    asyncio.run(go())


def test_a_member_rescored_at_the_same_tie_keeps_one_entry(rclient, keys):
    """Same tie, new score: the zset entry keeps its name and ZADD rescores it, in the rank zset
    or (max_members 5) the overflow, from which it may rise."""
    apply(rclient, keys, [event(f"m{i}", "incr", 10 + i, 500, i) for i in range(8)])
    assert rclient.zcard(keys.overflow("total")) == 3  # m0, m1, m2 wait below the top 5
    apply(rclient, keys, [event("m0", "incr", 100, 500, 8), event("m7", "incr", -50, 500, 9)])
    want = {f"m{i}": (10.0 + i, 500) for i in range(8)} | {"m0": (110.0, 500), "m7": (-33.0, 500)}
    assert read_general(rclient, keys.tag, "total", False, "first") == want
    ranked = [m.decode()[12:] for m in rclient.zrevrange(keys.rank("total"), 0, -1)]
    assert ranked == ["m0", "m6", "m5", "m4", "m3"]
    assert rclient.zcard(keys.overflow("total")) == 3


def test_the_index_follows_a_period_whose_expiry_moved(rclient, keys):
    """A window's retention changed: the period's expiry moves, and every key of its tie index
    (directory and buckets) moves with the zsets."""
    day = "day:2026-11-22"
    apply(rclient, keys, [event(f"m{i}", "incr", i, 10, i) for i in range(40)])
    assert len(index_keys(rclient, keys.tag, day)) > 5
    later = [Instance("total", 0), Instance(day, DAY_EXPIRE + 86_400_000)]
    apply(rclient, keys, [event("m1", "incr", 1, 20, 40)], instances=later)
    expiries = {k: rclient.pexpiretime(k) for k in index_keys(rclient, keys.tag, day)}
    assert expiries == {k: index_expiry(DAY_EXPIRE + 86_400_000, k) for k in expiries}
    assert rclient.pexpiretime(keys.rank(day)) == DAY_EXPIRE + 86_400_000


def test_new_instances_keep_a_state_hash_while_the_caller_says_so(rclient, keys):
    """tie_index off (a rolling upgrade from a release that reads only state hashes): a new
    instance gets a state hash; one that already has a tie index keeps it."""
    apply(rclient, keys, [event("a", "incr", 1, 10, 0)], instances=[Instance("total", 0)])
    apply(rclient, keys, [event("b", "incr", 2, 20, 1)], tie_index=False)
    assert rclient.hgetall(keys.state("day:2026-11-22")) == {b"b": b"2|20"}
    assert index_keys(rclient, keys.tag, "day:2026-11-22") == []
    assert not rclient.exists(keys.state("total"))
    assert read_general(rclient, keys.tag, "total", False, "first") == {"a": (1, 10), "b": (2, 20)}


def test_ids_crafted_to_collide_leave_one_bucket_not_a_deep_directory(rclient, keys):
    """The index hashes ids with djb2, where swapping "AA" for "B " keeps the hash: 16 such ids
    share one slot value. No split can separate them, so none is made: one oversized bucket
    (exact as ever), not a directory split down to its depth limit."""
    ids = ["".join(blocks) for blocks in itertools.product(("AA", "B "), repeat=4)]
    apply(rclient, keys, [event(m, "incr", i + 1, 10, i) for i, m in enumerate(ids)])
    assert index_keys(rclient, keys.tag, "total") == [keys.tie_index("total") + ":0:0"]
    want = {m: (i + 1, 10) for i, m in enumerate(ids)}
    assert read_general(rclient, keys.tag, "total", False, "first") == want


@pytest.mark.parametrize("how", ["setting", "adopting"])
def test_the_worker_gives_new_instances_a_state_hash_when_told_or_adopting(rclient, settings, how):
    """RANKSTREAM_TIE_INDEX=false, or adopting the previous release's Redis (whose workers may
    still run): the Applier asks for state hashes."""
    boards = parse_boards("types:\n  gift: {windows: [total]}\n")
    applier = Applier(rclient, boards, settings.key_prefix, 3600)
    if how == "setting":
        applier.tie_index = False
    else:
        applier.legacy_ttl_ms = 60_000
    board = f"gift:{uuid.uuid4().hex[:8]}"
    update = UpdateEvent("e1", board, "gift", "alice", Op.INCR, 5.0, None, None)
    assert [o.status for o in applier.apply([(update, 1_795_300_000_000)])] == [Status.APPLIED]
    keys = BoardKeys(settings.key_prefix, board)
    assert rclient.hgetall(keys.state("total")) == {b"alice": b"5|1795300000000"}
    assert index_keys(rclient, keys.tag, "total") == []
