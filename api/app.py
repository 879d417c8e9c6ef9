"""The aiohttp application: routes, probes, metrics, the spec, error handling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources

import orjson
import redis.asyncio as aioredis
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.cache import SingleFlightCache
from api.errors import error_middleware
from api.hotboards import HotBoards
from api.routes import add_routes, json
from api.state import APP_STATE, ApiState
from common.boards import BoardsConfig
from common.keys import BoardKeys
from common.settings import Settings


async def livez(request: web.Request) -> web.Response:
    return json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """503 with per-board replay progress until every hot board is in memory."""
    state = request.app[APP_STATE]
    try:
        redis_ok = bool(await state.redis.ping())
    except (aioredis.ConnectionError, aioredis.TimeoutError):
        redis_ok = False
    # Redis is reported, not required: without it only non-hot boards fail (503 per request),
    # while a node that took itself out of service would stop serving hot boards from memory too
    return json(
        {"ok": state.hot.ready, "redis": redis_ok, **state.hot.status()}, 200 if state.hot.ready else 503
    )


async def follow_hot_boards(app: web.Application) -> AsyncIterator[None]:
    """Start the replay thread; every second, publish replay progress and the lag behind Redis."""
    state = app[APP_STATE]
    state.hot.start(asyncio.get_running_loop())

    async def watch() -> None:
        while True:
            state.metrics.hot_ready.set(1 if state.hot.ready else 0)
            for board, hot in state.hot.boards.items():
                state.metrics.replayed.labels(board).set(hot.replayed)
                try:
                    seq = int(await state.redis.get(BoardKeys(state.key_prefix, board).seq) or 0)
                    state.metrics.hot_lag.labels(board).set(max(seq - hot.seq, 0))
                except (aioredis.ConnectionError, aioredis.TimeoutError):
                    pass  # the lag is unknown while Redis is away; reads from memory go on
            await asyncio.sleep(1.0)

    task = asyncio.create_task(watch())
    yield
    task.cancel()
    # bounded: a Redis that stalls (or a broker that hangs) must not hold the exit past the deadline
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, state.hot.stop), 12)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[APP_STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@cache
def openapi_json() -> bytes:
    spec = yaml.safe_load(resources.files("api").joinpath("openapi.yaml").read_text(encoding="utf-8"))
    return orjson.dumps(spec)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_json(), content_type="application/json")


def create_app(settings: Settings, boards: BoardsConfig, client: aioredis.Redis) -> web.Application:
    state = ApiState(
        boards=boards,
        redis=client,
        key_prefix=settings.key_prefix,
        top_cache=SingleFlightCache(settings.top_cache_ttl_s),
        hot=HotBoards(settings, boards),
        max_future_skew_s=settings.max_future_skew_s,
    )
    # outermost first: metrics see the status the error middleware turned an exception into
    app = web.Application(middlewares=[state.metrics.middleware(), error_middleware])
    app[APP_STATE] = state
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    add_routes(app)
    app.cleanup_ctx.append(follow_hot_boards)

    async def close_redis(app: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close_redis)
    return app
