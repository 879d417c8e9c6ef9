"""Request parameters: parsed and validated once, each failure a 400 with a stable code."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol
from zoneinfo import ZoneInfo

from aiohttp import web

from api.errors import ApiError
from api.state import APP_STATE
from common.boards import BoardType, Window, WindowKind, split_board
from common.events import MAX_MEMBER_LEN, MIN_TS_MS, ts_ceiling
from common.periods import Period, expire_at_ms, parse_period, period_at, previous_period
from common.ranking import Ties
from common.store.keys import TOTAL_INSTANCE, window_instance
from common.windows import SEASON_WINDOW

MAX_LIMIT = 500
_TIES = {t.value: t for t in Ties}
FOREVER_MS = 2**62
MAX_AROUND = 100
_CONTROL = {*range(0x20), *range(0x7F, 0xA0)}


class Asked(Protocol):
    """What parameters are read from: a request, or a live stream's saved query (api/live.py),
    which re-reads them as the clock moves on."""

    @property
    def query(self) -> Mapping[str, str]: ...

    @property
    def match_info(self) -> Mapping[str, str]: ...

    @property
    def app(self) -> web.Application: ...


@dataclass(slots=True)  # not frozen: a frozen dataclass of 12 fields costs ~1.5 us to build
class Target:
    """The board window a request reads, and how it wants it viewed (treat it as read-only)."""

    board: str
    board_type: BoardType
    window: str
    period: str  # "all" for total
    instance: str
    reverse: bool  # the caller's `order` is the opposite of the board's
    ties: Ties
    period_start_ms: int = 0  # 0 for total
    trend: bool = False  # trend=1: answers carry prev_rank
    previous: Target | None = None  # trend=1: the previous period, if still kept
    # an answer stays right until then at most, whatever is written (api/warm.py): the end of a
    # period chosen by the clock, the end of the retention of the periods read
    until_ms: int = FOREVER_MS

    def describe(self) -> dict[str, object]:
        return {"board": self.board, "window": self.window, "period": self.period}


def int_param(request: Asked, name: str, default: int, low: int, high: int) -> int:
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


def score_param(request: Asked, name: str, default: float | None = None) -> float:
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


def board_of(request: Asked) -> tuple[str, BoardType]:
    board = request.match_info["board"]
    parts = split_board(board)
    if parts is None:
        raise ApiError(400, "bad_board", f"{board!r} is not a valid board id")
    board_type = request.app[APP_STATE].boards.type_for(parts[0])
    if board_type is None:
        raise ApiError(404, "unknown_board_type", f"board type {parts[0]!r} is not configured")
    return board, board_type


def target(request: Asked, league: bool = False) -> Target:
    """Board, window instance (`window`, `period` or `at`), `order`, `ties` and `trend` of a
    request; `league`: a league route's, whose window is its type's season (api/league.py)."""
    board, board_type = board_of(request)
    if league and board_type.league is None:
        raise ApiError(404, "not_a_league", f"board type {board_type.name!r} declares no league")
    name = SEASON_WINDOW if league else request.query.get("window", "total")
    try:
        window = board_type.window(name)
    except KeyError:
        raise ApiError(400, "bad_window", f"window {name!r} is not configured for this board") from None
    if not league and board_type.league is not None and window.kind is WindowKind.SEASON:
        message = f"window {name!r} of a league is read by division: /v1/boards/{board}/league/..."
        raise ApiError(400, "league_window", message)
    trend = request.query.get("trend", "0")
    if trend not in {"0", "1"}:
        raise ApiError(400, "bad_parameter", "trend must be 0 or 1")
    if trend == "1" and not window.periodic:
        raise ApiError(
            400, "bad_parameter", f"trend=1 needs a period window; {name!r} has no previous period"
        )
    order = request.query.get("order", board_type.order.value)
    if order not in {"asc", "desc"}:
        raise ApiError(400, "bad_parameter", "order must be asc or desc")
    ties = _TIES.get(request.query.get("ties", "ordinal"))
    if ties is None:
        raise ApiError(400, "bad_parameter", "ties must be ordinal or shared")
    reverse = order != board_type.order.value
    if window.kind is WindowKind.TOTAL:
        return Target(board, board_type, name, "all", TOTAL_INSTANCE, reverse, ties)
    state = request.app[APP_STATE]
    tz, now = state.boards.timezone, state.clock()
    period = _period(request, window, tz, now, ts_ceiling(state.max_future_skew_s, now))
    if window.kind is WindowKind.ROLLING and period.start_ms > now:
        # the next one is being prepared (worker/rolling.py): whole only once it begins
        message = f"period {period.id!r} of rolling window {name!r} has not begun"
        raise ApiError(400, "bad_period", message)
    retention = board_type.retention[name]
    expires = expire_at_ms(window, period, retention, tz)
    if expires <= now:
        message = f"period {period.id!r} of window {name!r} is past its retention ({retention} periods)"
        raise ApiError(404, "period_expired", message)
    by_clock = "period" not in request.query and "at" not in request.query
    found = Target(
        board,
        board_type,
        name,
        period.id,
        window_instance(name, period.id),
        reverse,
        ties,
        period.start_ms,
        until_ms=min(expires, period.end_ms) if by_clock else expires,
    )
    if trend == "0":
        return found
    before = previous_period(window, period, tz)
    before_expires = 0 if before is None else expire_at_ms(window, before, retention, tz)
    if before is None or before_expires <= now:
        return replace(found, trend=True)  # no previous period still kept: every prev_rank is null
    previous = replace(
        found, period=before.id, instance=window_instance(name, before.id), period_start_ms=before.start_ms
    )
    # once the previous period expires, its prev_ranks become null
    return replace(found, trend=True, previous=previous, until_ms=min(found.until_ms, before_expires))


def _period(request: Asked, window: Window, tz: ZoneInfo, now: int, latest: int) -> Period:
    """The period `period=` names or `at=` (default: now) falls in."""
    if "period" in request.query:
        try:
            period = parse_period(window, request.query["period"], tz)
        except ValueError as exc:
            raise ApiError(400, "bad_period", str(exc)) from None
        # the range events are accepted in: no period outside it can hold anything
        if period.end_ms <= MIN_TS_MS or period.start_ms > latest:
            message = f"period {period.id!r} lies outside the accepted time range (2000-01-01 to now + skew)"
            raise ApiError(400, "bad_period", message)
        return period
    at = int_param(request, "at", now, MIN_TS_MS, latest)
    found = period_at(window, at, tz)
    if found is None:
        raise ApiError(404, "no_period", f"no period of window {window.name!r} holds the instant {at}")
    return found
