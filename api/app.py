"""The aiohttp application: routes, probes, metrics, the spec, error handling."""

from __future__ import annotations

from functools import cache
from importlib import resources

import orjson
import redis.asyncio as aioredis
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.cache import SingleFlightCache
from api.errors import error_middleware
from api.routes import add_routes, json
from api.state import APP_STATE, ApiState
from common.boards import BoardsConfig
from common.settings import Settings


async def livez(request: web.Request) -> web.Response:
    return json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[APP_STATE]
    try:
        redis_ok = bool(await state.redis.ping())
    except (aioredis.ConnectionError, aioredis.TimeoutError):
        redis_ok = False
    # Redis is reported, not required: without it only non-hot boards fail (503 per request),
    # while a node that took itself out of service would stop serving hot boards from memory too
    return json({"ok": True, "redis": redis_ok})


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
    )
    # outermost first: metrics see the status the error middleware turned an exception into
    app = web.Application(middlewares=[state.metrics.middleware(), error_middleware])
    app[APP_STATE] = state
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    add_routes(app)

    async def close_redis(app: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close_redis)
    return app
