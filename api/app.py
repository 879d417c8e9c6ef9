"""The aiohttp application: routes, probes, metrics, the spec, error handling."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources

import orjson
import redis
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.access import Access
from api.front import Front, InFlight
from api.hotboards import HotBoards
from api.httpcache import cache_control
from api.league import add_routes as add_league_routes
from api.live import LIVE, LiveBoards
from api.pages import add_pages
from api.routes import add_routes, json
from api.state import APP_STATE, ApiState
from api.warm import ChangeFeed, WarmCache
from common.boards import BoardsConfig
from common.clock import Clock, system_ms
from common.settings import Settings
from common.store.cluster import open_pipe
from common.store.keys import BoardKeys
from common.store.shards import shard_names

_log = logging.getLogger(__name__)
READS_NAME, CHANGES_NAME = "rankstream-api", "rankstream-api-changes"  # CLIENT LIST names
# Of the shutdown deadline (api/main.py), kept for what comes after the cleanup steps below:
EXIT_RESERVE_S = 0.5  # the interpreter's own exit after the last step (Kafka clients destroyed)
REDIS_CLOSE_S = 0.5  # closing the Redis client, after the replay thread
# a request's body (a lookup's, the one route that takes one) above this: 413. 500 member ids of
# 128 characters, each JSON-escaped, fit within it
MAX_BODY_BYTES = 1 << 20
# a request's line and each header line above this, or more headers than MAX_HEADERS: 400
MAX_LINE_BYTES, MAX_HEADERS = 8190, 64


IN_FLIGHT: web.AppKey[InFlight] = web.AppKey("rankstream_in_flight", InFlight)
ADMIN_APP: web.AppKey[web.Application] = web.AppKey("rankstream_admin_app", web.Application)


async def livez(request: web.Request) -> web.Response:
    return json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """503 with per-board replay progress until every hot board is in memory."""
    state = request.app[APP_STATE]
    try:
        redis_ok = await state.redis.call("PING") in {b"PONG", "PONG"}
    except redis.RedisError:  # away, loading, refusing: reported, not raised
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

    stopping = asyncio.Event()

    async def watch() -> None:
        while not stopping.is_set():
            state.hot.tick()  # boards read often enough turn hot, idle ones leave memory
            state.metrics.hot_ready.set(1 if state.hot.ready else 0)
            # a copy: boards turn hot and leave memory meanwhile (the loop runs between the reads)
            for board, hot in list(state.hot.boards.items()):
                state.metrics.replayed.labels(board).set(hot.replayed)
                try:
                    names = shard_names(board, hot.shards)  # a sharded board's seq: the shards' sum
                    got = [await state.redis.call("GET", BoardKeys(state.key_prefix, n).seq) for n in names]
                    seq = sum(int(value or 0) for value in got)
                    state.metrics.hot_lag.labels(board).set(max(seq - hot.seq, 0))
                    state.hot.checked(board, seq)
                except redis.RedisError:  # away, loading, refusing: reported, not raised
                    pass  # the lag is unknown while Redis is away; reads from memory go on
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 1.0)

    task = asyncio.create_task(watch())
    yield
    # each step waits at most what is left of the shutdown deadline, less what the later steps
    # need: a Redis that stalls or a broker that is unreachable must not hold the exit past it.
    # Nothing here is awaited unbounded (asyncio.wait does not wait for a cancellation to land).
    keep = REDIS_CLOSE_S + EXIT_RESERVE_S
    # the event too: Python 3.11's wait_for (which redis-py uses) loses a cancellation that lands
    # as the awaited reply arrives, and the loop would go on
    stopping.set()
    task.cancel()
    await asyncio.wait({task}, timeout=state.deadline.timeout(1.0, keep))
    state.hot.request_stop()
    # the join in a thread of its own: it must not stop the loop (cancelled requests unwind)
    if state.hot.running and not await asyncio.to_thread(state.hot.stop, state.deadline.timeout(10.0, keep)):
        _log.warning("hot-board replay thread still blocked: abandoned")


async def follow_changes(app: web.Application, feed: ChangeFeed) -> AsyncIterator[None]:
    """The warm cache's change feed (api/warm.py), for the life of the app."""
    stopping = asyncio.Event()
    task = asyncio.create_task(feed.run(stopping))
    yield
    stopping.set()
    await asyncio.wait({task}, timeout=app[APP_STATE].deadline.timeout(1.0, REDIS_CLOSE_S + EXIT_RESERVE_S))


