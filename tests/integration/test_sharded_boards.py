"""Sharded boards (`shards: K`) answer exactly what the same board unsharded answers.

Each example feeds one stream of events to pairs of boards whose types differ only in `shards`
(desc with max_members, asc with tie_break last, tie_break none, packed scores), through the
worker's apply path, then asks the HTTP API the same questions of both boards: top pages at
every depth (deep pages narrowed shard by shard, forced with a small SHALLOW_ROWS), members,
around, lookup, count and rank-of-score, in both orders and both tie rules. Ties across shards
(equal scores, equal times) and scores at the limits are drawn on purpose."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any, NamedTuple, cast

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.app import create_app
from common.boards import BoardsConfig, load_boards, parse_boards
from common.control import control_kind, control_message, parse_control
from common.errors import ConfigError
from common.events import Op, UpdateEvent, parse_message, ts_ceiling
from common.settings import Settings
from common.store import shardcount, shardreads
from common.store.encoding import decode_member, text, tie_mode
from common.store.keys import BoardKeys, shard_counts
from common.store.shards import shard_names, shard_of
from common.store.topology import Store
from tests.helpers import BOTH_TOPOLOGIES
from tests.oracle import now_ms
from worker.apply import Applier

pytestmark = [pytest.mark.integration, BOTH_TOPOLOGIES]
PROPERTY_SLOW = pytest.mark.slow  # ~40 s a topology

CONFIG = """
timezone: Asia/Kolkata
types:
  one: {windows: [total, day], late_grace: 1d, max_members: 4}
  split: {windows: [total, day], late_grace: 1d, max_members: 4, shards: 3}
  oneasc: {order: asc, tie_break: last, windows: [total]}
  splitasc: {order: asc, tie_break: last, windows: [total], shards: 4}
  onenone: {tie_break: none, windows: [total]}
  splitnone: {tie_break: none, windows: [total], shards: 2}
  onepacked: {windows: [total, day], score_range: [-1000, 1000], late_grace: 1d}
  splitpacked: {windows: [total, day], score_range: [-1000, 1000], late_grace: 1d, shards: 8}
  onemix: {windows: [30min, last_3h, last_2d], late_grace: 1d}
  splitmix: {windows: [30min, last_3h, last_2d], late_grace: 1d, shards: 5}
"""
PAIRS = (
    ("one", "split"),
    ("oneasc", "splitasc"),
    ("onenone", "splitnone"),
    ("onepacked", "splitpacked"),
    ("onemix", "splitmix"),
)
WINDOWS = {  # what each pair is asked
    "one": ("window=total", "window=day&at={now}"),
    "oneasc": ("window=total",),
    "onenone": ("window=total",),
    "onepacked": ("window=total", "window=day&at={now}"),
    "onemix": ("window=30min&at={now}", "window=last_3h", "window=last_2d"),
}
MEMBERS = ["a", "b", "bb", "m1", "m10", "m2", "m3", "m4", "m5", "zz", "Z", "m-1", "q.q", "k", "kk", "kkk",
           "w0", "w1", "w2", "w3"]  # fmt: skip
EXACT = 2**53 - 1
DAY_MS = 86_400_000
SCORES = st.one_of(
    st.integers(-3, 3),  # ties, across shards too
    st.sampled_from([EXACT, -EXACT, EXACT - 1, 1000, -1000, 999, 0.5, -0.25, 1e15 + 0.25]),
)
AGES = st.sampled_from([0, 1_000, 1_000, 60_000, 3_600_000, DAY_MS])  # equal times: ties on time too
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(MEMBERS),
        # erase and reset: rankstream's control messages (a reset reaches every shard)
        st.sampled_from(["incr", "incr", "incr", "set", "best", "delete", "erase", "reset", "reset total"]),
        SCORES,
        AGES,
        st.booleans(),  # sent twice (a producer's retry)
        st.booleans(),  # with meta
    ),
    min_size=1,
    max_size=60,
)
PROPERTY = hsettings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_scopes = itertools.count()


@pytest.fixture
def sharded(make_settings, tmp_path, rclient):
    path = tmp_path / "boards.yaml"
    path.write_text(CONFIG)
    settings = make_settings(boards=path)
    return settings, load_boards(path), rclient


def _events(events: list[Any], scope: int, now: int, boards: BoardsConfig) -> list[tuple[UpdateEvent, int]]:
    """The stream, for every board of every pair: (event, ts) as the worker's parser gives them."""
    out = []
    for n, (member, op, score, age, twice, meta) in enumerate(events):
        for kind in itertools.chain(*PAIRS):
            board = f"{kind}:s{scope}"
            if op.startswith("reset") or op == "erase":
                first = boards.types[kind].windows[0].name  # "reset total": one window's reset
                fields = {"member": member} if op == "erase" else {"window": first if " " in op else None}
                value, headers = control_message(Op(op.split()[0]), board, **fields)
                parsed = [parse_control(control_kind(headers) or b"", value, boards)]
            else:
                event: dict[str, Any] = {"id": f"e{n}", "board": board, "member": member, "op": op,
                                         "ts": now - age}  # fmt: skip
                if op != "delete":
                    event["score"] = score
                if meta:
                    event["meta"] = {"n": n}
                parsed = list(parse_message(orjson.dumps(event), boards, ts_ceiling(86_400)).events)
            for _ in range(2 if twice else 1):
                out += [(e, e.ts or now) for e in parsed]
    return out


