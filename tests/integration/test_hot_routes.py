"""Every read route answers the same from memory (hot) as from Redis, rank for rank, in both
orders and both tie modes; and memory drops period instances past their retention."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from api.hotboards import HotBoards
from api.hotwindow import HotWindow
from common.boards import load_boards
from common.events import Op, UpdateEvent
from common.store.encoding import TieMode
from rankstream.topics import ensure_topics
from tests.helpers import backfill
from worker.apply import Applier

# one Redis server: memory's answers need none, and Redis' on a cluster are test_api_oracle.py's
pytestmark = pytest.mark.integration
CONFIG = """
timezone: UTC
types:
  gift: {windows: [total, day], tie_break: first}
  score: {windows: [total], order: asc, tie_break: last}
"""
HOT = 'hot:\n  - {board: "gift:h", windows: [total, day]}\n  - {board: "score:h", windows: [total]}\n'


def test_memory_and_redis_answer_every_route_identically(make_settings, tmp_path, rclient):
    cold_path, hot_path = tmp_path / "cold.yaml", tmp_path / "hot.yaml"
    cold_path.write_text(CONFIG)
    hot_path.write_text(CONFIG + HOT)
    hot = make_settings(boards=hot_path)
    cold = hot.model_copy(update={"boards": cold_path})
    ensure_topics(hot)
    rng = random.Random(9)
    applier = Applier(rclient, load_boards(hot_path), hot.key_prefix, 600_000)
    now = 1_795_300_000_000
    events = []
    for i in range(3000):
        board = rng.choice(["gift:h", "score:h"])
        op = rng.choice([Op.INCR, Op.INCR, Op.SET, Op.BEST, Op.DELETE])
        meta = b'{"n":1}' if rng.random() < 0.1 else None
        event = UpdateEvent(f"e{i}", board, board.split(":")[0], f"m{rng.randrange(150)}", op,
                            float(rng.randint(-5, 40)), None, meta)  # fmt: skip
        events.append((event, now + rng.randrange(3) * 1000))  # many equal tie times too
    applier.apply(events)
    backfill(hot, rclient)

    queries = []
    for board in ("gift:h", "score:h"):
        for order in ("asc", "desc"):
            for ties in ("ordinal", "shared"):
                q = f"order={order}&ties={ties}"
                queries += [f"/v1/boards/{board}/top?{q}&limit=50&offset={o}&me=m{o}" for o in (0, 37, 140)]
                queries += [f"/v1/boards/{board}/members/m{m}?{q}" for m in range(0, 150, 7)]
                queries += [f"/v1/boards/{board}/members/m{m}/around?{q}&n=4" for m in range(0, 150, 11)]
                queries += [f"/v1/boards/{board}/rank?{q}&score={s}" for s in (-3, 0, 7, 25, 99)]
        queries += [f"/v1/boards/{board}/count?min={lo}&max={hi}" for lo, hi in ((-5, 5), (0, 0), (10, 1e9))]
    queries += ["/v1/boards/gift:h/top?window=day&period=2026-11-21&limit=20"]
    lookups = [("gift:h", [f"m{i}" for i in range(0, 150, 3)]), ("score:h", ["m1", "ghost", "m2"])]

    async def answers(settings: Any) -> list[Any]:
        app = create_app(settings, load_boards(settings.boards))
        out = []
        async with TestClient(TestServer(app)) as http:
            while (await http.get("/readyz")).status != 200:  # noqa: ASYNC110 - polling a probe, as Kubernetes does
                await asyncio.sleep(0.05)
            for path in queries:
                resp = await http.get(path)
                out.append((resp.status, await resp.json()))
            for board, members in lookups:
                resp = await http.post(f"/v1/boards/{board}/members/lookup", json={"members": members})
                out.append((resp.status, await resp.json()))
        return out

    from_memory, from_redis = asyncio.run(answers(hot)), asyncio.run(answers(cold))
    assert [b.get("source") for s, b in from_memory if s == 200] == ["memory"] * sum(
        1 for s, _ in from_memory if s == 200
    )
    compared = 0
    for (s1, b1), (s2, b2) in zip(from_memory, from_redis, strict=True):
        assert s1 == s2
        if s1 == 200:
            b1.pop("source"), b2.pop("source")
            assert b1 == b2
            compared += 1
    assert compared > 300


def test_memory_drops_periods_past_retention(settings, tmp_path):
    path = tmp_path / "boards.yaml"
    path.write_text("timezone: UTC\ntypes:\n  gift: {windows: [total, day], retention: {day: 3}}\n" + \
                    'hot:\n  - {board: "gift:h", windows: [total, day]}\n')  # fmt: skip
    manager = HotBoards(settings.model_copy(update={"boards": path}), load_boards(path))
    board = manager.boards["gift:h"]
    for instance in ("total", "day:2020-01-01", "day:2099-01-01"):
        board.instances[instance] = HotWindow(True, TieMode.INV)
    manager._drop_expired(board)
    assert sorted(board.instances) == ["day:2099-01-01", "total"]