async def follow_live(app: web.Application) -> AsyncIterator[None]:
    """The live streams end as the shutdown starts, so that the drain does not wait for them
    (clients reconnect to another node)."""
    live, loop = app[LIVE], asyncio.get_running_loop()

    def on_start() -> None:
        loop.call_soon_threadsafe(live.close)

    app[APP_STATE].deadline.when_started(on_start)
    ticker = asyncio.create_task(live.keep_alive())
    yield
    live.close()
    ticker.cancel()


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[APP_STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@cache
def openapi_json() -> bytes:
    spec = yaml.safe_load(resources.files("api").joinpath("openapi.yaml").read_text(encoding="utf-8"))
    return orjson.dumps(spec)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_json(), content_type="application/json")


PROBES = (("/livez", livez), ("/readyz", readyz))  # on the public port and on the admin port


def admin_app(state: ApiState) -> web.Application:
    """The admin port's app: the node's metrics and its spec, and the probes; served on a port of
    its own so that only the public routes face clients (api/main.py)."""
    front = Front(state.metrics, InFlight())  # not drained: scrapes may come until the end
    app = web.Application()
    app[APP_STATE] = state
    for path, handler in (*PROBES, ("/metrics", metrics), ("/openapi.json", openapi)):
        front.add(app, "GET", path, handler)
    front.catch_all(app)
    return app


def create_app(settings: Settings, boards: BoardsConfig, clock: Clock = system_ms) -> web.Application:
    """The public app (the board routes, the probes); `app[ADMIN_APP]` is the admin port's, on
    the same state."""
    client = open_pipe(
        settings.redis_url.get_secret_value(), settings.redis_cluster, connect_timeout=1, reply_timeout=2,
        name=READS_NAME, tls=settings.redis_tls(),
    )  # fmt: skip
    state = ApiState(
        boards=boards,
        redis=client,
        key_prefix=settings.key_prefix,
        warm=WarmCache(0 if settings.top_cache_ttl_s == 0 else settings.warm_cache_mb * 2**20, clock),
        hot=HotBoards(settings, boards, clock),
        max_future_skew_s=settings.max_future_skew_s,
        clock=clock,
        cache_public=cache_control(
            settings.http_max_age_s, settings.http_stale_while_revalidate_s, private=False
        ),
        cache_private=cache_control(
            settings.http_max_age_s, settings.http_stale_while_revalidate_s, private=True
        ),
        access=Access.of(settings),
    )
    tracker = InFlight()
    front = Front(state.metrics, tracker, state.access)
    # no middleware: api/front.py wraps each route instead
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[APP_STATE] = state
    app[IN_FLIGHT] = tracker
    for path, handler in PROBES:
        front.add(app, "GET", path, handler)
    add_routes(app, front)
    add_league_routes(app, front)
    add_pages(app, front)
    front.catch_all(app)
    live = app[LIVE] = LiveBoards(settings.api_stream_max, settings.api_stream_keepalive_s, clock)
    state.hot.on_change.append(live.changed)
    state.metrics.watch_live(live)
    app.cleanup_ctx.append(follow_live)
    app[ADMIN_APP] = admin_app(state)
    app.cleanup_ctx.append(follow_hot_boards)
    state.metrics.watch_hot(state.hot)
    state.hot.on_promoted.append(state.warm.drop)  # what the warm cache kept of it: memory answers now
    if (
        state.warm.enabled or live.max_streams
    ):  # the change notices: what the warm cache drops, what streams push
        feed = ChangeFeed(
            settings.key_prefix,
            state.warm,
            settings.warm_check_s,
            client,
            CHANGES_NAME,
            shards_of=boards.shards_of,
        )
        feed.on_change.append(live.changed)
        app.cleanup_ctx.append(functools.partial(follow_changes, feed=feed))
        state.metrics.watch_warm(state.warm, feed)

    async def close_redis(app: web.Application) -> None:
        closing = asyncio.ensure_future(client.aclose())
        done, _ = await asyncio.wait({closing}, timeout=state.deadline.timeout(5.0, EXIT_RESERVE_S))
        if not done:
            closing.cancel()
            _log.warning("redis client not closed by the deadline: abandoned")
        elif (exc := closing.exception()) is not None:
            _log.warning("redis client close failed", extra={"error": str(exc)})

    app.on_cleanup.append(close_redis)
    return app
