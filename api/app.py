"""The aiohttp application: routes, probes, metrics, error handling."""

from __future__ import annotations

import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.errors import error_middleware
from api.routes import add_routes, json
from api.state import APP_STATE, ApiState
from common.boards import BoardsConfig
from common.settings import Settings

REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)


async def livez(request: web.Request) -> web.Response:
    return json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[APP_STATE]
    try:
        redis_ok = bool(await state.redis.ping())
    except (aioredis.ConnectionError, aioredis.TimeoutError):
        redis_ok = False
    # without Redis non-hot boards answer 503 anyway; readiness stays about this node's own state
    return json({"ok": True, "redis": redis_ok})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(settings: Settings, boards: BoardsConfig, client: aioredis.Redis) -> web.Application:
    app = web.Application(middlewares=[error_middleware])
    app[APP_STATE] = ApiState(boards=boards, redis=client, key_prefix=settings.key_prefix)
    app[REGISTRY_KEY] = CollectorRegistry()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    add_routes(app)

    async def close_redis(app: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close_redis)
    return app
