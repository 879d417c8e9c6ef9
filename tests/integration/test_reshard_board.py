"""`rankstream reshard-board`: a type's boards moved to another shard count, with the workers
stopped, answer exactly what a board fed the same stream and never moved answers, on every
route and window kind (calendar, rolling, max_members); the ids they applied before the move
are still caught as duplicates after it; and the move refuses what would lose or double events."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from common.boards import BoardsConfig, load_boards
from common.clients import redis_client
from common.control import control_message
from common.errors import ConfigError
from common.events import Op
from common.settings import Settings
from common.store import shardcount
from common.store.encoding import text, tie_mode
from common.store.keys import BoardKeys, shard_moves
from common.store.scan import instance_packing, state_pages
from common.store.shards import shard_names
from common.store.topology import Store
from rankstream.reshard import reshard_board
from rankstream.topics import ensure_topics
from tests.helpers import BOTH_TOPOLOGIES, committed_so_far, running_worker, wait_for
from tests.integration.test_hot_boards import NodeRunner
from tests.oracle import now_ms

pytestmark = [pytest.mark.integration, BOTH_TOPOLOGIES]

CONFIG = """
timezone: %s
types:
  ref: {windows: [total, day, last_3h], late_grace: 1d, max_members: 6}
  mv: {windows: [total, day, last_3h], late_grace: 1d, max_members: 6, shards: %d}
  refp: {windows: [total, day], late_grace: 1d, score_range: [-100000, 100000]}
  mvp: {windows: [total, day], late_grace: 1d, score_range: [-100000, 100000], shards: %d}
