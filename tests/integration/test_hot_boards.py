"""Hot boards on real Kafka and Redis: a node started mid-load is complete the moment it reports
ready, then converges to Redis exactly; a worker dying between Redis and update_cache does not
stop convergence; a board made hot after it holds data comes up complete, and the node stays
503 (with progress) until it is."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from api.app import create_app
from api.hotboards import HotBoard
from api.state import APP_STATE
from common.boards import load_boards
from common.cache_records import RecordWriter, partition_for
from common.settings import Settings
from common.store.encoding import TIE_WIDTH
from common.store.keys import BoardKeys
from rankstream.topics import ensure_topics
from tests.helpers import (
    BOTH_TOPOLOGIES,
    applied_so_far,
    hot_markers,
    markers_reached,
    produce,
    running_worker,
    wait_for,
)
from tests.oracle import (
    BOARDS,
    ORACLE_BOARDS_RANGED,
    PACKED_BITS,
    RANGED_BOARDS,
    TIE,
    Message,
    Model,
    generate,
    now_ms,
    read_packed,
)
from tests.redis_layout import read_general
from worker.consumer import WorkerLoop
from worker.main import build_loop
from worker.metrics import WorkerMetrics

pytestmark = pytest.mark.integration
HOT = {"gift:r0": ("total", "day"), "score:s0": ("total",), "ranged:g0": ("total", "day", "week")}


def hot_yaml(hot: dict[str, tuple[str, ...]]) -> str:
    """The config's `hot:` section for these boards and windows ("" for none)."""
    lines = "".join(f'  - {{board: "{b}", windows: [{", ".join(w)}]}}\n' for b, w in hot.items())
    return "hot:\n" + lines if hot else ""


HOT_YAML = hot_yaml(HOT)
ALL_BOARDS = [*BOARDS, *RANGED_BOARDS]
History = dict[tuple[str, str, str], list[tuple[int, tuple[float, int] | None]]]


def write_config(tmp_path: Path, hot: bool) -> Path:
    path = tmp_path / ("hot.yaml" if hot else "cold.yaml")
    path.write_text(ORACLE_BOARDS_RANGED + (HOT_YAML if hot else ""))
    return path


def model_with_history(messages: list[Message], start: int) -> tuple[Model, History]:
    """The oracle model, plus every state each hot (board, instance, member) went through, by seq."""
    model = Model(now_ms=start)
    history: History = {}
    for msg in messages:
        for reason, index in msg.bad:
            model.dlq.append((reason, msg.value, index))
        for event, index in msg.valid:
            board = event["board"]
            before = model.seq.get(board, 0)
            model.apply(event, msg.value, index)
            seq = model.seq.get(board, 0)
            if board in HOT and seq != before:
                for inst, members in model.state.get(board, {}).items():
                    if inst.split(":")[0] in HOT[board]:
                        history.setdefault((board, inst, event["member"]), []).append(
                            (seq, members.get(event["member"]))
                        )
    return model, history


def state_at(history: History, key: tuple[str, str, str], seq: int) -> tuple[float, int] | None:
    found: tuple[float, int] | None = None
    for at, state in history.get(key, []):
        if at > seq:
            break
        found = state
    return found


def memory_snapshot(hot: HotBoard) -> dict[str, dict[str, tuple[float, int, int]]]:
    return {inst: window.items() for inst, window in hot.instances.items()}


def assert_memory_equals_redis(
    client: redis.Redis,
    prefix: str,
    hot: HotBoard,
    windows: Iterable[str] | None = None,
    served: Callable[[str], bool] = lambda instance: True,
) -> int:
    """Member by member (score and tie time) and in order, every hot window instance (`windows`:
    the board's hot windows, if not HOT's; `served`: the instances memory answers for)."""
    keys = BoardKeys(prefix, hot.board)
    compared = 0
    redis_instances: dict[str, int | None] = {}  # instance -> its packed tie bits (None: general)
    for window in HOT[hot.board] if windows is None else windows:
        bits = PACKED_BITS.get(hot.board.split(":")[0], {}).get(window)
        packed = bits is not None
        pattern = keys.rank("total") if window == "total" else keys.instance_pattern(window, packed)
        for raw in client.scan_iter(match=pattern):
            redis_instances[raw.decode()[len(keys.rank("", packed)) :]] = bits
    redis_instances = {i: bits for i, bits in redis_instances.items() if served(i)}
    memory_instances = {i for i, w in hot.instances.items() if len(w) and served(i)}
    assert memory_instances == set(redis_instances), hot.board
    for inst, bits in redis_instances.items():
        if bits is None:
            stored = read_general(client, keys.tag, inst, not hot.desc, TIE[hot.board.split(":")[0]])
        else:
            stored = read_packed(client, keys.tag, inst, bits)
        in_memory = {m: (score, tie) for m, (score, tie, _) in hot.instances[inst].items().items()}
        assert in_memory == stored, (hot.board, inst)
        rank = keys.rank(inst, bits is not None)
        rows = cast(list[bytes], client.zrevrange(rank, 0, -1) if hot.desc else client.zrange(rank, 0, -1))
        strip = 0 if hot.mode.value == "none" or bits is not None else TIE_WIDTH
        order = [r.decode()[strip:] for r in rows]
        assert [m for m, _ in hot.instances[inst].page(0, len(order), reverse=False)] == order
        compared += len(stored)
    return compared


