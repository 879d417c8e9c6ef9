"""The leaderboard routes of CONTRACT section 6."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from api.boardreads import read_top
from api.errors import ApiError
from api.state import APP_STATE
from common.boards import BoardType, WindowKind, split_board
from common.keys import TOTAL_INSTANCE, BoardKeys, window_instance
from common.periods import CALENDAR_KINDS, parse_period, period_at

MAX_LIMIT = 500


def json(body: dict[str, object], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "bad_parameter", f"{name} must be an integer") from None
    if not low <= value <= high:
        raise ApiError(400, "bad_parameter", f"{name} must be between {low} and {high}")
    return value


def resolve_board(request: web.Request) -> tuple[str, BoardType]:
    board = request.match_info["board"]
    parts = split_board(board)
    if parts is None:
        raise ApiError(400, "bad_board", f"{board!r} is not a valid board id")
    board_type = request.app[APP_STATE].boards.type_for(parts[0])
    if board_type is None:
        raise ApiError(404, "unknown_board_type", f"board type {parts[0]!r} is not configured")
    return board, board_type


def resolve_instance(request: web.Request, board_type: BoardType) -> tuple[str, str]:
    """(window name, key instance) from `window`, `period` and `at`."""
    name = request.query.get("window", "total")
    try:
        window = board_type.window(name)
    except KeyError:
        raise ApiError(400, "bad_window", f"window {name!r} is not configured for this board") from None
    if window.kind is WindowKind.TOTAL:
        return name, TOTAL_INSTANCE
    if window.kind not in CALENDAR_KINDS:
        raise ApiError(400, "bad_window", f"window {name!r} is not served yet")
    tz = request.app[APP_STATE].boards.timezone
    if "period" in request.query:
        try:
            period = parse_period(window.kind, request.query["period"], tz)
        except ValueError as exc:
            raise ApiError(400, "bad_period", str(exc)) from None
    else:
        at = _int_param(request, "at", int(time.time() * 1000), 0, 253402300799999)
        period = period_at(window.kind, at, tz)
    return name, window_instance(name, period.id)


async def top(request: web.Request) -> web.Response:
    board, board_type = resolve_board(request)
    window, instance = resolve_instance(request, board_type)
    limit = _int_param(request, "limit", 10, 1, MAX_LIMIT)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    state = request.app[APP_STATE]
    page = await read_top(
        state.redis,
        keys=BoardKeys(state.key_prefix, board),
        board_type=board_type,
        instance=instance,
        offset=offset,
        limit=limit,
    )
    period = "all" if instance == TOTAL_INSTANCE else instance.split(":", 1)[1]
    return json(
        {
            "board": board,
            "window": window,
            "period": period,
            "total": page.total,
            "items": [item.as_dict() for item in page.items],
            "source": "redis",
            "seq": page.seq,
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/boards/{board}/top", top)
