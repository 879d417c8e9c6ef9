"""The league routes (docs/http-api.md#leagues): a member's seat and standing, a division's top,
a tier's divisions, for a board type that declares `league:` (common/league.py). A league's
season is read from Redis: its seats (who is in which division) and its divisions, each a
window instance of its own. Ties inside a division rank by join order, so ranks are ordinal."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from aiohttp import web
from cachetools import LRUCache

from api import queries
from api.errors import ApiError
from api.front import Front
from api.params import MAX_AROUND, MAX_LIMIT, Asked, Target, int_param, member_id, target
from api.redis_reader import RedisBoardReader, window_ref
from api.routes import ROUTE_PREFIX, answer, reader_for, warm
from api.state import APP_STATE
from common.league import (
    DIVISION_MARK,
    League,
    Seat,
    division_id,
    division_instance,
    parse_division,
    parse_seat,
)
from common.ranking import Ties, items, json_score
from common.store.keys import BoardKeys
from common.store.league import seats_taken, standing

_SEASON = ("at", "order", "period")
MEMBER_PARAMS = tuple(sorted((*_SEASON, "limit", "n")))
DIVISION_PARAMS = tuple(sorted((*_SEASON, "limit", "offset")))
TIER_PARAMS = tuple(sorted((*_SEASON, "limit", "offset")))
MAX_DIVISIONS = 1000  # a tier's divisions listed in one answer at most
MAX_SEATS = 100_000  # hot leagues' members' divisions a node remembers (checked against memory)
SEATS = web.AppKey("league_seats", LRUCache)


def _season(request: Asked) -> tuple[Target, League]:
    where = target(request, league=True)
    league = where.board_type.league
    assert league is not None  # target() refused a type without one
    if request.query.get("ties", "ordinal") != "ordinal":
        raise ApiError(400, "bad_parameter", "ties in a division rank by join order: ties must be ordinal")
    if request.query.get("trend", "0") != "0":
        raise ApiError(400, "bad_parameter", "a division has no previous period: trend must be 0")
    return replace(where, ties=Ties.ORDINAL), league


def _division(where: Target, tier: str, number: int) -> Target:
    """The division as the window instance its reads go to."""
    return replace(where, instance=division_instance(where.instance, tier, number))


def _redis_reader(request: Asked, where: Target) -> RedisBoardReader:
    state = request.app[APP_STATE]
    return RedisBoardReader(state.redis, BoardKeys(state.key_prefix, where.board), where)


def _describe(where: Target, tier: str, number: int) -> dict[str, Any]:
    return {"board": where.board, "season": where.period, "tier": tier, "division": division_id(tier, number)}


@warm
async def member(request: web.Request) -> web.Response:
    where, league = _season(request)
    name = member_id(request.match_info["member"])
    n = int_param(request, "n", 5, 0, MAX_AROUND)
    limit = int_param(request, "limit", 10, 0, MAX_LIMIT)
    state = request.app[APP_STATE]
    keys = BoardKeys(state.key_prefix, where.board)
    reader = reader_for(request, where)  # memory for a hot league's season, else Redis

    async def build() -> dict[str, Any]:
        seat = await _seat(request, where, name)
        if seat is None:
            raise ApiError(404, "member_not_found", f"{name!r} has no seat in season {where.period!r}")
        number = league.division(seat.order)
        division = _division(where, seat.tier, number)
        body: dict[str, Any] = {**_describe(where, seat.tier, number), "member": name, "joined": seat.order}
        if reader.source == "memory":
            return body | await _from_memory(request, division, name, n=n, limit=limit)
        got = await standing(
            state.redis,
            window_ref(keys, division),
            name,
            seat.order,
            n=n,
            limit=limit,
            reverse=division.reverse,
        )
        if got.position is None or got.score is None:  # seated, without a score now (deleted, erased)
            body |= {"rank": None, "score": None, "around": []}
        else:
            near = list(range(got.start + 1, got.start + 1 + len(got.around)))
            body |= {
                "rank": got.position + 1,
                "score": json_score(got.score),
                "around": items(near, got.around),
            }
        top = items(list(range(1, len(got.top) + 1)), got.top)
        return body | {"members": got.members, "top": top, "source": "redis", "seq": got.seq}

    return await answer(request, where, reader, build, MEMBER_PARAMS, reads=2)


async def _seat(request: Asked, where: Target, member: str) -> Seat | None:
    """The member's seat in the season: for a hot league, the division memory holds the member
    in (its tie is the seat's order), remembered as long as memory still holds the member there
    (a data set Redis lost and rebuilt may seat members again); else, and for a member memory
    holds in no division (seated without a score), Redis' word, asked each time."""
    state = request.app[APP_STATE]
    hot = state.hot.boards.get(where.board)
    if hot is not None and hot.ready:
        known: LRUCache[tuple[str, str, str], tuple[str, Seat]] = request.app[SEATS]
        key = (where.board, where.instance, member)
        held = known.get(key)
        if held is not None:
            window = hot.instances.get(held[0])
            if window is not None and window.tie_of(member) == held[1].order:
                return held[1]
        prefix = where.instance + DIVISION_MARK
        for instance, window in hot.instances.items():
            tie = window.tie_of(member) if instance.startswith(prefix) else None
            division = parse_division(instance[len(prefix) :]) if tie is not None else None
            if tie is not None and division is not None:
                seat = Seat(division[0], tie)
                known[key] = (instance, seat)
                return seat
    raw = await state.redis.call(
        "HGET", BoardKeys(state.key_prefix, where.board).seats(where.instance), member
    )
    return None if raw is None else parse_seat(raw)


async def _from_memory(
    request: Asked, division: Target, member: str, *, n: int, limit: int
) -> dict[str, Any]:
    """A member's standing in their division as a hot league's memory holds it (one state)."""
    reader = reader_for(request, division)
    top, near = (
        await reader.page(0, limit, division.reverse),
        await reader.around(member, n, division.reverse, False),
    )
    body: dict[str, Any] = {"rank": None, "score": None, "around": []}
    if near.found is not None:
        found = queries.located_item(near.found, division)
        ranks = list(range(near.start + 1, near.start + 1 + len(near.page.entries)))
        body = {"rank": found["rank"], "score": found["score"], "around": items(ranks, near.page.entries)}
    ranks = list(range(1, len(top.entries) + 1))
    return body | {"members": top.total, "top": items(ranks, top.entries), "source": "memory", "seq": top.seq}


@warm
async def division_top(request: web.Request) -> web.Response:
    where, league = _season(request)
    parsed = parse_division(request.match_info["division"])
    if parsed is None or parsed[0] not in league.tiers:
        named = request.match_info["division"]
        message = f"{named!r} is not a division: <tier>.<n>, tiers {', '.join(league.tiers)}"
        raise ApiError(400, "bad_division", message)
    tier, number = parsed
    offset = int_param(request, "offset", 0, 0, league.division_size)
    limit = int_param(request, "limit", 10, 1, MAX_LIMIT)
    division = _division(where, tier, number)
    reader = reader_for(request, division)  # memory for a hot league's season, else Redis

    async def build() -> dict[str, Any]:
        page, ranks = await queries.ranked_page(reader, division, offset, limit)
        return {**_describe(where, tier, number), "members": page.total, "items": items(ranks, page.entries),
                "source": reader.source, "seq": page.seq}  # fmt: skip

    return await answer(request, division, reader, build, DIVISION_PARAMS)


@warm
async def tier_divisions(request: web.Request) -> web.Response:
    where, league = _season(request)
    tier = request.match_info["tier"]
    if tier not in league.tiers:
        raise ApiError(400, "bad_tier", f"{tier!r} is not a tier: {', '.join(league.tiers)}")
    offset = int_param(request, "offset", 0, 0, 10**9)
    limit = int_param(request, "limit", 100, 1, MAX_DIVISIONS)
    state = request.app[APP_STATE]
    keys = BoardKeys(state.key_prefix, where.board)

    async def build() -> dict[str, Any]:
        raw, seq = await asyncio.gather(
            state.redis.call("HGETALL", keys.seats_taken(where.instance)), state.redis.call("GET", keys.seq)
        )
        pairs = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
        seats = seats_taken(pairs, league)[tier]
        opened = league.divisions(seats)
        numbers = range(offset + 1, min(opened, offset + limit) + 1)
        counts: list[int] = await asyncio.gather(
            *(
                state.redis.call("ZCARD", keys.rank(division_instance(where.instance, tier, k)))
                for k in numbers
            )
        )
        size = league.division_size
        divisions = [
            {
                "division": division_id(tier, k),
                "seats": min(size, seats - (k - 1) * size),
                "members": int(count),
            }
            for k, count in zip(numbers, counts, strict=True)
        ]
        return {"board": where.board, "season": where.period, "tier": tier, "division_size": size,
                "seats": seats, "total": opened, "divisions": divisions, "source": "redis",
                "seq": int(seq or 0)}  # fmt: skip

    # (from Redis, hot or not: the seats each tier gave are not in memory)
    return await answer(request, where, _redis_reader(request, where), build, TIER_PARAMS, reads=2)


def add_routes(app: web.Application, front: Front) -> None:
    app[SEATS] = LRUCache(maxsize=MAX_SEATS)
    prefix = f"{ROUTE_PREFIX}/league"
    front.add(app, "GET", f"{prefix}/members/{{member:[^/]+}}", member, guarded=True)
    front.add(app, "GET", f"{prefix}/divisions/{{division:[^/]+}}/top", division_top, guarded=True)
    front.add(app, "GET", f"{prefix}/tiers/{{tier:[^/]+}}/divisions", tier_divisions, guarded=True)