def redis_seq(client: redis.Redis, settings: Settings, board: str) -> int:
    return int(client.get(BoardKeys(settings.key_prefix, board).seq) or 0)


def wait_memory_caught_up(node: NodeRunner, client: redis.Redis, settings: Settings) -> None:
    """Until every hot board in memory reflects the seq Redis has: its marker reached it."""

    def caught_up() -> bool:
        markers = node.call(hot_markers)
        return markers_reached(markers, {b: redis_seq(client, settings, b) for b in markers})

    wait_for(caught_up, 30, "memory caught up with Redis")


class NodeRunner:
    """An API node (the real app) on its own event loop in a thread, inspectable from the test."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app: Any = None
        self.loop = asyncio.new_event_loop()
        self.client: TestClient[Any, Any] | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> NodeRunner:
        self._thread.start()

        async def start() -> None:
            self.app = create_app(self.settings, load_boards(self.settings.boards))
            self.client = TestClient(TestServer(self.app))
            await self.client.start_server()

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        return self

    def call(self, fn: Any) -> Any:
        """Run `fn(app)` on the node's loop: nothing is applied to memory while it runs."""

        async def run() -> Any:
            return fn(self.app)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def get(self, path: str) -> tuple[int, Any]:
        async def run() -> tuple[int, Any]:
            assert self.client is not None
            resp = await self.client.get(path)
            return resp.status, await resp.json()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.client is not None
            await self.client.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()  # its own sockets too: an unclosed loop warns when collected


def hot_settings(make_settings, tmp_path: Path, hot: bool = True, **overrides: object) -> Settings:
    settings: Settings = make_settings(boards=write_config(tmp_path, hot), **overrides)
    ensure_topics(settings)
    return settings


@pytest.mark.slow
@BOTH_TOPOLOGIES  # the backfill and the node's readiness read Redis: on a cluster, every master
def test_node_started_mid_load_is_complete_when_ready_then_converges(make_settings, tmp_path, rclient):
    settings = hot_settings(make_settings, tmp_path)
    start = now_ms()
    messages = list(generate(seed=31, total=40_000, now_ms=start, boards=ALL_BOARDS))
    model, history = model_with_history(messages, start)
    head, tail = messages[:16_000], messages[16_000:]
    produce(settings, head)

    def paced() -> None:  # the rest arrives over ~6 s while the node starts
        for i in range(0, len(tail), 1000):
            produce(settings, tail[i : i + 1000])
            time.sleep(0.25)

    with running_worker(settings):
        # the node starts mid-load, once each hot board holds a real amount of data
        wait_for(lambda: all(redis_seq(rclient, settings, b) >= 200 for b in HOT), 60, "hot boards filled")
        loader = threading.Thread(target=paced)
        loader.start()
        with NodeRunner(settings) as node:
            status, body = node.get("/readyz")
            wait_for(lambda: node.get("/readyz")[0] == 200, 60, "the node ready")
            # the moment it is ready: every state in memory is a real state of that member at the
            # seq it carries, and nothing Redis had when the node started is missing
            snapshot = node.call(
                lambda app: {
                    board: (hot.target, hot.seq, memory_snapshot(hot))
                    for board, hot in app[APP_STATE].hot.boards.items()
                }
            )
            checked = 0
            for board, (target, seq, instances) in snapshot.items():
                assert seq >= target, (board, target, seq)
                for inst, members in instances.items():
                    for member, (score, tie, member_seq) in members.items():
                        assert member_seq <= seq
                        assert state_at(history, (board, inst, member), member_seq) == (score, tie)
                        checked += 1
                for hboard, inst, member in history:
                    if hboard == board and state_at(history, (board, inst, member), target) is not None:
                        in_memory = instances.get(inst, {}).get(member)
                        deleted_later = state_at(history, (board, inst, member), seq) is None
                        assert in_memory is not None or deleted_later, (board, inst, member)
            assert checked > 100
            assert any(target > 0 for target, _, _ in snapshot.values())  # it did start mid-load
            loader.join(60)
            total = sum(model.seq.values())
            wait_for(lambda: applied_so_far(rclient, settings) >= total, 120, "all applied")

            wait_memory_caught_up(node, rclient, settings)
            compared = node.call(
                lambda app: sum(
                    assert_memory_equals_redis(rclient, settings.key_prefix, hot)
                    for hot in app[APP_STATE].hot.boards.values()
                )
            )
            assert compared > 100
            status, body = node.get("/v1/boards/gift:r0/top?limit=3&window=day")
            assert status == 200 and body["source"] == "memory"
            status, body = node.get("/v1/boards/gift:r0/top?limit=3&window=hour")
            assert status == 200 and body["source"] == "redis"  # hour is not a hot window


