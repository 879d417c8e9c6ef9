"""Many processes on a Redis Cluster: `rankstream worker` processes, three at a time, one joining
and one leaving (SIGTERM or kill -9) every few seconds while the stream is produced, and two
`rankstream api` processes, each ready on its own (hot boards replayed from update_cache): one
started before the stream, one in the middle of it. At the end Redis and the dead-letter topic
equal the model, and both nodes answer every route alike and as the model says."""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from common.settings import Settings
from rankstream.stack import free_port
from tests.conftest import own_topics
from tests.helpers import (
    applied_so_far,
    check_dlq,
    wait_applied_and_committed,
    wait_for,
    worker_env,
)
from tests.integration.test_api_oracle import check_board
from tests.integration.test_cluster_ops import PacedProducer
from tests.integration.test_hot_boards import HOT, write_config
from tests.oracle import (
    BOARDS,
    RANGED_BOARDS,
    SHARDED_BOARDS,
    Model,
    compare_redis,
    generate,
    now_ms,
    run_model,
)

ON_CLUSTER = pytest.mark.parametrize("topology", ["cluster"], indirect=True)
pytestmark = [pytest.mark.integration, pytest.mark.slow, ON_CLUSTER]
ROOT = Path(__file__).resolve().parents[2]
EVENTS = 27_000
PRODUCE_S = 20.0  # 8 churn steps: the chaos suite churns longer (worker-churn)
STEP_S = 2.5  # a worker joins, STEP_S later one leaves, and so on
STEPS = 8  # the stream is released a ninth at a time, one more ninth after each step
COLD = ["gift:r1", "score:s1", "capped:c1", "ranged:g1"]  # read from Redis by both nodes


class Process:
    """A `rankstream` subprocess with its stderr in a file (a pipe could fill and block it)."""

    def __init__(self, command: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        argv = [sys.executable, "-m", "rankstream.cli", command]
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._out)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> str:
        """Kill it if still running; its stderr."""
        self.kill()
        self._out.close()
        return self.log.read_text(errors="replace")


