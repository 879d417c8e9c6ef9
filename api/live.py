"""Live boards: `GET /v1/boards/{board}/events`, a board's top page pushed as server-sent events
whenever it changes (docs/http-api.md#live-updates).

One channel per distinct stream (the board and the parameters its top page reads) computes the
page once per change and hands it to every stream of it; a stream that cannot keep up skips to
the latest page (it holds one page at most, never a queue).

How a channel learns that its board changed:
- a board in this node's memory: as the node applies its update_cache records
  (`HotBoards.on_change`), so the page pushed is what memory now holds;
- any other board: the Redis change notice every write publishes (`ChangeFeed.on_change`,
  api/warm.py), then one read;
- and, whatever is lost (a notice while the subscription was down), a read every REFRESH_S, and
  one when a clock-chosen period ends.

A channel pushes at most every INTERVAL_S: changes in between are folded into the next page. Each
event's id is the board's seq, the same on every node, so a client that reconnects elsewhere
(`Last-Event-ID`) is not sent the page it already has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web

from api import queries
from api.errors import ApiError
from api.httpcache import canonical
from api.params import int_param, target
from api.routes import reader_for, trend
from api.state import APP_STATE
from common.clock import Clock

_log = logging.getLogger(__name__)
INTERVAL_S = 0.25  # at most one page per stream this often
REFRESH_S = 5.0  # a channel reads its board at least this often, notice or not
RETRY_MS = 2000  # how long a browser's EventSource waits before it reconnects
ERROR_RETRY_S = 1.0  # after a failed read (Redis away, a board warming up): read again
# a client's Last-Event-ID ahead of what this node has (memory a moment behind another node's):
# hold the first page this long for the node to catch up, then send what it has (an erased
# board starts its seq again)
AHEAD_WAIT_S = 2.0
# a client that stops reading: its stream ends once a page has waited this long to be sent
WRITE_TIMEOUT_S = 30.0
MAX_STREAM_LIMIT = 100  # the longest page a stream pushes
STREAM_PARAMS = ("at", "limit", "order", "period", "ties", "trend", "window")  # what a stream reads, sorted


@dataclass(frozen=True, slots=True)
class Saved:
    """A stream's parameters, kept to be read again as the clock moves on (api/params.Asked)."""

    query: Mapping[str, str]
    match_info: Mapping[str, str]
    app: web.Application


@dataclass(frozen=True, slots=True)
class Page:
    seq: int
    id: str  # the event's id: the board's seq, and the period for a window of periods
    body: bytes  # the top answer's JSON
    frame: bytes  # as sent: the event with its id

    @classmethod
    def of(cls, seq: int, period: str, body: bytes) -> Page:
        """A window of periods changes page without a write as the clock moves to a new period:
        its pages' ids name the period too (`1742@2026-11-29`), the same on every node."""
        page_id = str(seq) if period == "all" else f"{seq}@{period}"
        return cls(seq, page_id, body, b"id: %s\nevent: top\ndata: %s\n\n" % (page_id.encode(), body))


def error_frame(status: int, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message, "status": status}})
    return b"event: unavailable\ndata: %s\n\n" % body


class Listener:
    """One stream: the latest page it has not sent yet."""

    def __init__(self, since: str | None) -> None:
        self.since = since  # the id of the page the client holds (Last-Event-ID)
        self.since_seq = -1 if since is None else int(since.split("@", 1)[0])
        self.started = time.monotonic()
        self.pending: bytes | None = None
        self.sent = False  # since the last keep-alive tick
        self.held: Page | None = None  # older than the client's page: sent after AHEAD_WAIT_S
        self.wake = asyncio.Event()

    def offer(self, page: Page) -> None:
        """`page` is the stream's next, unless it is the one the client said it holds (the first
        page only: any later one is news), or older than it while this node catches up."""
        if self.since is not None:
            if page.id == self.since:
                self.since = None
                return  # the client has it
            waited = time.monotonic() - self.started
            if page.seq < self.since_seq and waited < AHEAD_WAIT_S:
                if self.held is None:  # sent anyway once the wait is over, if nothing newer came
                    asyncio.get_running_loop().call_later(AHEAD_WAIT_S - waited, self._release)
                self.held = page
                return
            self.since = None
        self.pending = page.frame
        self.wake.set()

    def _release(self) -> None:
        if self.since is not None and self.held is not None:
            self.since = None
            self.pending = self.held.frame
            self.wake.set()

    def warn(self, frame: bytes) -> None:
        self.pending = frame
        self.wake.set()