hot: [{board: "ref:a"}, {board: "mv:a"}, {board: "refp:a"}, {board: "mvp:a"}]
"""
BOARDS = ("a", "b")
MEMBERS = [f"m{i}" for i in range(14)] + ["z", "Z", "q.q"]
QUERIES = {  # what each moved type is asked (mvp: packed scores, a declared score range)
    "mv": ("window=total", "window=day&at={now}&trend=1", "window=last_3h&trend=1"),
    "mvp": ("window=total", "window=day&at={now}&trend=1"),
}
MOVED = tuple(QUERIES)


HOUR_MS = 3_600_000


def _zone() -> str:
    """UTC or Asia/Kolkata (half an hour apart), whichever has its next hour furthest away: at
    least 30 min, so no hour (nor day) ends while the test runs, and no worker starts preparing
    the next last_3h period (it may from the last quarter of the hour) before a move, which
    refuses a period half prepared. The test chooses its zone rather than depend on the clock."""
    into_utc_hour = now_ms() % HOUR_MS
    return "UTC" if into_utc_hour < HOUR_MS // 2 else "Asia/Kolkata"


def _config(tmp_path: Path, shards: int, zone: str) -> Path:
    path = tmp_path / f"boards{shards}.yaml"
    path.write_text(CONFIG % (zone, shards, shards))
    return path


def _produce(settings: Settings, seed: int, count: int, *, again: int = 0, reset_at: int = -1) -> int:
    """`count` events on each board of every pair (ties, incr/set/best/delete), the first
    `again` of them sent twice (a producer's retries: duplicates by id), and a whole board's
    reset (`rankstream reset`'s message) before event `reset_at`; messages produced."""
    rng, now = random.Random(seed), now_ms()
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    sent = 0
    for n in range(count):
        member = rng.choice(MEMBERS)
        op = rng.choice(["incr", "incr", "incr", "set", "best", "delete"])
        ts = now - rng.choice([0, 1_000, 1_000, 600_000, 7_200_000])
        score = rng.choice([rng.randint(-2, 2), rng.randint(-500, 500)])
        for kind, board in itertools.product(("ref", "mv", "refp", "mvp"), BOARDS):
            name = f"{kind}:{board}"
            if n == reset_at:
                value, headers = control_message(Op.RESET, name)
                producer.produce(settings.topic_updates, value, key=name.encode(), headers=headers)
                sent += 1
            event = {"id": f"{seed}-{n}", "board": name, "member": member, "op": op, "ts": ts}
            if op != "delete":
                event["score"] = score
            for _ in range(2 if n < again else 1):
                producer.produce(settings.topic_updates, orjson.dumps(event), key=name.encode())
                sent += 1
    assert producer.flush(30) == 0
    return sent


def _run_until_applied(settings: Settings, sent: int) -> None:
    with running_worker(settings):
        wait_for(lambda: committed_so_far(settings) >= sent, 120, "the events applied")


def _answers(node: NodeRunner, board: str, queries: tuple[str, ...], now: int) -> dict[str, Any]:
    """Every route's answer for one board: (status, source, body without its name and seq)."""
    paths = []
    for where in (q.format(now=now) for q in queries):
        paths += [f"/count?{where}&min=-2&max=2"]
        for order, ties in itertools.product(("desc", "asc"), ("ordinal", "shared")):
            q = f"?{where}&order={order}&ties={ties}&nocache=1"
            paths += [
                f"/top{q}&offset={offset}&limit={limit}" for offset, limit in ((0, 10), (3, 4), (8, 50))
            ]
            paths += [f"/members/{m}{q}" for m in MEMBERS[::3]]
            paths += [f"/members/{m}/around{q}&n=2" for m in MEMBERS[1::4]]
            paths += [f"/rank{q}&score={s}" for s in (-2, 0, 300)]
    out: dict[str, Any] = {}
    for path in paths:
        status, body = node.get(f"/v1/boards/{board}{path}")
        for field in ("board", "seq"):
            body.pop(field, None)
        out[path] = (status, body.pop("source", None), body)
    return out


def _assert_same(settings: Settings, client: Store) -> None:
    """Each moved board answers as its `ref` board: `a` from memory (hot), `b` from Redis; and
    from memory with the seq Redis holds, the sum of its shards' now."""
    shards = load_boards(settings.boards).types["mv"].shards
    boards = load_boards(settings.boards)
    for kind, board in itertools.product(MOVED, BOARDS):  # Redis first: the same states
        _assert_same_states(client, settings, boards, kind, board, shards=shards)
    with NodeRunner(settings) as node:
        wait_for(lambda: node.get("/readyz")[0] == 200, 60, "the node ready (every hot shard replayed)")
        now = now_ms()
        for kind in MOVED:
            for board, source in (("a", "memory"), ("b", "redis")):
                ref, moved = (
                    _answers(node, f"{k}:{board}", QUERIES[kind], now) for k in (f"ref{kind[2:]}", kind)
                )
                assert moved == ref, (kind, board)
                assert {s for status, s, _ in moved.values() if status == 200} == {source}
                for where in (q.format(now=now) for q in QUERIES[kind]):  # every window holds members
                    assert ref[f"/top?{where}&order=desc&ties=ordinal&nocache=1&offset=0&limit=10"][2][
                        "items"
                    ]
            held = _seq(client, settings, f"{kind}:a", shards)
            assert node.get(f"/v1/boards/{kind}:a/top?limit=1")[1]["seq"] == held, kind


def _cache_records(settings: Settings) -> dict[bytes, bytes | None]:
    """update_cache read to its end: each key's last value (None: deleted)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"check-{now_ms()}",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        meta = consumer.list_topics(settings.topic_cache, timeout=10).topics[settings.topic_cache]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(settings.topic_cache, p))[1]
            for p in meta.partitions
        }
        consumer.assign([TopicPartition(settings.topic_cache, p, OFFSET_BEGINNING) for p in ends])
        out: dict[bytes, bytes | None] = {}

        def at_end() -> bool:  # (a transaction's last offset is its marker: no message)
            positions = consumer.position([TopicPartition(settings.topic_cache, p) for p in ends])
            return all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions)

        while not at_end():
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                out[msg.key() or b""] = msg.value()
        return out
    finally:
        consumer.close()


def _keys_of(client: Store, settings: Settings, name: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{BoardKeys(settings.key_prefix, name).tag}:*", count=1000))


def _seq(client: Store, settings: Settings, board: str, shards: int) -> int:
    return sum(
        int(client.get(BoardKeys(settings.key_prefix, n).seq) or 0) for n in shard_names(board, shards)
    )


def test_a_moved_board_answers_as_the_board_never_moved(make_settings, tmp_path, rclient):
    zone = _zone()  # as the test starts: every config of it shares the zone
    one = make_settings(boards=_config(tmp_path, 1, zone))
    ensure_topics(one)
    sent = _produce(one, seed=1, count=150)
    with running_worker(one):
        wait_for(lambda: committed_so_far(one) >= sent, 120, "the events applied")
        with pytest.raises(ConfigError, match="has running members: stop the workers first"):
            reshard_board(one, "mv", 3)
    # a fence ahead of the group's commit (a worker stopped between applying and committing)
    fence = BoardKeys(one.key_prefix, "mv:a").fence
    field = next(f for f in rclient.hkeys(fence) if f.decode().startswith(one.topic_updates))
    kept = rclient.hget(fence, field)
    topic_id, offset, where = kept.decode().split("|")
    rclient.hset(fence, field, f"{topic_id}|{int(offset) + 10**6}|{where}")
    with pytest.raises(ConfigError, match=r"board mv:a: a worker applied offset \d+ .* committed only up to"):
        reshard_board(one, "mv", 3)
    rclient.hset(fence, field, kept)
    # a rolling period whose preparation a stopped worker left under way
    keys = BoardKeys(one.key_prefix, "mv:a")
    period = next(k.decode() for k in _keys_of(rclient, one, "mv:a") if b":z:last_3h:" in k).split(":z:")[1]
    rclient.set(keys.prepared(period), "busy:worker-1")
    with pytest.raises(ConfigError, match=f"board mv:a: period {period} is being prepared"):
        reshard_board(one, "mv", 3)
    rclient.delete(keys.prepared(period))
    seq_before = _seq(rclient, one, "mv:a", 1)
    old_records = [k for k, v in _cache_records(one).items() if k.startswith(b"mv:a\0") and v is not None]
    assert len(old_records) > 20  # the board's hot records: its states and its marker

    # what a move interrupted midway left (a new shard's seq is written first): dropped first
    stray = BoardKeys(one.key_prefix, shard_names("mv:a", 4)[1])
    rclient.set(stray.seq, 7)
    rclient.hset(stray.meta, "m1", "{}")
    with pytest.raises(ConfigError, match=r"types\.mv: Redis records no shard count .* shards: 1, 4"):
        reshard_board(one, "mv", 3)  # unless Redis says which count the move was from
    rclient.hset(shard_moves(one.key_prefix), "mv", "1 4")
    lines = _move(one, 3)
    assert lines["mv"][0] == "  dropped the keys of 1 shards of an earlier layout"
    assert lines["mv"][1].startswith("mv: 2 boards moved from shards: 1 to shards: 3"), lines
    assert lines["mvp"][0].startswith("mvp: 2 boards moved from shards: 1 to shards: 3"), lines
    assert not rclient.exists(stray.seq, stray.meta, shard_moves(one.key_prefix))
    three = make_settings(boards=_config(tmp_path, 3, zone))
    assert shardcount.recorded(rclient, one.key_prefix) == {"mv": 3, "mvp": 3}
    assert _keys_of(rclient, one, "mv:a") == []  # the old layout dropped
    assert _seq(rclient, one, "mv:a", 3) > seq_before  # an answer's seq never goes back
    after = _cache_records(one)
    assert [after[k] for k in old_records] == [None] * len(old_records)  # deleted from update_cache
    with pytest.raises(ConfigError, match=r"types\.mv\.shards: its boards hold data written with shards: 3"):
        shardcount.check(rclient, one.key_prefix, load_boards(one.boards), "boards.yaml")
    # the events applied before the move, sent again (a producer's retries), count once
    sent += _produce(three, seed=1, count=150)
    sent += _produce(three, seed=2, count=60, again=20, reset_at=30)
    _run_until_applied(three, sent)
    _assert_same(three, rclient)

    # 3 -> 2 keeping the old layout for API nodes on the old config; run again, it is dropped
    lines = _move(three, 2, keep_old=True)
    assert all(any("the old layout is kept" in line for line in got) for got in lines.values()), lines
    assert all(_keys_of(rclient, one, n) for n in shard_names("mv:a", 3))
    two = make_settings(boards=_config(tmp_path, 2, zone))
    sent += _produce(two, seed=3, count=60, again=10, reset_at=5)
    _run_until_applied(two, sent)
    _assert_same(two, rclient)
    assert _move(two, 2) == {
        kind: [
            "  dropped the keys of 6 shards of the old layout",
            f"{kind}: its boards already have shards: 2; nothing to move",
        ]
        for kind in MOVED
    }
    assert not any(_keys_of(rclient, one, n) for n in shard_names("mv:a", 3))
    _assert_same(two, rclient)

    # 2 -> 1: back to one slot
    _move(two, 1)
    sent += _produce(one, seed=4, count=40, again=10)
    _run_until_applied(one, sent)
    _assert_same(one, rclient)


def _move(settings: Settings, shards: int, *, keep_old: bool = False) -> dict[str, list[str]]:
    """Each moved type to `shards`; then each moved board holds, over its shards, exactly what
    its `ref` board holds: every member's state in every window instance and rolling bucket."""
    lines = {kind: reshard_board(settings, kind, shards, keep_old=keep_old) for kind in MOVED}
    boards = load_boards(settings.boards)
    for kind, board in itertools.product(MOVED, BOARDS):
        _assert_same_states(redis_client(settings), settings, boards, kind, board, shards=shards)
    return lines


def _assert_same_states(
    client: Store, settings: Settings, boards: BoardsConfig, kind: str, board: str, *, shards: int
) -> None:
    ref_name = f"ref{kind[2:]}:{board}"
    ref = _held_states(client, settings, boards, ref_name, (ref_name,))
    moved = _held_states(client, settings, boards, f"{kind}:{board}", shard_names(f"{kind}:{board}", shards))
    assert moved == ref, (kind, board, {k: (v, ref.get(k)) for k, v in moved.items() if v != ref.get(k)})


def _held_states(
    client: Store, settings: Settings, boards: BoardsConfig, board: str, names: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """instance or bucket -> member -> its state, over the names in Redis (a board's shards)."""
    board_type = boards.types[board.split(":", maxsplit=1)[0]]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        keys = BoardKeys(settings.key_prefix, name)
        for raw in client.scan_iter(match=f"{keys.tag}:*", count=1000):
            kind, _, rest = text(raw)[len(keys.tag) + 1 :].partition(":")
            if kind == "b":
                out.setdefault(f"b:{rest}", {}).update({text(k): v for k, v in client.hgetall(raw).items()})
            elif kind in ("z", "p"):
                window = board_type.window(rest.split(":")[0])
                packing = instance_packing(boards, board_type, window, rest)
                for page in state_pages(client, keys, rest, packing, tie_mode(board_type)):
                    out.setdefault(rest, {}).update({row.member: row.state for row in page})
    return out
