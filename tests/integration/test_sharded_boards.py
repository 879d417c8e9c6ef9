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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, cast

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.app import create_app
from api.state import APP_STATE
from common.boards import BoardsConfig, load_boards, parse_boards
from common.control import control_kind, control_message, parse_control
from common.errors import ConfigError
from common.events import Op, UpdateEvent, parse_message, ts_ceiling
from common.settings import Settings
from common.store import shardcount, shardreads
from common.store.encoding import decode_member, text, tie_mode
from common.store.keys import BoardKeys, shard_counts
from common.store.shards import shard_index, shard_names, shard_of
from common.store.topology import Store
from rankstream.topics import ensure_topics
from tests.helpers import BOTH_TOPOLOGIES, committed_so_far, running_worker, wait_for
from tests.integration.test_hot_boards import NodeRunner
from tests.integration.test_period_results_emitter import (
    DUE,
    HOUR_10,
    HOUR_11,
    Clock,
    ev,
    leaders_known,
    records,
    step,
)
from tests.integration.test_warm_cache import node as warm_node
from tests.integration.test_warm_cache import shows
from tests.oracle import now_ms
from worker.apply import Applier
from worker.main import results_emitter as make_emitter
from worker.rolling import RollingPreparer

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
    "one": ("window=total", "window=day&at={now}&trend=1"),
    "oneasc": ("window=total",),
    "onenone": ("window=total",),
    "onepacked": ("window=total", "window=day&at={now}"),
    "onemix": ("window=30min&at={now}&trend=1", "window=last_3h", "window=last_2d&trend=1"),
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
    max_examples=8,
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


# --- hot sharded boards: replayed from update_cache as one board -----------------------------

HOT = ("one:h", "split:h", "splitpacked:h")


def _hot_config(tmp_path: Path, hot: bool) -> Path:
    path = tmp_path / ("hot.yaml" if hot else "cold.yaml")
    lines = "".join(f"  - {{board: {board}}}\n" for board in HOT)
    path.write_text(CONFIG + ("hot:\n" + lines if hot else ""))
    return path


def _produce_stream(settings: Settings, boards: BoardsConfig, seed: int, count: int) -> int:
    """`count` events (erases and resets among them) on each board of HOT; messages produced."""
    rng, now = random.Random(seed), now_ms()
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    sent = 0
    for n in range(count):
        member, roll = rng.choice(MEMBERS), rng.random()
        op = rng.choice(["incr", "incr", "set", "best", "delete"])
        score = rng.choice([rng.randint(-3, 3), rng.randint(-1000, 1000)])
        ts = now - rng.choice([0, 1000])
        for board in (*HOT, "onepacked:h"):
            headers = None
            if roll < 0.02:
                value, headers = control_message(Op.RESET, board, window="total" if roll < 0.01 else None)
            elif roll < 0.05:
                value, headers = control_message(Op.ERASE, board, member=member)
            else:
                event = {
                    "id": f"s{seed}-{n}",
                    "board": board,
                    "member": member,
                    "ts": ts,
                    "op": op,
                    "score": score,
                }
                value = orjson.dumps(event)
            producer.produce(settings.topic_updates, value, key=board.encode(), headers=headers)
            sent += 1
    assert producer.flush(30) == 0
    return sent


def _answers(node: Any, board: str, at: int) -> dict[str, Any]:
    """Every question of `_compare` to one board, its answers (status, body without board and source)."""
    paths = []
    for where in ("window=total", f"window=day&at={at}"):
        paths += [f"/count?{where}&min=-3&max=3"]
        for order, ties in itertools.product(("desc", "asc"), ("ordinal", "shared")):
            q = f"?{where}&order={order}&ties={ties}"
            paths += [f"/top{q}&offset={offset}&limit=5" for offset in (0, 3, 12)]
            paths += [f"/members/{m}{q}" for m in MEMBERS[::4]]
            paths += [f"/members/{m}/around{q}&n=2" for m in MEMBERS[1::4]]
            paths += [f"/rank{q}&score={s}" for s in (-3, 0, 2)]
    out = {}
    for path in paths:
        status, body = node.get(f"/v1/boards/{board}{path}")
        body.pop("board", None)
        out[path] = (status, body.pop("source", None), body)
    return out


