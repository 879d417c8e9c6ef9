"""The leaderboard routes of CONTRACT section 6."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from api import queries
from api.errors import ApiError
from api.memory_reader import MemoryBoardReader
from api.params import MAX_AROUND, MAX_LIMIT, Target, int_param, member_id, score_param, target
from api.reader import BoardReader
from api.redis_reader import RedisBoardReader
from api.state import APP_STATE
from common.store.keys import BoardKeys

# any segment reaches the handler, so a malformed id gets its own 400 rather than a route miss
ROUTE_PREFIX = "/v1/boards/{board:[^/]+}"


def json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def reader_for(request: web.Request, where: Target) -> BoardReader:
    """Hot board windows answer from memory (and never touch Redis); the rest from Redis."""
    state = request.app[APP_STATE]
    hot = state.hot.hot_window(where.board, where.window)
    if hot is not None:
        if not hot.ready:
            raise ApiError(503, "warming_up", "this node is still loading the board into memory")
        state.metrics.hot_reads.labels(where.board).inc()
        return MemoryBoardReader(hot, where.instance)
    keys = BoardKeys(state.key_prefix, where.board)
    return RedisBoardReader(state.redis, keys, where)


async def top(request: web.Request) -> web.Response:
    where = target(request)
    limit = int_param(request, "limit", 10, 1, MAX_LIMIT)
    offset = int_param(request, "offset", 0, 0, 10**9)
    me = member_id(request.query["me"]) if "me" in request.query else None
    reader = reader_for(request, where)
    state = request.app[APP_STATE]
    if reader.source == "redis" and request.query.get("nocache") != "1":
        key = (where.board, where.instance, where.reverse, where.ties, offset, limit)

        async def load() -> tuple[dict[str, Any], bytes]:
            page, ranks = await queries.ranked_page(reader, where, offset, limit)
            answer = queries.top_answer(where, page, ranks, reader.source)
            return answer, orjson.dumps(answer)  # a hit serves these bytes as they are

        (answer, raw), hit = await state.top_cache.get(key, load)
        state.metrics.cache.labels("hit" if hit else "miss").inc()
    elif reader.source == "memory":
        # keyed by the board's version: any change makes a new key, so a page is never stale
        hot = state.hot.boards[where.board]
        hot_key = (where.board, where.instance, where.reverse, where.ties, offset, limit, hot.version)
        cached = state.hot_pages.get(hot_key)
        if cached is None:
            page, ranks = await queries.ranked_page(reader, where, offset, limit)
            answer = queries.top_answer(where, page, ranks, reader.source)
            cached = state.hot_pages[hot_key] = (answer, orjson.dumps(answer))
        answer, raw = cached
    else:
        page, ranks = await queries.ranked_page(reader, where, offset, limit)
        answer = queries.top_answer(where, page, ranks, reader.source)
        raw = b""
    if me is None and raw and not where.trend:
        return web.Response(body=raw, content_type="application/json")
    body = dict(answer)
    if me is not None:
        body["me"] = await queries.me_item(reader, where, me)
    return json(await _trend(request, where, body))


async def _trend(request: web.Request, where: Target, body: dict[str, Any]) -> dict[str, Any]:
    """trend=1: prev_rank from the previous period, read where that period lives (memory or Redis)."""
    if not where.trend:
        return body
    previous = None if where.previous is None else reader_for(request, where.previous)
    return await queries.with_trend(previous, where, body)


async def member(request: web.Request) -> web.Response:
    where = target(request)
    name = member_id(request.match_info["member"])
    return json(
        await _trend(request, where, await queries.member_answer(reader_for(request, where), where, name))
    )


async def around(request: web.Request) -> web.Response:
    where = target(request)
    name = member_id(request.match_info["member"])
    n = int_param(request, "n", 5, 0, MAX_AROUND)
    return json(
        await _trend(request, where, await queries.around_answer(reader_for(request, where), where, name, n))
    )


async def lookup(request: web.Request) -> web.Response:
    where = target(request)
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise ApiError(400, "bad_body", 'the body must be JSON: {"members": [...]}') from None
    members = body.get("members") if isinstance(body, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ApiError(400, "bad_body", 'the body must be {"members": [<member id>, ...]}')
    if not 1 <= len(members) <= MAX_LIMIT:
        raise ApiError(400, "bad_body", f"members must hold 1 to {MAX_LIMIT} ids")
    names = [member_id(m) for m in members]
    return json(
        await _trend(request, where, await queries.lookup_answer(reader_for(request, where), where, names))
    )


async def count(request: web.Request) -> web.Response:
    where = target(request)
    low = score_param(request, "min", float("-inf"))
    high = score_param(request, "max", float("inf"))
    return json(await queries.count_answer(reader_for(request, where), where, low, high))


async def rank(request: web.Request) -> web.Response:
    where = target(request)
    score = score_param(request, "score")
    if score in (float("inf"), float("-inf")):
        raise ApiError(400, "bad_parameter", "score must be finite")
    return json(await queries.rank_answer(reader_for(request, where), where, score))


def add_routes(app: web.Application) -> None:
    app.router.add_get(f"{ROUTE_PREFIX}/top", top)
    app.router.add_get(f"{ROUTE_PREFIX}/members/{{member:[^/]+}}", member)
    app.router.add_get(f"{ROUTE_PREFIX}/members/{{member:[^/]+}}/around", around)
    app.router.add_post(f"{ROUTE_PREFIX}/members/lookup", lookup)
    app.router.add_get(f"{ROUTE_PREFIX}/count", count)
    app.router.add_get(f"{ROUTE_PREFIX}/rank", rank)
