"""The API's Redis connection: one socket, every command of the event loop's turn written in one
go (auto-pipelining), replies parsed by hiredis in the order they come back.

Why not redis-py's asyncio client here: per call it takes a connection from its pool, wraps the
command in retry and timeout machinery and waits on a stream reader. Measured on this box with 32
concurrent callers of one EVALSHA (bench notes in the README): redis-py 47.5 us of client CPU a
call (35.2 on uvloop), its bare Connection 29.9 (22.9), valkey-glide 39-41, coredis 56-61, this
7.4 (4.7 on uvloop). Redis itself runs one command at a time, so one pipelined connection is all
the concurrency it can use; the worker and the CLIs, which are synchronous, keep redis-py.

Failures keep redis-py's exception types (the API maps them to 503): a connect that fails or a
connection that drops fails every call in flight with `redis.ConnectionError`; no reply for
`reply_timeout` while calls are in flight drops the connection with `redis.TimeoutError`; an error
reply is a `redis.ResponseError` (`NoScriptError` for NOSCRIPT) of that call alone. The next call
reconnects. `on_connect` runs after each (re)connect: the change subscriber uses it to tell the
cache that what it holds may be stale (api/warm.py).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis
from redis.exceptions import NoScriptError

Arg = str | bytes | int | float
_WATCH_S = 0.25  # how often the reply timeout is checked


def connection_args(url: str, name: str = "") -> tuple[str, int, list[list[bytes]], ssl.SSLContext | None]:
    """(host, port, the commands that open a session: AUTH, SELECT, CLIENT SETNAME `name`, TLS)
    of a redis:// or rediss:// URL, as redis-py reads it (user:password@host:port/db)."""
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss"}:
        raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r} (redis:// or rediss://)")
    hello: list[list[bytes]] = []
    if parts.password is not None:
        user = unquote(parts.username or "default").encode()
        hello.append([b"AUTH", user, unquote(parts.password).encode()])
    db = parts.path.strip("/")
    if db and db != "0":
        hello.append([b"SELECT", db.encode()])
    if name:
        hello.append([b"CLIENT", b"SETNAME", name.encode()])  # what CLIENT LIST shows operators
    context = ssl.create_default_context() if parts.scheme == "rediss" else None
    return parts.hostname or "127.0.0.1", parts.port or 6379, hello, context


class _Protocol(asyncio.Protocol):
    def __init__(self, pipe: RedisPipe) -> None:
        self.pipe = pipe
        self.reader = hiredis.Reader(replyError=redis.ResponseError)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        waiters = self.pipe.waiters
        self.pipe.progress = True
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.pipe.drop(self, redis.ConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not waiters:
                self.pipe.drop(self, redis.ConnectionError("a Redis reply nobody asked for"))
                return
            waiter = waiters.popleft()
            if waiter.done():
                continue  # its caller went away
            if isinstance(reply, redis.ResponseError):
                if str(reply).startswith("NOSCRIPT"):
                    reply = NoScriptError(str(reply))
                waiter.set_exception(reply)
            else:
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe.drop(self, redis.ConnectionError(f"Redis connection lost: {exc or 'closed'}"))


class RedisPipe:
    """One auto-pipelined Redis connection for asyncio code (see the module's doc)."""

    def __init__(
        self,
        url: str,
        connect_timeout: float = 1.0,
        reply_timeout: float = 2.0,
        on_connect: Callable[[], None] | None = None,
        name: str = "",
    ) -> None:
        self._host, self._port, self._hello, self._ssl = connection_args(url, name)
        self._connect_timeout, self._reply_timeout = connect_timeout, reply_timeout
        self._on_connect = on_connect
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.progress = False  # a reply arrived since the last watch
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._watch: asyncio.TimerHandle | None = None
        self._stale_turns = 0
        self._closed = False
        self.connects = 0  # sessions opened: tests and metrics

    def send(self, *args: Arg) -> asyncio.Future[Any]:
        """Queue one command; its reply (or error) arrives in the future. Everything queued in
        one turn of the event loop goes out in one write."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            future.set_exception(redis.ConnectionError("the Redis client is closed"))
            return future
        self._out.append(hiredis.pack_command(cast(Any, args)))  # its stub types a 1-tuple
        self.waiters.append(future)
        if self._protocol is None:
            if self._connecting is None:
                self._connecting = loop.create_task(self._connect())
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def call(self, *args: Arg) -> Any:
        return await self.send(*args)

    def _flush(self) -> None:
        self._flush_scheduled = False
        protocol = self._protocol
        if protocol is None or protocol.transport is None or not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        protocol.transport.write(data)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self), self._host, self._port, ssl=self._ssl),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            self._connecting = None
            self._fail(redis.ConnectionError(f"cannot connect to Redis at {self._host}:{self._port}: {exc}"))
            return
        self._connecting = None
        if self._closed:
            assert protocol.transport is not None
            protocol.transport.close()
            return
        # the session's own commands go first; their replies come first
        hello = [loop.create_future() for _ in self._hello]
        self._out[:0] = [hiredis.pack_command(cast(Any, tuple(c))) for c in self._hello]
        for i, future in enumerate(hello):
            self.waiters.insert(i, future)
        self._protocol = protocol
        self.connects += 1
        self._flush()
        if self._watch is None:
            self._watch = loop.call_later(_WATCH_S, self._check)
        if self._on_connect is not None:
            self._on_connect()
        for future in hello:
            try:
                await future
            except redis.ResponseError as exc:
                self.drop(protocol, redis.ConnectionError(f"Redis refused the session: {exc}"))
                return
            except redis.RedisError:  # the connection failed: its callers were told
                return

    def _check(self) -> None:
        """No reply for reply_timeout while calls wait: the connection is dropped."""
        self._watch = None
        if self._closed or self._protocol is None:
            return
        if self.progress or not self.waiters:
            self._stale_turns = 0
        else:
            self._stale_turns += 1
            if self._stale_turns * _WATCH_S >= self._reply_timeout:
                self._stale_turns = 0
                self.drop(self._protocol, redis.TimeoutError("Redis did not answer in time"))
        self.progress = False
        self._watch = asyncio.get_running_loop().call_later(_WATCH_S, self._check)

    def drop(self, protocol: _Protocol, error: Exception) -> None:
        """The connection `protocol` is over: every call waiting on it fails with `error`."""
        if protocol is not self._protocol:
            return
        self._protocol = None
        if protocol.transport is not None:
            protocol.transport.abort()
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        self._out.clear()
        waiters, self.waiters = self.waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()  # retrieved: a caller that went away logs nothing

    async def aclose(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._connecting is not None:
            self._connecting.cancel()
        if self._protocol is not None:
            self.drop(self._protocol, redis.ConnectionError("the Redis client is closed"))


class _Feed(asyncio.Protocol):
    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.reader = hiredis.Reader(replyError=redis.ResponseError)
        self.deliver = deliver
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.deliver(redis.ConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            self.deliver(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.deliver(redis.ConnectionError(f"Redis connection lost: {exc or 'closed'}"))


class Subscription:
    """A pub/sub connection: every reply Redis pushes (`[b"subscribe", channel, n]`,
    `[b"message", channel, data]`) goes to `deliver`, and so does the ConnectionError or
    ResponseError that ends it. The session's own replies (AUTH) are not delivered."""

    def __init__(
        self, url: str, deliver: Callable[[Any], None], connect_timeout: float = 1.0, name: str = ""
    ) -> None:
        self._host, self._port, hello, self._ssl = connection_args(url, name)
        self._hello = [c for c in hello if c[0] != b"SELECT"]  # pub/sub spans every db
        self._deliver, self._connect_timeout = deliver, connect_timeout
        self._skip = len(self._hello)
        self._protocol: _Feed | None = None

    def _on_reply(self, reply: Any) -> None:
        if self._skip and not isinstance(reply, Exception):
            self._skip -= 1  # AUTH's and SETNAME's OK
            return
        self._deliver(reply)

    async def open(self, *channels: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Feed(self._on_reply), self._host, self._port, ssl=self._ssl),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            where = f"{self._host}:{self._port}"
            raise redis.ConnectionError(f"cannot connect to Redis at {where}: {exc}") from None
        self._protocol = protocol
        assert protocol.transport is not None
        commands = [*self._hello, [b"SUBSCRIBE", *(c.encode() for c in channels)]]
        protocol.transport.write(b"".join(hiredis.pack_command(cast(Any, tuple(c))) for c in commands))

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()
        self._protocol = None