class Pair(NamedTuple):
    solo: str
    split: str
    gap: int  # the split board's seq is the sum of its shards': each reset counts once per shard


async def _same(http: TestClient[Any, Any], pair: Pair, query: str) -> None:
    got = []
    for board in pair[:2]:
        resp = (
            await http.get(f"/v1/boards/{board}{query}")
            if "lookup" not in query
            else await http.post(f"/v1/boards/{board}{query}", json={"members": [*MEMBERS[::3], "ghost"]})
        )
        body = await resp.json()
        body.pop("board", None)
        got.append((resp.status, body))
    if "seq" in got[0][1]:
        assert got[1][1].pop("seq") == got[0][1].pop("seq") + pair.gap, (pair, query)
    assert got[0] == got[1], (pair, query)


async def _compare(http: TestClient[Any, Any], pair: Pair, at: int, rng: random.Random) -> None:
    for where in (w.format(now=at) for w in WINDOWS[pair.solo.split(":", maxsplit=1)[0]]):
        await _same(http, pair, f"/count?{where}&min=-3&max=3")
        await _same(http, pair, f"/count?{where}&min=-1e300&max=1e300")
        for order, ties in itertools.product(("desc", "asc"), ("ordinal", "shared")):
            q = f"?{where}&order={order}&ties={ties}&nocache=1"
            for offset, limit in ((0, 10), (1, 3), (4, 2), (7, 50), (18, 5), (30, 5)):
                await _same(http, pair, f"/top{q}&offset={offset}&limit={limit}&me={rng.choice(MEMBERS)}")
            for member in rng.sample(MEMBERS, 6):
                await _same(http, pair, f"/members/{member}{q}")
                await _same(http, pair, f"/members/{member}/around{q}&n={rng.choice([0, 1, 2, 5])}")
            await _same(http, pair, f"/members/lookup{q}")
            for score in (-3, 0, 2, 1000, EXACT):
                await _same(http, pair, f"/rank{q}&score={score}")