@pytest.mark.slow
def test_a_hot_sharded_board_replays_as_one_board_and_answers_as_redis(make_settings, tmp_path, rclient):
    """Data written while the boards were cold, then more (resets and erases among it) once hot:
    each shard is backfilled on its own; a node becomes ready only when every shard's marker
    reached its seq, then answers every route from memory exactly as Redis answers it, and as
    the same board unsharded answers from memory."""
    cold = make_settings(boards=_hot_config(tmp_path, hot=False))
    ensure_topics(cold)
    hot = cold.model_copy(update={"boards": _hot_config(tmp_path, hot=True)})
    boards = load_boards(hot.boards)
    sent = _produce_stream(cold, boards, seed=1, count=300)
    with running_worker(cold):
        wait_for(lambda: committed_so_far(cold) >= sent, 120, "the cold part applied")
    sent += _produce_stream(hot, boards, seed=2, count=300)
    with running_worker(hot), NodeRunner(hot) as memory, NodeRunner(cold) as redis_node:
        wait_for(lambda: committed_so_far(hot) >= sent, 120, "the hot part applied")
        wait_for(lambda: memory.get("/readyz")[0] == 200, 60, "the node ready")
        targets = memory.call(lambda app: dict(app[APP_STATE].hot.boards["split:h"].targets))
        assert sorted(targets) == sorted(shard_names("split:h", 3))  # readiness waited for each shard
        seqs = {b: sum(int(rclient.get(BoardKeys(hot.key_prefix, n).seq) or 0)
                       for n in shard_names(b, boards.shards_of(b))) for b in HOT}  # fmt: skip

        def held() -> dict[str, int]:
            seqs: dict[str, int] = memory.call(
                lambda app: {b: h.seq for b, h in app[APP_STATE].hot.boards.items()}
            )
            return seqs

        wait_for(lambda: held() == seqs, 30, "memory caught up with Redis")
        at = now_ms()
        for board in ("split:h", "splitpacked:h"):
            from_memory, from_redis = _answers(memory, board, at), _answers(redis_node, board, at)
            assert {s for st, s, _ in from_memory.values() if st == 200} == {"memory"}
            assert {p: (st, b) for p, (st, _, b) in from_memory.items()} == {
                p: (st, b) for p, (st, _, b) in from_redis.items()
            }, board
        solo = {p: (st, b) for p, (st, _, b) in _answers(memory, "one:h", at).items()}
        split = {p: (st, b) for p, (st, _, b) in _answers(memory, "split:h", at).items()}
        for path, (status, body) in solo.items():  # the seq apart (each reset counts on every shard)
            body.pop("seq", None)
            split[path][1].pop("seq", None)
            assert (status, body) == split[path], path


# --- period results of a sharded board -------------------------------------------------------

RESULTS_CONFIG = """
timezone: Asia/Shanghai
types:
  oneres: {windows: [total, hour], late_grace: 10m, period_results: {windows: [hour], top: 6}}
  splitres: {windows: [total, hour], late_grace: 10m, period_results: {windows: [hour], top: 6}, shards: 3}
"""


def test_a_sharded_boards_period_result_is_the_unsharded_ones(make_settings, tmp_path, rclient):
    """The same hour on both boards (ties across shards, more members than the result's top):
    the records are equal but for the board; every shard is sealed, so a late event the worker's
    clock still admits changes no shard once the result is out."""
    path = tmp_path / "results.yaml"
    path.write_text(RESULTS_CONFIG)
    settings = make_settings(boards=path)
    ensure_topics(settings)
    wait_for(lambda: leaders_known(settings), 30, "the results topic's partition leaders")
    boards = load_boards(path)
    clock = Clock(HOUR_10)
    applier = Applier(rclient, boards, settings.key_prefix, 3600, now_ms=clock)
    rng = random.Random(7)
    stream = [
        (f"m{rng.randrange(15)}", rng.choice([1, 2, 2, 5]), HOUR_10 + rng.choice([1, 2, 3]))
        for _ in range(60)
    ]
    for board in ("oneres:x", "splitres:x"):
        applier.apply([ev(n, member, score, ts, board) for n, (member, score, ts) in enumerate(stream)])
    clock.now = DUE
    emitting = make_emitter(settings, rclient, boards, "w1", clock=clock, metrics=None)
    try:
        wait_for(lambda: step(emitting) >= 0 and len(records(settings)) == 2, 60, "both results sent")
    finally:
        emitting.close()
    got = {value["board"]: value for _, value, _ in records(settings)}
    solo, split = got.pop("oneres:x"), got.pop("splitres:x")
    assert (
        split["members"] == len({member for member, _, _ in stream})
        and split["seq"] == 60
        and len(cast(list[Any], split["top"])) == 6
    )
    assert {**split, "board": "oneres:x"} == solo
    # a late event on a shard other than the first: refused there too (each shard sealed)
    late = next(m for m in (f"z{i}" for i in range(99)) if shard_index(m, 3) == 2)
    clock.now = HOUR_11 + 60_000  # within late_grace by this clock
    outcome = applier.apply([ev(99, late, 50, HOUR_10 + 9, "splitres:x")])[0]
    assert outcome.late_windows == 1  # the hour refused it: sealed