class Crash(BaseException):
    """Stands for kill -9: raised after Redis applied the batch, before update_cache has it."""


def test_worker_dying_between_redis_and_publish_still_converges(make_settings, tmp_path, rclient):
    # batches of 500 messages: the stream spans many, so the third publish comes mid-stream
    settings = hot_settings(make_settings, tmp_path, worker_batch_size=500)
    start = now_ms()
    messages = list(generate(seed=32, total=8_000, now_ms=start, boards=ALL_BOARDS))
    model, _ = model_with_history(messages, start)
    produce(settings, messages)
    loop, client = build_loop(settings, WorkerMetrics())
    publisher = loop._publisher
    assert publisher is not None
    real_publish = publisher.publish
    calls = {"n": 0}

    def publish_then_die(outcomes: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # Redis has this batch; update_cache and the commit never will
            raise Crash
        real_publish(outcomes)

    publisher.publish = publish_then_die  # type: ignore[method-assign]
    crashed: list[BaseException] = []

    def run(worker: WorkerLoop) -> None:
        try:
            worker.run()
        except Crash as exc:
            crashed.append(exc)

    thread = threading.Thread(target=run, args=(loop,), daemon=True)
    thread.start()
    thread.join(60)
    if not crashed:  # stop it, or its consumer outlives the test (and a non-daemon one, the run)
        loop.request_stop()
        thread.join(30)
    assert crashed, "the worker did not reach the crash point"
    loop._consumer.close()
    client.close()
    applied_before_restart = applied_so_far(rclient, settings)
    with running_worker(settings), NodeRunner(settings) as node:
        wait_for(lambda: node.get("/readyz")[0] == 200, 60, "the node ready")
        wait_for(lambda: applied_so_far(rclient, settings) >= sum(model.seq.values()), 120, "all applied")

        wait_memory_caught_up(node, rclient, settings)
        node.call(
            lambda app: [
                assert_memory_equals_redis(rclient, settings.key_prefix, hot)
                for hot in app[APP_STATE].hot.boards.values()
            ]
        )
    assert applied_before_restart > 0


def test_board_made_hot_after_it_has_data_comes_up_complete(make_settings, tmp_path, rclient):
    cold = hot_settings(make_settings, tmp_path, hot=False)
    start = now_ms()
    messages = list(generate(seed=33, total=6_000, now_ms=start, boards=ALL_BOARDS))
    model, _ = model_with_history(messages, start)
    produce(cold, messages[:4000])
    with running_worker(cold):  # the board fills while nobody thinks it hot
        part = sum(model_with_history(messages[:4000], start)[0].seq.values())
        wait_for(lambda: applied_so_far(rclient, cold) >= part, 60, "the first part applied")
    hot = cold.model_copy(update={"boards": write_config(tmp_path, hot=True)})
    with NodeRunner(hot) as node:
        # made hot, not backfilled yet: once the node read all update_cache held, it must not
        # claim it has the board
        wait_for(lambda: node.call(lambda app: app[APP_STATE].hot.reached_ends), 60, "update_cache read")
        status, body = node.get("/readyz")
        assert status == 503 and body["ok"] is False
        progress = body["boards"]["gift:r0"]
        assert progress["target_seq"] > 0 and progress["ready"] is False and "records_replayed" in progress
        status, body = node.get("/v1/boards/gift:r0/top")
        assert status == 503 and body["error"]["code"] == "warming_up"
        produce(hot, messages[4000:])
        with running_worker(hot):  # a worker with the new config backfills at start
            wait_for(lambda: node.get("/readyz")[0] == 200, 60, "the node ready after the backfill")
            wait_for(lambda: applied_so_far(rclient, hot) >= sum(model.seq.values()), 120, "all applied")

            wait_memory_caught_up(node, rclient, hot)
            compared = node.call(
                lambda app: sum(
                    assert_memory_equals_redis(rclient, hot.key_prefix, h)
                    for h in app[APP_STATE].hot.boards.values()
                )
            )
            assert compared > 20


def test_an_open_transaction_on_update_cache_holds_no_node_back(make_settings, tmp_path, rclient):
    """A worker killed mid-transaction leaves records after the last stable offset. A node
    replays to the LSO recorded at start (read_committed), so it is ready without waiting for the
    broker to abort that transaction, and never shows what was not committed."""
    settings = hot_settings(make_settings, tmp_path)
    start = now_ms()
    messages = list(generate(seed=33, total=3_000, now_ms=start, boards=ALL_BOARDS))
    model, _ = model_with_history(messages, start)
    produce(settings, messages)
    with running_worker(settings):
        wait_for(lambda: applied_so_far(rclient, settings) >= sum(model.seq.values()), 120, "all applied")
    zombie = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "transactional.id": f"zombie-{settings.worker_group}",
         "transaction.timeout.ms": 120_000}
    )  # fmt: skip
    zombie.init_transactions(30)
    zombie.begin_transaction()
    cache_partitions = (
        zombie.list_topics(settings.topic_cache, timeout=10).topics[settings.topic_cache].partitions
    )
    for board in HOT:
        key, value = RecordWriter().state(
            board, "total", "never-committed", score=1e12, tie_ms=start, seq=10**12, meta=None
        )
        zombie.produce(
            settings.topic_cache, value, key, partition=partition_for(board, len(cache_partitions))
        )
    zombie.flush(10)  # on the broker, inside a transaction that stays open
    try:
        started = time.monotonic()
        with NodeRunner(settings) as node:
            wait_for(lambda: node.get("/readyz")[0] == 200, 30, "the node ready despite the open transaction")
            ready_s = time.monotonic() - started
            node.call(
                lambda app: [
                    assert_memory_equals_redis(rclient, settings.key_prefix, hot)
                    for hot in app[APP_STATE].hot.boards.values()
                ]
            )
        assert ready_s < 20  # well inside the zombie's 120 s transaction timeout
    finally:
        zombie.abort_transaction(30)


