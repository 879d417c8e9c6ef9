"""HTTP caching of read answers on real Redis (docs/http-api.md#caching): every read carries
Cache-Control (public; no-store for nocache=1; private for me=) and an ETag; If-None-Match that
still matches gets a 304 without a Redis read (hot and warm boards: no Redis call at all; any
other board: one GET of its seq); parameter order and unknown parameters change neither the ETag
nor what is kept; a write changes the ETag."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from api.state import APP_STATE
from common.boards import load_boards
from common.events import Op, UpdateEvent
from common.settings import Settings
from rankstream.topics import ensure_topics
from tests.helpers import backfill
from worker.apply import Applier

pytestmark = pytest.mark.integration
CONFIG = "timezone: UTC\ntypes:\n  gift: {windows: [total, day]}\n"
HOT = 'hot:\n  - {board: "gift:h", windows: [total]}\n'
NOW = 1_795_300_000_000
PUBLIC = "public, max-age=1, stale-while-revalidate=5"


def fill(settings: Settings, client: redis.Redis, board: str, start: int, count: int) -> None:
    applier = Applier(client, load_boards(settings.boards), settings.key_prefix, 600_000)
    events = [
        (UpdateEvent(f"{board}-{i}", board, "gift", f"m{i % 40}", Op.INCR, float(i % 7 + 1), None,
                     b'{"n":1}' if i % 5 == 0 else None), NOW + i)
        for i in range(start, start + count)
    ]  # fmt: skip
    applier.apply(events)


def reads(client: redis.Redis) -> dict[str, int]:
    """Calls so far of the commands an answer's read sends (a script) and a seq check (GET)."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha_ro", "get")}


async def with_node(settings: Settings, body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async with TestClient(TestServer(create_app(settings, load_boards(settings.boards)))) as http:
        while (await http.get("/readyz")).status != 200:  # noqa: ASYNC110 - polling a probe, as Kubernetes does
            await asyncio.sleep(0.05)
        await body(http)


def config(tmp_path: Path, hot: bool) -> Path:
    path = tmp_path / ("hot.yaml" if hot else "cold.yaml")
    path.write_text(CONFIG + (HOT if hot else ""))
    return path


@pytest.mark.parametrize("board", ["gift:h", "gift:w"])  # hot (memory), warm (Redis, kept)
def test_a_kept_answer_revalidates_with_a_304_and_no_redis_call(make_settings, tmp_path, rclient, board):
    settings = make_settings(boards=config(tmp_path, hot=True))
    ensure_topics(settings)
    fill(settings, rclient, board, 0, 200)
    backfill(settings, rclient)
    path = f"/v1/boards/{board}/top?limit=5&order=desc"

    async def check(http: TestClient[Any, Any]) -> None:
        first = await http.get(path)
        assert first.status == 200 and first.headers["Cache-Control"] == PUBLIC
        tag, body = first.headers["ETag"], await first.read()
        # the same answer whatever the parameters' order, an unknown one ignored: what is kept
        # for the first request, no second read nor entry
        app = http.app
        assert app is not None
        state = app[APP_STATE]
        before, kept = reads(rclient), (len(state.hot_answers), state.warm.size)
        again = await http.get(f"/v1/boards/{board}/top?order=desc&utm=x&limit=5")
        assert again.headers["ETag"] == tag and await again.read() == body
        assert reads(rclient)["evalsha_ro"] == before["evalsha_ro"]
        assert (len(state.hot_answers), state.warm.size) == kept
        before = reads(rclient)
        for _ in range(3):
            held = await http.get(path, headers={"If-None-Match": f'W/"x", {tag}'})
            assert held.status == 304 and await held.read() == b""
            assert held.headers["ETag"] == tag and held.headers["Cache-Control"] == PUBLIC
        assert reads(rclient)["evalsha_ro"] == before["evalsha_ro"]  # no read of the board
        other = await http.get(path, headers={"If-None-Match": '"stale"'})
        assert other.status == 200 and await other.read() == body
        private = await http.get(f"/v1/boards/{board}/top?limit=5&me=m3")
        assert private.headers["Cache-Control"].startswith("private, ")
        # a route that does not read `me` is public whatever the query says
        member = await http.get(f"/v1/boards/{board}/members/m3?me=m4")
        assert member.headers["Cache-Control"] == PUBLIC
        fresh = await http.get(f"{path}&nocache=1")
        assert fresh.headers["Cache-Control"] == "no-store" and "ETag" not in fresh.headers

    asyncio.run(with_node(settings, check))


def test_any_other_board_revalidates_with_one_get_and_a_write_changes_its_etag(
    make_settings, tmp_path, rclient
):
    settings = make_settings(boards=config(tmp_path, hot=False), warm_cache_mb=0)  # nothing kept
    ensure_topics(settings)
    fill(settings, rclient, "gift:c", 0, 200)
    path = "/v1/boards/gift:c/members/m3"

    async def check(http: TestClient[Any, Any]) -> None:
        first = await http.get(path)
        tag = first.headers["ETag"]
        before = reads(rclient)
        held = await http.get(path, headers={"If-None-Match": tag})
        assert held.status == 304
        after = reads(rclient)
        assert after["evalsha_ro"] == before["evalsha_ro"] and after["get"] >= before["get"] + 1
        # a shared-ties page is two reads of Redis: no ETag (each may see another state)
        shared = await http.get("/v1/boards/gift:c/top?ties=shared")
        assert shared.status == 200 and "ETag" not in shared.headers
        fill(settings, rclient, "gift:c", 200, 1)  # a write: the board's seq moves
        changed = await http.get(path, headers={"If-None-Match": tag})
        assert changed.status == 200 and changed.headers["ETag"] != tag

    asyncio.run(with_node(settings, check))