# --- rolling windows across a boundary: the preparer walks each shard ------------------------

ROLLING_CONFIG = """
timezone: UTC
types:
  oneroll: {windows: [total, last_3h], late_grace: 10m}
  splitroll: {windows: [total, last_3h], late_grace: 10m, shards: 3}
"""


def test_a_sharded_boards_next_rolling_period_is_prepared_shard_by_shard(make_settings, tmp_path, rclient):
    """Events over three hours, the preparer at the end of the hour, then the next hour: the
    sharded board's current and previous last_3h periods answer as the unsharded board's (the
    oldest hour left exactly at the boundary on every shard). Without the shards' preparation the
    members no event touched after the boundary are missing from the new period."""
    path = tmp_path / "rolling.yaml"
    path.write_text(ROLLING_CONFIG)
    settings = make_settings(boards=path)
    boards = load_boards(path)
    wall = now_ms()
    q = wall - wall % 3_600_000 + 3 * 3_600_000  # an hour ahead of the wall clock: nothing else runs there
    clock = Clock(q + 20 * 60_000)
    applier = Applier(rclient, boards, settings.key_prefix, 3600, now_ms=clock)
    preparer = RollingPreparer(rclient, boards, settings.key_prefix, clock=clock, epoch=lambda: applier.epoch,
                               owner="t")  # fmt: skip
    rng = random.Random(3)
    hours = [q - h * 3_600_000 for h in range(3)]  # buckets q-2, q-1, q
    stream = [(rng.choice(MEMBERS), rng.choice([1, 2, 5, -1]), rng.choice(hours) + rng.randrange(60_000))
              for _ in range(80)]  # fmt: skip
    for board in ("oneroll:r", "splitroll:r"):
        applier.apply([ev(n, m, s, ts, board) for n, (m, s, ts) in enumerate(stream)])
    clock.now = q + 3_600_000 - 1  # the hour's last ms: its next period is claimed and prepared
    while preparer.step():
        pass
    for name in shard_names("splitroll:r", 3):
        assert rclient.get(BoardKeys(settings.key_prefix, name).prepared(f"last_3h:{hour_id(q + 3_600_000)}"))
    clock.now = q + 3_600_000 + 5 * 60_000
    later = [(rng.choice(MEMBERS[:5]), 3, clock.now - 1000) for _ in range(5)]
    for board in ("oneroll:r", "splitroll:r"):
        applier.apply([ev(100 + n, m, s, ts, board) for n, (m, s, ts) in enumerate(later)])

    async def go() -> None:
        app = create_app(settings, boards, clock)
        async with TestClient(TestServer(app)) as http:
            pair = Pair("oneroll:r", "splitroll:r", 0)
            for where in ("window=last_3h", f"window=last_3h&at={q + 1000}", "window=last_3h&trend=1"):
                for order in ("desc", "asc"):
                    await _same(http, pair, f"/top?{where}&order={order}&limit=50&nocache=1")
                    for member in MEMBERS[::3]:
                        await _same(http, pair, f"/members/{member}/around?{where}&order={order}&n=2")

    asyncio.run(go())


def hour_id(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H")


def test_a_sharded_boards_kept_answers_go_at_any_shards_notice(make_settings, tmp_path, rclient):
    """The warm cache keeps a sharded board's answers under the board, and a write to any of its
    shards drops them (its notice names the shard): no seq check runs within the test."""
    path = tmp_path / "boards.yaml"
    path.write_text(CONFIG)
    settings = make_settings(boards=path, warm_check_s=60.0)
    boards = load_boards(path)
    applier = Applier(rclient, boards, settings.key_prefix, 600_000)

    def write(n: int, member: str, score: float) -> int:
        value = orjson.dumps(
            {"id": f"w{n}", "board": "split:w", "member": member, "op": "set", "score": score}
        )
        events = parse_message(value, boards, ts_ceiling(86_400)).events
        return applier.apply([(e, e.ts or now_ms()) for e in events])[0].seq

    for n, member in enumerate(MEMBERS):
        write(n, member, n)
    late = {shard_index(m, 3): m for m in MEMBERS}  # a member of each shard
    url = "/v1/boards/split:w/top?limit=3"

    async def go() -> list[str]:
        tops = []
        async with warm_node(settings) as http:
            first = await (await http.get(url)).json()
            assert (await (await http.get(url)).json()) == first  # kept
            for shard, member in sorted(late.items()):
                write(100 + shard, member, 1000 + shard)
                body = await shows(http, url, first["seq"] + shard + 1)
                tops.append(body["items"][0]["member"])
        return tops

    assert asyncio.run(go()) == [late[0], late[1], late[2]]