class Channel:
    """The pages of one stream query, computed once for all its listeners."""

    def __init__(self, hub: LiveBoards, key: str, saved: Saved) -> None:
        self.hub, self.key, self.saved = hub, key, saved
        self.board = saved.match_info["board"]
        self.listeners: set[Listener] = set()
        self.latest: Page | None = None
        self.failed: bytes | None = None  # the error frame of the last read, until one succeeds
        self.dirty = asyncio.Event()
        self.dirty.set()  # the first page at once
        self.task: asyncio.Task[None] | None = None

    def join(self, listener: Listener) -> None:
        self.listeners.add(listener)
        if self.latest is not None:
            listener.offer(self.latest)
        elif self.failed is not None:
            listener.warn(self.failed)

    async def run(self) -> None:
        pushed = -INTERVAL_S
        wait = 0.0
        try:
            while self.listeners and not self.hub.closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.dirty.wait(), wait)
                rest = pushed + INTERVAL_S - time.monotonic()
                if rest > 0:
                    await asyncio.sleep(rest)  # what changes meanwhile goes in this page
                self.dirty.clear()
                pushed = time.monotonic()
                wait = await self._read()
        finally:
            self.hub.forget(self)

    async def _read(self) -> float:
        """Read the page; push it if it changed, or if the read before failed (the listeners
        were told so: they get the page again). How long until the next read at most."""
        try:
            where = target(self.saved)
            limit = int_param(self.saved, "limit", 10, 1, MAX_STREAM_LIMIT)
            reader = reader_for(self.saved, where)
            page, ranks = await queries.ranked_page(reader, where, 0, limit)
            body = queries.top_answer(where, page, ranks, reader.source)
            if where.trend:
                body = await trend(self.saved, where, body)
            encoded = orjson.dumps(body)
            recovered, self.failed = self.failed is not None, None
            if self.latest is None or encoded != self.latest.body or recovered:
                self.latest = Page.of(int(body["seq"]), where.period, encoded)
                self.hub.pushes += len(self.listeners)
                for listener in self.listeners:
                    listener.offer(self.latest)
            until = (where.until_ms - self.hub.clock()) / 1000  # a clock-chosen period ends
            return max(0.0, min(REFRESH_S, until))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - told to the listeners; read again soon
            frame = _error(exc)
            if frame != self.failed:
                self.failed = frame
                for listener in self.listeners:
                    listener.warn(frame)
            return ERROR_RETRY_S


def _error(exc: Exception) -> bytes:
    if isinstance(exc, ApiError):
        return error_frame(exc.status, exc.code, exc.message)
    _log.warning("live board read failed", extra={"error": str(exc)})
    return error_frame(503, "unavailable", "the board cannot be read now; the stream goes on")


