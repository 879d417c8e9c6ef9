"""Pages for people (docs/http-api.md#pages): `GET /`, the board types and the boards in memory;
`GET /boards/{board}`, a live board. Both come from the package (api/static): no build step, no
third-party host. The board page is static: its script reads the board's description
(`GET /v1/boards/{board}`), its top page (the event stream) and members (the read routes), and
writes what it shows as text, never as HTML. The Content-Security-Policy lets the page run only
its own script and style, connect only to this origin, and load images (members' avatars) from
https or this origin.

Where read tokens are required, a browser opens the page with `?token=`: the page answers a
redirect to itself without it, with the token in an HttpOnly cookie that its reads and its
event stream then carry (an EventSource cannot send a header; a script never sees the cookie)."""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from api.access import TOKEN_COOKIE, TOKEN_PARAM
from api.errors import ApiError
from api.front import Front
from api.live import events
from api.params import board_of
from api.routes import ROUTE_PREFIX, json
from api.state import APP_STATE
from common.boards import WindowKind
from common.periods import recent_periods

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' https: data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"board.js": "text/javascript", "board.css": "text/css"}
MAX_PERIODS = 24  # a window's periods the picker offers, newest first
COOKIE_MAX_AGE_S = 12 * 3600


@cache
def _static(name: str) -> bytes:
    return resources.files("api").joinpath("static", name).read_bytes()


def _page(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS)


def _with_token_cookie(request: web.Request) -> web.Response | None:
    """A page opened with a valid ?token=: a redirect to itself without it, the token kept in
    the page's cookie (`Secure` when the client came over HTTPS, directly or by a trusted proxy)."""
    token = request.query.get(TOKEN_PARAM)
    access = request.app[APP_STATE].access
    if token is None or access is None or not access.needs_token() or not access.valid(token):
        return None  # no token needed, or none to keep (a wrong one was answered 401 already)
    rest = [(k, v) for k, v in request.query.items() if k != TOKEN_PARAM]
    location = request.rel_url.raw_path + (f"?{urlencode(rest)}" if rest else "")
    response = web.Response(status=303, headers={**PAGE_HEADERS, "Location": location})
    # Lax, not Strict: a link to the page from another site (a chat, a wiki) must carry it; a
    # cross-site script's reads still do not (and every route it admits only reads)
    response.set_cookie(
        TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/", httponly=True, samesite="Lax",
        secure=access.https(request),
    )  # fmt: skip
    return response


async def index(request: web.Request) -> web.Response:
    redirect = _with_token_cookie(request)
    if redirect is not None:
        return redirect
    state = request.app[APP_STATE]
    rows = []
    for name, board_type in sorted(state.boards.types.items()):
        windows = ", ".join(w.name for w in board_type.windows)
        rows.append(f"<li><code>{html.escape(name)}</code> ({html.escape(windows)})</li>")
    hot = [
        f'<li><a href="/boards/{html.escape(board, quote=True)}">{html.escape(board)}</a></li>'
        for board in sorted(state.hot.boards)
    ]
    body = (
        _static("index.html")
        .decode()
        .replace("{{types}}", "\n".join(rows) or "<li>none</li>")
        .replace("{{hot}}", "\n".join(hot) or "<li>none</li>")
    )
    return _page(body.encode())


async def board_page(request: web.Request) -> web.Response:
    board_of(request)  # a bad board id: 400; an unknown type: 404
    redirect = _with_token_cookie(request)
    if redirect is not None:
        return redirect
    return _page(_static("board.html"))


async def open_board(request: web.Request) -> web.Response:
    """`GET /boards?board=…`: the index's form, to the board's page."""
    board = request.query.get("board", "").strip()
    if not board:
        raise ApiError(400, "bad_board", "name a board: /boards?board=<type>:<id>")
    return web.Response(status=303, headers={**PAGE_HEADERS, "Location": "/boards/" + quote(board, safe=":")})


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = STATIC.get(name)
    if kind is None:
        raise ApiError(404, "not_found", "Not Found")
    return web.Response(
        body=_static(name),
        content_type=kind,
        charset="utf-8",
        headers={"Cache-Control": "public, max-age=300", "X-Content-Type-Options": "nosniff"},
    )


async def describe(request: web.Request) -> web.Response:
    """`GET /v1/boards/{board}`: the board's type, order, windows and the periods each keeps now."""
    board, board_type = board_of(request)  # a bad board id: 400; an unknown type: 404
    state = request.app[APP_STATE]
    now, tz = state.clock(), state.boards.timezone
    league = board_type.league
    windows: list[dict[str, Any]] = []
    for window in board_type.windows:
        periods: list[str] = []
        if window.periodic:
            kept = recent_periods(window, board_type.retention[window.name], now, now, tz)
            periods = [period.id for period, _ in kept[:MAX_PERIODS]]
        described = {
            "name": window.name,
            "kind": window.kind.value,
            "trend": window.periodic,
            "periods": periods,
        }
        if league is not None and window.kind is WindowKind.SEASON:
            described["league"] = True  # read by division: the league routes (api/league.py)
        windows.append(described)
    body: dict[str, Any] = {
        "board": board,
        "type": board_type.name,
        "order": board_type.order.value,
        "hot": board in state.hot.boards,
        "windows": windows,
    }
    if league is not None:
        body["league"] = {"division_size": league.division_size, "tiers": list(league.tiers),
                          "entry_tier": league.entry_tier}  # fmt: skip
    return json(body)


def add_pages(app: web.Application, front: Front) -> None:
    front.add(app, "GET", "/", index, guarded=True, page=True)
    front.add(app, "GET", "/boards", open_board)
    front.add(app, "GET", "/boards/{board:[^/]+}", board_page, guarded=True, page=True)
    front.add(app, "GET", "/static/{name}", static)
    front.add(app, "GET", ROUTE_PREFIX, describe, guarded=True)
    front.add(app, "GET", f"{ROUTE_PREFIX}/events", events, guarded=True, page=True)
