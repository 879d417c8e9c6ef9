"""The leaderboard routes of docs/contract.md §6."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from api import queries
from api.errors import ApiError
from api.front import Front
from api.hotboards import HotBoard
from api.httpcache import NO_STORE, canonical, etag, headers, matches, respond
from api.memory_reader import MemoryBoardReader
from api.params import MAX_AROUND, MAX_LIMIT, Asked, Target, int_param, member_id, score_param, target
from api.reader import BoardReader
from api.redis_reader import RedisBoardReader, ShardedBoardReader
from api.state import APP_STATE
from common.ranking import Ties
from common.store.keys import BoardKeys

# any segment reaches the handler, so a malformed id gets its own 400 rather than a route miss
ROUTE_PREFIX = "/v1/boards/{board:[^/]+}"
MAX_READERS = 10_000  # Redis readers kept, one per (board, window instance) read
MAX_HOT_ANSWERS = 4096  # answers from memory kept, one per request's canonical form
MAX_REQUEST_KEYS = 20_000  # requests (path and query) seen lately -> their canonical form
# the parameters each route reads (api/params.py), sorted: what an answer's ETag covers
_TARGET = ("at", "order", "period", "ties", "trend", "window")
TOP_PARAMS = tuple(sorted((*_TARGET, "limit", "me", "offset")))
AROUND_PARAMS = tuple(sorted((*_TARGET, "n")))
COUNT_PARAMS = tuple(sorted((*_TARGET, "max", "min")))
RANK_PARAMS = tuple(sorted((*_TARGET, "score")))


def json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def reader_for(request: Asked, where: Target) -> BoardReader:
    """Hot board windows answer from memory (and never touch Redis); the rest from Redis."""
    state = request.app[APP_STATE]
    hot = state.hot.hot_window(where.board, where.window)
    if hot is not None and hot.serves(where.window, where.period_start_ms):  # (a period it holds)
        if not hot.ready:
            raise ApiError(503, "warming_up", "this node is still loading the board into memory")
        state.metrics.hot_read(where.board)
        return MemoryBoardReader(hot, where.instance)
    known = state.redis_readers.get((where.board, where.instance))
    if known is None:
        if len(state.redis_readers) >= MAX_READERS:
            state.redis_readers.clear()  # cheaper per read than an LRU; rebuilt as they are read
        if where.board_type.shards > 1:
            known = ShardedBoardReader(state.redis, state.key_prefix, where)
        else:
            known = RedisBoardReader(state.redis, BoardKeys(state.key_prefix, where.board), where)
        state.redis_readers[where.board, where.instance] = known
    return known


def control(request: web.Request, params: tuple[str, ...]) -> str:
    """The Cache-Control of a read answer: none kept for nocache=1, only the caller's for `me=`
    (on a route that reads it: `params`)."""
    state = request.app[APP_STATE]
    query = request.query
    if query.get("nocache") == "1":
        return NO_STORE
    return state.cache_private if "me" in params and "me" in query else state.cache_public


def warm(handler: Handler) -> Handler:
    """A GET route whose answers are kept, by the request's canonical form (api/httpcache.py): a
    hot board's from memory while its version stands (`answer`), any other board's by the warm
    cache (api/warm.py). A request seen before (the same path and query) is served what is kept
    for its canonical form, or a 304, before any parameter is parsed."""

    @functools.wraps(handler)
    async def serve(request: web.Request) -> web.StreamResponse:
        state = request.app[APP_STATE]
        board = request.match_info["board"]
        if state.hot.promoting:  # how often each board is read: the most read turn hot
            state.hot.rates.seen(board)
        key = state.request_keys.get(request.raw_path)
        if key is None:
            return await handler(request)
        hot = state.hot.boards.get(board)
        if hot is not None and hot.ready:
            kept = hot_kept(request, hot, key)
            if kept is not None:
                state.metrics.hot_read(hot.board)
                return kept
        found = state.warm.get(key)  # (a hot board's windows that are not hot)
        if found is not None:
            return respond(request, found.body, found.headers)
        return await handler(request)

    return serve


def hot_kept(request: web.Request, hot: HotBoard, key: str) -> web.Response | None:
    """The answer kept from `hot`'s memory for canonical form `key`, while the board has not
    changed and its period still holds; None if there is none."""
    state = request.app[APP_STATE]
    kept = state.hot_answers.get(key)
    if kept is None or kept[0] != hot.version or state.clock() >= kept[1]:
        return None
    return respond(request, kept[2], kept[3])


def tagger(form: str, where: Target, source: str) -> Callable[[list[int]], str]:
    """The ETag of the answer to the request of canonical form `form`, given the seqs it
    reflects (api/httpcache.py)."""
    previous = where.previous.instance if where.previous is not None else ""
    return lambda seqs: etag(form, where.instance, previous, source, seqs)


async def answer(
    request: web.Request,
    where: Target,
    reader: BoardReader,
    build: Callable[[], Awaitable[dict[str, Any]]],
    params: tuple[str, ...],
    *,
    reads: int = 1,
) -> web.Response:
    """`build()`'s answer with its caching headers (a 304 if the caller holds it), kept by the
    request's canonical form unless it says nocache=1: from memory while the board's version
    stands (unless it read the previous period, which may live in Redis: trend=1), from Redis by
    the warm cache.

    ETags: an answer from memory has one while memory stands between two of the board's batches
    (each shard's seq is then Redis' own at that seq); one from Redis, the seq it read, except a
    sharded board's (its shards are read one by one) and answers made of two reads (`me=`,
    `trend=1`, `reads`: the Redis reads the answer takes besides them)."""
    state = request.app[APP_STATE]
    if request.query.get("nocache") == "1":
        if state.access is not None:
            state.access.require_admin(request, "nocache=1")
        return respond(request, orjson.dumps(await build()), headers(None, NO_STORE))
    key = canonical(request, params)  # what is kept, and what the ETag covers
    if len(state.request_keys) >= MAX_REQUEST_KEYS:
        state.request_keys.clear()  # cheaper per read than an LRU; refilled as requests come
    state.request_keys[request.raw_path] = key
    scope = control(request, params)
    if reader.source == "memory":
        return await _from_memory(request, where, key, build, scope)
    found = state.warm.get(key)  # kept for another request of this canonical form
    if found is not None:
        return respond(request, found.body, found.headers)
    single = reads == 1 and not where.trend and "me" not in request.query  # one read: one state
    tag_of = tagger(key, where, "redis") if single and where.board_type.shards == 1 else None
    return await _from_redis(request, where, key, build, scope=scope, tag_of=tag_of)


async def _from_memory(
    request: web.Request, where: Target, key: str, build: Callable[[], Awaitable[dict[str, Any]]], scope: str
) -> web.Response:
    state = request.app[APP_STATE]
    hot = state.hot.boards[where.board]
    kept = hot_kept(request, hot, key)  # kept for another request of this canonical form
    if kept is not None:
        return kept
    version, seqs = hot.version, hot.settled_seqs()  # before the read: a change bumps them
    body = orjson.dumps(await build())
    tag = None if seqs is None or where.trend else tagger(key, where, "memory")(seqs)
    held = headers(tag, scope)
    if not where.trend:
        if len(state.hot_answers) >= MAX_HOT_ANSWERS:
            state.hot_answers.clear()  # cheaper per read than an LRU; refilled as they are read
        state.hot_answers[key] = (version, where.until_ms, body, held)
    return respond(request, body, held)


async def _from_redis(
    request: web.Request,
    where: Target,
    key: str,
    build: Callable[[], Awaitable[dict[str, Any]]],
    *,
    scope: str,
    tag_of: Callable[[list[int]], str] | None,
) -> web.Response:
    state = request.app[APP_STATE]
    if tag_of is not None and "If-None-Match" in request.headers:  # the seq first: one GET
        seq = await state.redis.call("GET", BoardKeys(state.key_prefix, where.board).seq)
        tag = tag_of([int(seq or 0)])
        if matches(request, tag):
            return respond(request, b"", headers(tag, scope))

    async def read() -> tuple[bytes, int]:
        body = await build()
        return orjson.dumps(body), int(body["seq"])

    kept = await state.warm.load(
        key, where.board, where.until_ms, read,
        lambda seq: headers(tag_of([seq]) if tag_of is not None else None, scope),
    )  # fmt: skip
    if kept is not None:
        return respond(request, kept.body, kept.headers)
    built = await build()
    read_tag = tag_of([int(built["seq"])]) if tag_of is not None else None
    return respond(request, orjson.dumps(built), headers(read_tag, scope))


@warm
async def top(request: web.Request) -> web.Response:
    where = target(request)
    limit = int_param(request, "limit", 10, 1, MAX_LIMIT)
    offset = int_param(request, "offset", 0, 0, 10**9)
    me = member_id(request.query["me"]) if "me" in request.query else None
    reader = reader_for(request, where)

    async def build() -> dict[str, Any]:
        page, ranks = await queries.ranked_page(reader, where, offset, limit)
        body = queries.top_answer(where, page, ranks, reader.source)
        if me is not None:
            body["me"] = await queries.me_item(reader, where, me)
        return await trend(request, where, body) if where.trend else body

    # ties=shared: the first item's rank is a second Redis read (api/queries.py ranked_page)
    return await answer(
        request, where, reader, build, TOP_PARAMS, reads=2 if where.ties is Ties.SHARED else 1
    )


async def trend(request: Asked, where: Target, body: dict[str, Any]) -> dict[str, Any]:
    """trend=1: prev_rank from the previous period, read where that period lives (memory or Redis)."""
    if not where.trend:
        return body
    previous = None if where.previous is None else reader_for(request, where.previous)
    return await queries.with_trend(previous, where, body)


@warm
async def member(request: web.Request) -> web.Response:
    where = target(request)
    name = member_id(request.match_info["member"])
    reader = reader_for(request, where)

    async def build() -> dict[str, Any]:
        return await trend(request, where, await queries.member_answer(reader, where, name))

    return await answer(request, where, reader, build, _TARGET)


@warm
async def around(request: web.Request) -> web.Response:
    where = target(request)
    name = member_id(request.match_info["member"])
    n = int_param(request, "n", 5, 0, MAX_AROUND)
    reader = reader_for(request, where)

    async def build() -> dict[str, Any]:
        return await trend(request, where, await queries.around_answer(reader, where, name, n))

    return await answer(request, where, reader, build, AROUND_PARAMS)


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
    access = request.app[APP_STATE].access
    if access is not None and len(members) > access.rules.lookup_max:
        access.require_admin(request, f"a lookup of more than {access.rules.lookup_max} members")
    names = [member_id(m) for m in members]
    return json(
        await trend(request, where, await queries.lookup_answer(reader_for(request, where), where, names))
    )


@warm
async def count(request: web.Request) -> web.Response:
    where = target(request)
    low = score_param(request, "min", float("-inf"))
    high = score_param(request, "max", float("inf"))
    reader = reader_for(request, where)
    return await answer(
        request, where, reader, lambda: queries.count_answer(reader, where, low, high), COUNT_PARAMS
    )


@warm
async def rank(request: web.Request) -> web.Response:
    where = target(request)
    score = score_param(request, "score")
    if score in (float("inf"), float("-inf")):
        raise ApiError(400, "bad_parameter", "score must be finite")
    reader = reader_for(request, where)
    return await answer(
        request, where, reader, lambda: queries.rank_answer(reader, where, score), RANK_PARAMS
    )


def add_routes(app: web.Application, front: Front) -> None:
    front.add(app, "GET", f"{ROUTE_PREFIX}/top", top, guarded=True)
    front.add(app, "GET", f"{ROUTE_PREFIX}/members/{{member:[^/]+}}", member, guarded=True)
    front.add(app, "GET", f"{ROUTE_PREFIX}/members/{{member:[^/]+}}/around", around, guarded=True)
    front.add(app, "POST", f"{ROUTE_PREFIX}/members/lookup", lookup, guarded=True)
    front.add(app, "GET", f"{ROUTE_PREFIX}/count", count, guarded=True)
    front.add(app, "GET", f"{ROUTE_PREFIX}/rank", rank, guarded=True)