class LiveBoards:
    """The streams of one node: their channels, the bound on their number, their end."""

    def __init__(self, max_streams: int, keepalive_s: float, clock: Clock) -> None:
        self.max_streams, self.keepalive_s, self.clock = max_streams, keepalive_s, clock
        self.channels: dict[str, Channel] = {}
        self._by_board: dict[str, set[Channel]] = {}
        self.listeners: set[Listener] = set()
        self.streams = 0
        self.pushes = 0  # pages handed to streams
        self.closing = False

    async def keep_alive(self) -> None:
        """Every keepalive_s, wake each stream sent nothing since: it writes a comment. One timer
        for the node, rather than one per stream and per page."""
        while not self.closing:
            await asyncio.sleep(self.keepalive_s)
            self.tick()

    def tick(self) -> None:
        """Wake the streams that sent no page since the tick before (each writes a keep-alive)."""
        for listener in self.listeners:
            if not listener.sent:
                listener.wake.set()
            listener.sent = False

    def changed(self, board: str) -> None:
        for channel in self._by_board.get(board, ()):
            channel.dirty.set()

    def close(self) -> None:
        """Every stream ends (the node is stopping: clients reconnect to another)."""
        self.closing = True
        for channel in self.channels.values():
            channel.dirty.set()
        for listener in self.listeners:
            listener.wake.set()

    def channel(self, key: str, saved: Saved) -> Channel:
        found = self.channels.get(key)
        if found is None:
            found = self.channels[key] = Channel(self, key, saved)
            self._by_board.setdefault(found.board, set()).add(found)
        return found

    def start(self, channel: Channel) -> None:
        if channel.task is None or channel.task.done():
            channel.task = asyncio.create_task(channel.run())

    def forget(self, channel: Channel) -> None:
        if channel.listeners and not self.closing:  # a listener joined as it ended: again
            channel.task = asyncio.create_task(channel.run())
            return
        if self.channels.get(channel.key) is channel:
            del self.channels[channel.key]
            board = self._by_board.get(channel.board)
            if board is not None:
                board.discard(channel)
                if not board:
                    del self._by_board[channel.board]


LIVE: web.AppKey[LiveBoards] = web.AppKey("rankstream_live", LiveBoards)


def _since(request: web.Request) -> str | None:
    """The client's Last-Event-ID if it is one of ours (a seq, `@` and a period for a window of
    periods); None for anything else: the client gets the current page."""
    raw = request.headers.get("Last-Event-ID", "").strip()
    return raw if _EVENT_ID.fullmatch(raw) else None


_EVENT_ID = re.compile(r"[0-9]{1,19}(@[!-~]{1,40})?")


async def events(request: web.Request) -> web.StreamResponse:
    """`GET /v1/boards/{board}/events`: the board's top page now, then each time it changes."""
    hub = request.app[LIVE]
    saved = Saved(dict(request.query), dict(request.match_info), request.app)
    target(saved)  # bad parameters: a 400 now, before the stream starts
    int_param(saved, "limit", 10, 1, MAX_STREAM_LIMIT)
    if hub.closing:
        raise ApiError(503, "stopping", "this node is stopping; connect again")
    if hub.streams >= hub.max_streams:
        raise ApiError(
            503, "too_many_streams", f"this node holds its most streams ({hub.max_streams}); retry"
        )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",  # a buffering proxy (nginx) passes each event on at once
        }
    )
    access = request.app[APP_STATE].access
    if access is not None:
        access.cors(request, response)  # now: the front's come after the headers are sent
    if request.method == "HEAD":
        return web.Response(headers=response.headers)  # the headers a stream would start with
    await response.prepare(request)
    await response.write(b"retry: %d\n\n" % RETRY_MS)
    listener = Listener(_since(request))
    channel = hub.channel(canonical(request, STREAM_PARAMS), saved)
    hub.streams += 1
    hub.listeners.add(listener)
    channel.join(listener)
    hub.start(channel)
    try:
        while True:
            await listener.wake.wait()  # a page, a keep-alive tick, or the node stopping
            listener.wake.clear()
            if hub.closing or request.transport is None or request.transport.is_closing():
                break  # stopping, or the client left
            frame, listener.pending = listener.pending, None
            listener.sent = frame is not None  # a page: no keep-alive needed at the next tick
            data = frame if frame is not None else b": keep-alive\n\n"
            if request.transport.get_write_buffer_size():  # the client is behind: bound the wait
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await response.write(data)
            else:
                await response.write(data)
    except (ConnectionError, RuntimeError, TimeoutError):
        pass  # the client left, or stopped reading, as its page was written
    finally:
        hub.streams -= 1
        hub.listeners.discard(listener)
        channel.listeners.discard(listener)
    return response