class ApiNode(Process):
    def __init__(self, settings: Settings, log: Path) -> None:
        self.port = free_port()
        env = {
            **worker_env(settings),
            "RANKSTREAM_API_PORT": str(self.port),
            "RANKSTREAM_API_ADMIN_PORT": str(free_port()),
            "RANKSTREAM_API_HOST": "127.0.0.1",
        }
        super().__init__("api", env, log)
        self.base = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as resp:  # noqa: S310 - loopback
                return int(resp.status), orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), orjson.loads(exc.read())
        except OSError:
            return 0, None  # not listening yet

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(  # noqa: S310 - loopback
            self.base + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
            return int(resp.status), orjson.loads(resp.read())


@pytest.fixture
def many_settings(make_settings, tmp_path: Path) -> Iterator[Settings]:
    settings: Settings = make_settings(boards=write_config(tmp_path, hot=True))
    with own_topics(settings):
        yield settings


def query(inst: str) -> str:
    """The query naming a window instance (`day:2026-11-23` -> window=day&period=2026-11-23)."""
    return "window=total" if inst == "total" else "window={}&period={}".format(*inst.split(":", 1))


def hot_routes(model: Model) -> list[str]:
    """Every hot window instance the model holds: its whole page, and a member's answers."""
    routes = []
    for board, windows in HOT.items():
        for inst, members in model.state.get(board, {}).items():
            window = inst.split(":", 1)[0]
            if window not in windows or not members:
                continue
            where = query(inst)
            member = model.ranking(board, inst)[len(members) // 2]
            routes += [
                f"/v1/boards/{board}/top?{where}&limit=500",
                f"/v1/boards/{board}/members/{member}?{where}",
                f"/v1/boards/{board}/members/{member}/around?{where}&n=4",
                f"/v1/boards/{board}/top?{where}&limit=5&offset=3&me={member}&ties=shared",
            ]
    return routes


def cold_routes(model: Model) -> list[str]:
    routes = []
    for board in COLD:
        members = model.state.get(board, {}).get("total", {})
        member = sorted(members)[len(members) // 2]
        routes += [
            f"/v1/boards/{board}/top?limit=50",
            f"/v1/boards/{board}/members/{member}",
            f"/v1/boards/{board}/members/{member}/around?n=3",
            f"/v1/boards/{board}/count?min=0&max=2000",
            f"/v1/boards/{board}/rank?score=100",
        ]
    return routes


def check_hot_page(body: dict[str, Any], model: Model, board: str, inst: str) -> None:
    """A whole hot page (from memory) equals the model: members, scores, ranks, seq."""
    members = model.state[board][inst]
    order = model.ranking(board, inst)
    assert body["source"] == "memory", body["source"]
    assert body["seq"] == model.seq[board] and body["total"] == len(order)
    got = [(i["rank"], i["member"], float(i["score"])) for i in body["items"]]
    assert got == [(r, m, float(members[m][0])) for r, m in enumerate(order[:500], 1)], (board, inst)


def caught_up(node: ApiNode, model: Model) -> bool:
    """Every hot board in the node's memory reflects the model's last seq."""
    status, body = node.get("/readyz")
    return status == 200 and all(body["boards"][b]["seq"] == model.seq[b] for b in HOT)


def exact_against_model(node: ApiNode, model: Model) -> int:
    """Every route of the cold boards (tests/integration/test_api_oracle.py), over HTTP."""

    async def go() -> int:
        async with aiohttp.ClientSession(base_url=node.base) as http:
            rng = random.Random(3)
            checked = 0
            for board in COLD[:2]:  # a ClientSession answers what check_board asks of a TestClient
                checked += await check_board(http, model, board, rng)  # type: ignore[arg-type]
            return checked

    return asyncio.run(go())


def test_three_churning_workers_and_two_api_nodes_end_exact(
    many_settings, rclient, consumer_factory, tmp_path
):
    settings = many_settings
    start = now_ms()
    messages = list(
        generate(seed=51, total=EVENTS, now_ms=start, boards=[*BOARDS, *RANGED_BOARDS, *SHARDED_BOARDS])
    )
    model = run_model(messages, start)
    target = sum(model.seq.values())
    processes: list[Process] = []
    serial = 0

    def start_worker() -> Process:
        nonlocal serial
        serial += 1
        env = worker_env(settings, worker_id=f"pod-{serial}")
        worker = Process("worker", env, tmp_path / f"worker{serial}.log")
        processes.append(worker)
        return worker

    def start_node(name: str) -> ApiNode:
        node = ApiNode(settings, tmp_path / f"api-{name}.log")
        processes.append(node)
        return node

    def note_ready(name: str, node: ApiNode, started: float) -> bool:
        status, body = node.get("/readyz")
        if status == 200 and name not in ready:
            ready[name] = (time.monotonic() - started, body)
        return status == 200

    workers = [start_worker() for _ in range(3)]
    left: list[tuple[str, float]] = []  # (how, seconds it took)
    ready: dict[str, tuple[float, Any]] = {}  # node -> (seconds after its start, its readyz body)
    try:
        first = start_node("a")
        first_started = time.monotonic()
        wait_for(lambda: note_ready("a", first, first_started), 60, "node a ready")
        second: ApiNode | None = None
        with PacedProducer(settings, messages, seconds=PRODUCE_S, gated=True) as producer:
            for step in range(1, STEPS + 1):  # each step happens mid-stream, however long it takes
                producer.release(step / (STEPS + 1))
                time.sleep(STEP_S)
                if step % 2:  # one joins: the group rebalances partitions onto it
                    workers.append(start_worker())
                else:  # one leaves, the oldest: a clean SIGTERM, or a kill -9 every other time
                    leaving = workers.pop(0)
                    began = time.monotonic()
                    if step % 4 == 2:
                        assert leaving.terminate() == 0
                        left.append(("SIGTERM", time.monotonic() - began))
                    else:
                        leaving.kill()
                        left.append(("kill -9", time.monotonic() - began))
                if step == 4:  # the second node starts mid-stream
                    second = start_node("b")
                    second_started = time.monotonic()
                if second is not None and "b" not in ready:
                    note_ready("b", second, second_started)
            producer.release(1.0)
            producer.join()
            applied_at_end = applied_so_far(rclient, settings)
        assert second is not None
        assert "b" in ready, "node b was not ready while the stream went on"
        wait_applied_and_committed(rclient, settings, target, timeout=120)
        assert [how for how, _ in left] == ["SIGTERM", "kill -9"] * (STEPS // 4)
        compare_redis(rclient, settings.key_prefix, model)
        check_dlq(consumer_factory, settings, model, exact=True)

        nodes = {"a": first, "b": second}
        for name, node in nodes.items():
            wait_for(functools.partial(caught_up, node, model), 30, f"node {name}'s memory caught up")
        # both nodes answer every route alike: hot boards from memory, the rest from Redis
        routes = [*hot_routes(model), *cold_routes(model)]
        answers = {name: [node.get(path) for path in routes] for name, node in nodes.items()}
        for path, a, b in zip(routes, answers["a"], answers["b"], strict=True):
            assert a == b, path
            assert a[0] == 200, (path, a)
        lookups = [(b, [*sorted(model.state[b]["total"])[:7], "ghost"]) for b in [*HOT, *COLD]]
        for board, asked in lookups:
            path = f"/v1/boards/{board}/members/lookup"
            assert first.post(path, {"members": asked}) == second.post(path, {"members": asked}), board
        # and as the model says
        for board, windows in HOT.items():
            for inst in model.state.get(board, {}):
                if inst.split(":", 1)[0] in windows and model.state[board][inst]:
                    status, body = first.get(f"/v1/boards/{board}/top?{query(inst)}&limit=500")
                    assert status == 200
                    check_hot_page(body, model, board, inst)
        checked = exact_against_model(second, model)
        assert checked > 300
        for node in nodes.values():
            assert node.terminate() == 0
        print(f"\nworkers started {serial}, left {left}; {applied_at_end}/{target} applied at the end"
              f"\nready after (s, readyz): {ready}")  # fmt: skip
        for board in HOT:  # ready means complete: each node had caught up to Redis' seq when it started
            for _, body in ready.values():
                progress = body["boards"][board]
                assert progress["ready"] and progress["seq"] >= progress["target_seq"], progress
        assert ready["b"][1]["boards"]["gift:r0"]["target_seq"] > 0  # b started on boards holding data
    finally:
        logs = {p.log.name: p.close() for p in processes}
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