@PROPERTY_SLOW
@PROPERTY
@given(events=EVENTS, deep=st.booleans())
def test_a_sharded_board_answers_as_the_same_board_unsharded(sharded, events, deep, monkeypatch):
    settings, boards, client = sharded
    monkeypatch.setattr(shardreads, "SHALLOW_ROWS", 2 if deep else 1_000)
    now, scope = now_ms(), next(_scopes)
    applier = Applier(client, boards, settings.key_prefix, 600_000, now_ms=lambda: now)
    applier.apply(_events(events, scope, now, boards))
    for _, split in PAIRS:
        board = f"{split}:s{scope}"
        shards = boards.shards_of(board)
        for member in MEMBERS:  # each member lives in its shard, and only there
            homes = [
                name
                for name in shard_names(board, shards)
                if member in _members(client, settings, boards, name)
            ]
            assert homes in ([], [shard_of(board, shards, member)]), (board, member, homes)

    async def go() -> None:
        app = create_app(settings, boards)
        async with TestClient(TestServer(app)) as http:
            rng = random.Random(scope)
            for solo, split in PAIRS:
                gap = (boards.types[split].shards - 1) * sum(1 for e in events if e[1].startswith("reset"))
                await _compare(http, Pair(f"{solo}:s{scope}", f"{split}:s{scope}", gap), now, rng)

    asyncio.run(go())


def _members(client: Store, settings: Settings, boards: BoardsConfig, name: str) -> set[str]:
    """The member ids a board (or shard) holds anywhere: its zsets and rolling buckets."""
    tag = BoardKeys(settings.key_prefix, name).tag
    mode = tie_mode(boards.types[name.split(":", maxsplit=1)[0]])
    out = set()
    for raw in client.scan_iter(match=f"{tag}:*", count=1000):
        kind = text(raw)[len(tag) + 1 :].split(":", 1)[0]
        if kind in ("z", "o"):
            out |= {decode_member(mode, text(m)) for m in cast(list[bytes], client.zrange(raw, 0, -1))}
        elif kind in ("p", "q"):
            out |= {text(m) for m in cast(list[bytes], client.zrange(raw, 0, -1))}
        elif kind == "b":
            out |= {text(m) for m in client.hkeys(raw)}
    return out


def _apply_one(applier: Applier, boards: BoardsConfig, board: str) -> None:
    value = orjson.dumps({"id": "x", "board": board, "member": "m", "score": 1})
    applier.apply([(e, e.ts or now_ms()) for e in parse_message(value, boards, ts_ceiling(86_400)).events])


def test_the_shard_count_is_recorded_and_a_change_refused(sharded):
    settings, boards, client = sharded
    applier = Applier(client, boards, settings.key_prefix, 600_000)
    _apply_one(applier, boards, "split:r")
    assert shardcount.recorded(client, settings.key_prefix) == {"split": 3}
    shardcount.check(client, settings.key_prefix, boards, "boards.yaml")  # the same config: fine
    changed = parse_boards(
        CONFIG.replace("max_members: 4, shards: 3", "max_members: 4, shards: 5"), "boards.yaml"
    )
    with pytest.raises(ConfigError) as refused:
        shardcount.check(client, settings.key_prefix, changed, "boards.yaml")
    assert str(refused.value) == (
        "boards.yaml: types.split.shards: its boards hold data written with shards: 3, the config says 5; "
        "keep 3 (changing a type's shards needs its data moved: docs/boards.md#shards)"
    )
    # and one process writing with another count than the recorded one stops its batch
    other = Applier(client, changed, settings.key_prefix, 600_000)
    with pytest.raises(shardcount.ShardsChanged, match="first written with shards: 3"):
        _apply_one(other, changed, "split:q")
    # a type with data from before shard counts were recorded, made sharded: refused all the same
    _apply_one(applier, boards, "one:r")
    client.hdel(shard_counts(settings.key_prefix), "split", "one")
    resharded = CONFIG.replace("max_members: 4}", "max_members: 4, shards: 2}")
    with pytest.raises(
        ConfigError, match=r"types\.one\.shards: its boards hold data written with shards: 1,"
    ):
        shardcount.check(client, settings.key_prefix, parse_boards(resharded, "boards.yaml"), "boards.yaml")