def _config(tmp_path: Path, name: str, hot: dict[str, tuple[str, ...]]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(ORACLE_BOARDS_RANGED + hot_yaml(hot))
    return path


def _node_holds_what_redis_holds(settings: Settings, client: redis.Redis, windows: set[str]) -> None:
    """A node started now becomes ready, holds `windows` of gift:r0 and, once caught up, exactly
    what Redis holds."""
    with NodeRunner(settings) as node:
        wait_for(lambda: node.get("/readyz")[0] == 200, 60, f"the node ready, hot on {sorted(windows)}")
        wait_memory_caught_up(node, client, settings)
        held = node.call(
            lambda app: {i.split(":")[0] for i in app[APP_STATE].hot.boards["gift:r0"].instances}
        )
        assert held == windows
        compared = node.call(
            lambda app: assert_memory_equals_redis(
                client, settings.key_prefix, app[APP_STATE].hot.boards["gift:r0"], windows
            )
        )
        assert compared >= 10  # members compared (a fifth of the stream's gift:r0 has ~19)


@pytest.mark.slow
def test_a_window_added_and_a_board_hot_again_come_up_complete(make_settings, tmp_path, rclient):
    """The backfill flag records which windows it covers, and workers drop the flags of boards no
    longer hot: a window added to a hot board, and a board hot again after a spell of being cold
    (its changes meanwhile never published), are backfilled, so a node that says ready holds
    exactly what Redis holds. Without either, the node is ready with the new window or the cold
    spell's changes missing."""
    first = hot_settings(make_settings, tmp_path)
    steps = [  # (config name, hot windows of gift:r0)
        ("total", ("total",)),
        ("both", ("total", "day")),  # a window added
        ("cold", ()),  # not hot: its changes go unpublished
        ("again", ("total", "day")),  # hot again
    ]
    start = now_ms()
    messages = list(generate(seed=36, total=8_000, now_ms=start, boards=ALL_BOARDS))
    for step, (name, windows) in enumerate(steps):
        settings = first.model_copy(
            update={"boards": _config(tmp_path, name, {"gift:r0": windows} if windows else {})}
        )
        produce(settings, messages[2000 * step : 2000 * (step + 1)])
        applied = sum(model_with_history(messages[: 2000 * (step + 1)], start)[0].seq.values())
        with running_worker(settings):
            wait_for(lambda: applied_so_far(rclient, settings) >= applied, 120, f"part {step} applied")  # noqa: B023
            if windows:
                _node_holds_what_redis_holds(settings, rclient, set(windows))
