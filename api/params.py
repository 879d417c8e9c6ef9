"""Request parameters: parsed and validated once, each failure a 400 with a stable code."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from aiohttp import web

from api.errors import ApiError
from api.state import APP_STATE
from common.boards import BoardType, Order, WindowKind, split_board
from common.events import MAX_MEMBER_LEN, MIN_TS_MS, ts_ceiling
from common.periods import CALENDAR_KINDS, parse_period, period_at
from common.ranking import Ties
from common.store.keys import TOTAL_INSTANCE, window_instance

MAX_LIMIT = 500
MAX_AROUND = 100
_CONTROL = {*range(0x20), *range(0x7F, 0xA0)}


@dataclass(frozen=True, slots=True)
class Target:
    """The board window a request reads, and how it wants it viewed."""

    board: str
    board_type: BoardType
    window: str
    period: str  # "all" for total
    instance: str
    reverse: bool  # the caller's `order` is the opposite of the board's
    ties: Ties
    period_start_ms: int = 0  # 0 for total

    def describe(self) -> dict[str, object]:
        return {"board": self.board, "window": self.window, "period": self.period}


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
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


def score_param(request: web.Request, name: str, default: float | None = None) -> float:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, "bad_parameter", f"{name} is required")
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, "bad_parameter", f"{name} must be a number") from None
    if math.isnan(value) or (
        math.isinf(value) and raw.strip().lstrip("+-").lower() not in {"inf", "infinity"}
    ):
        raise ApiError(400, "bad_parameter", f"{name} must be a number")
    return value


def member_id(raw: str) -> str:
    if not 1 <= len(raw) <= MAX_MEMBER_LEN or any(ord(ch) in _CONTROL for ch in raw):
        raise ApiError(
            400, "bad_member", f"a member id is 1-{MAX_MEMBER_LEN} characters, no control characters"
        )
    return raw


def _board(request: web.Request) -> tuple[str, BoardType]:
    board = request.match_info["board"]
    parts = split_board(board)
    if parts is None:
        raise ApiError(400, "bad_board", f"{board!r} is not a valid board id")
    board_type = request.app[APP_STATE].boards.type_for(parts[0])
    if board_type is None:
        raise ApiError(404, "unknown_board_type", f"board type {parts[0]!r} is not configured")
    return board, board_type


def target(request: web.Request) -> Target:
    """Board, window instance (`window`, `period` or `at`), `order` and `ties` of a request."""
    board, board_type = _board(request)
    name = request.query.get("window", "total")
    try:
        window = board_type.window(name)
    except KeyError:
        raise ApiError(400, "bad_window", f"window {name!r} is not configured for this board") from None
    if window.kind is WindowKind.TOTAL:
        period_label, instance, start_ms = "all", TOTAL_INSTANCE, 0
    elif window.kind in CALENDAR_KINDS:
        state = request.app[APP_STATE]
        tz, now = state.boards.timezone, int(time.time() * 1000)
        # the range events are accepted in: no period outside it can hold anything
        latest = ts_ceiling(state.max_future_skew_s, now)
        if "period" in request.query:
            try:
                period = parse_period(window.kind, request.query["period"], tz)
            except ValueError as exc:
                raise ApiError(400, "bad_period", str(exc)) from None
            if period.end_ms <= MIN_TS_MS or period.start_ms > latest:
                message = (
                    f"period {period.id!r} lies outside the accepted time range (2000-01-01 to now + skew)"
                )
                raise ApiError(400, "bad_period", message)
        else:
            period = period_at(window.kind, int_param(request, "at", now, MIN_TS_MS, latest), tz)
        period_label, instance, start_ms = period.id, window_instance(name, period.id), period.start_ms
    else:
        raise ApiError(400, "bad_window", f"rolling window {name!r} is not served yet")
    order = request.query.get("order", board_type.order.value)
    if order not in {"asc", "desc"}:
        raise ApiError(400, "bad_parameter", "order must be asc or desc")
    ties = request.query.get("ties", "ordinal")
    if ties not in {"ordinal", "shared"}:
        raise ApiError(400, "bad_parameter", "ties must be ordinal or shared")
    reverse = Order(order) is not board_type.order
    return Target(board, board_type, name, period_label, instance, reverse, Ties(ties), start_ms)
