"""The API's Redis connection: one socket, every command of the event loop's turn written in one
go (auto-pipelining), replies parsed by hiredis in the order they come back.

Why not redis-py's asyncio client here: per call it takes a connection from its pool, wraps the
command in retry and timeout machinery and waits on a stream reader. Measured on this box with 32
concurrent callers of one EVALSHA (docs/internals/read-path.md): redis-py 47.5 us of
client CPU a call (35.2 on uvloop), its bare Connection 29.9 (22.9), valkey-glide 39-41, coredis
56-61, this 7.4 (4.7 on uvloop). Redis itself runs one command at a time, so one pipelined
connection is all the concurrency it can use; the worker and the CLIs, which are synchronous,
keep redis-py.

Each connection answers only the commands written on it, in order: a connection's replies can
never reach a caller of another. A new connection first opens its session (AUTH, SELECT,
CLIENT SETNAME) and waits for those replies before anything queued is written on it.

Failures raise redis-py's exception types (the API maps connection errors to 503): a connect or
session that fails, or a connection that drops, fails every call written on it with
`redis.ConnectionError`; no reply for `reply_timeout` while calls wait drops the connection with
`redis.TimeoutError`; an error reply is the exception redis-py would raise for it
(`BusyLoadingError` while Redis loads, `NoScriptError`, `ResponseError`, ...) for that call
alone. Calls queued but not yet written wait for the next connection, which the next call (or
one waiting) opens.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterator
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis
from redis._parsers.base import BaseParser

from common.errors import ConfigError
from common.store.tls import NO_TLS, RedisTls

Arg = str | bytes | int | float
_WATCH_S = 0.25  # how often the reply timeout is checked


def reply_error(error: hiredis.ReplyError) -> redis.RedisError:
    """The exception redis-py raises for this error reply (its own table: LOADING, NOSCRIPT, ...)."""
    found: redis.RedisError = BaseParser.parse_error(str(error))  # type: ignore[no-untyped-call]
    return found


def parsed(reader: hiredis.Reader, data: bytes) -> Iterator[Any]:
    """The replies `data` completes, an error reply as the exception redis-py raises for it;
    ConnectionError if the bytes are not RESP."""
    reader.feed(data)
    while True:
        try:
            reply = reader.gets()
        except hiredis.ProtocolError as exc:
            raise redis.ConnectionError(f"Redis protocol error: {exc}") from None
        if reply is False:
            return
        yield reply_error(reply) if isinstance(reply, hiredis.ReplyError) else reply


def pack(args: tuple[Arg, ...] | list[bytes]) -> bytes:
    packed: bytes = hiredis.pack_command(cast(Any, tuple(args)))  # its stub types a 1-tuple
    return packed


def connection_args(
    url: str, name: str = "", tls: RedisTls = NO_TLS
) -> tuple[str, int, list[list[bytes]], ssl.SSLContext | None]:
    """(host, port, the commands that open a session: AUTH, SELECT, CLIENT SETNAME `name`, TLS)
    of a redis:// or rediss:// URL, as redis-py reads it (user:password@host:port/db); a
    rediss:// URL's TLS is `tls`'s context."""
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss"}:
        # the API's reads need TCP (unix sockets are redis-py's alone)
        raise ConfigError(
            f"RANKSTREAM_REDIS_URL: the API needs a redis:// or rediss:// URL, not {parts.scheme}://"
        )
    hello: list[list[bytes]] = []
    if parts.password is not None:
        user = unquote(parts.username or "default").encode()
        hello.append([b"AUTH", user, unquote(parts.password).encode()])
    db = parts.path.strip("/")
    if db and db != "0":
        hello.append([b"SELECT", db.encode()])
    if name:
        hello.append([b"CLIENT", b"SETNAME", name.encode()])  # what CLIENT LIST shows operators
    context = tls.context() if parts.scheme == "rediss" else None
    return parts.hostname or "127.0.0.1", parts.port or 6379, hello, context


class Pipe(Protocol):
    """What the API's reads need of a Redis connection: RedisPipe (one server) or ClusterPipe
    (common/store/cluster.py)."""

    tls: RedisTls  # what the change feed's own connection uses too

    def send(self, *args: Arg) -> asyncio.Future[Any]: ...

    async def call(self, *args: Arg) -> Any: ...

    def feed_url(self, attempt: int) -> str: ...

    async def aclose(self) -> None: ...


class _Protocol(asyncio.Protocol):
    """One connection: the callers of the commands written on it, in order."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.lost: Exception | None = None
        self.progress = False  # a reply arrived since the watchdog last looked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport

    def write(self, data: bytes, futures: list[asyncio.Future[Any]]) -> None:
        if self.lost is not None or self.transport is None:
            _fail(futures, self.lost or redis.ConnectionError("Redis connection not open"))
            return
        self.waiters.extend(futures)
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        self.progress = True
        waiters = self.waiters
        try:
            for reply in parsed(self.reader, data):
                if not waiters:  # e.g. an error Redis sends before closing (max clients reached)
                    self.fail(redis.ConnectionError(f"Redis sent what nobody asked for: {reply!r}"[:200]))
                    return
                waiter = waiters.popleft()
                if waiter.done():
                    continue  # its caller went away; its reply is consumed in its turn
                if isinstance(reply, redis.RedisError):
                    waiter.set_exception(reply)
                else:
                    waiter.set_result(reply)
        except redis.ConnectionError as exc:
            self.fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis.ConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    def fail(self, error: Exception) -> None:
        """The connection is over: every call written on it fails with `error`."""
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.abort()
        waiters, self.waiters = list(self.waiters), collections.deque()
        _fail(waiters, self.lost)


def _close(protocol: _Protocol, session: list[asyncio.Future[Any]], error: Exception) -> None:
    """A session that did not open: its connection goes, and every reply it got is retrieved
    (a second refusal after the first must not be logged as never retrieved)."""
    protocol.fail(error)
    for reply in session:
        if reply.done() and not reply.cancelled():
            reply.exception()


def _fail(futures: list[asyncio.Future[Any]], error: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)
            future.exception()  # retrieved: a caller that went away logs nothing


class RedisPipe:
    """One auto-pipelined Redis connection for asyncio code (see the module's doc)."""

    def __init__(
        self, url: str, connect_timeout: float = 1.0, reply_timeout: float = 2.0, name: str = "",
        tls: RedisTls = NO_TLS,
    ) -> None:  # fmt: skip
        self._url, self.tls = url, tls
        self._host, self._port, self._hello, self._ssl = connection_args(url, name, tls)
        self._connect_timeout, self._reply_timeout = connect_timeout, reply_timeout
        self._out: list[bytes] = []  # queued, not yet written
        self._queued: list[asyncio.Future[Any]] = []
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._flush_scheduled = False
        self._watch: asyncio.TimerHandle | None = None
        self._stale_turns = 0
        self._closed = False

    def send(self, *args: Arg) -> asyncio.Future[Any]:
        """Queue one command; its reply (or error) arrives in the future. Everything queued in
        one turn of the event loop goes out in one write."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            future.set_exception(redis.ConnectionError("the Redis client is closed"))
            return future
        self._out.append(pack(args))
        self._queued.append(future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def call(self, *args: Arg) -> Any:
        return await self.send(*args)

    def feed_url(self, attempt: int) -> str:
        """Where the change feed subscribes: this server."""
        return self._url

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._queued:
            return
        protocol = self._protocol
        if protocol is not None and protocol.lost is not None:
            protocol = self._protocol = None
        if protocol is None:
            if self._connecting is None and not self._closed:
                self._connecting = asyncio.get_running_loop().create_task(self._connect())
            return
        data, futures = b"".join(self._out), self._queued
        self._out, self._queued = [], []
        protocol.write(data, futures)

    async def _connect(self) -> None:
        try:
            protocol = await self._open()
        except redis.ConnectionError as exc:
            self._fail_queued(exc)
            return
        except Exception as exc:  # noqa: BLE001 - never leave the queued calls waiting
            self._fail_queued(redis.ConnectionError(f"cannot open a Redis connection: {exc!r}"))
            return
        except asyncio.CancelledError:
            self._fail_queued(redis.ConnectionError("the Redis client is closed"))
            raise
        finally:
            self._connecting = None
        if self._closed:
            protocol.fail(redis.ConnectionError("the Redis client is closed"))
            return
        self._protocol, self._stale_turns = protocol, 0
        if self._watch is None:
            self._watch = asyncio.get_running_loop().call_later(_WATCH_S, self._check)
        self._flush()

    async def _open(self) -> _Protocol:
        """A connection whose session is open; ConnectionError if it cannot be."""
        loop = asyncio.get_running_loop()
        where = f"{self._host}:{self._port}"
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self._host, self._port, ssl=self._ssl),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise redis.ConnectionError(f"cannot connect to Redis at {where}: {exc}") from None
        session = [loop.create_future() for _ in self._hello]
        protocol.write(b"".join(pack(c) for c in self._hello), session)
        try:
            async with asyncio.timeout(self._reply_timeout):
                for reply in session:
                    await reply
        except (redis.RedisError, TimeoutError) as exc:
            refused = redis.ConnectionError(f"Redis at {where} refused the session: {exc}")
            _close(protocol, session, refused)
            raise refused from None
        except BaseException:  # cancelled (aclose): the socket goes too
            _close(protocol, session, redis.ConnectionError("the Redis client is closed"))
            raise
        if protocol.lost is not None:  # closed (or spoke unasked) before anything was written
            raise redis.ConnectionError(f"Redis at {where}: {protocol.lost}")
        return protocol

    def _fail_queued(self, error: Exception) -> None:
        futures, self._queued, self._out = self._queued, [], []
        _fail(futures, error)

    def _check(self) -> None:
        """No reply for reply_timeout while calls wait: the connection is dropped."""
        self._watch = None
        if self._closed:
            return
        protocol = self._protocol
        if protocol is None or protocol.progress or not protocol.waiters:
            self._stale_turns = 0
        else:
            self._stale_turns += 1
            if self._stale_turns * _WATCH_S >= self._reply_timeout:
                self._stale_turns = 0
                protocol.fail(redis.TimeoutError("Redis did not answer in time"))
        if protocol is not None:
            protocol.progress = False
        self._watch = asyncio.get_running_loop().call_later(_WATCH_S, self._check)

    async def aclose(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._connecting is not None:
            self._connecting.cancel()
        self._fail_queued(redis.ConnectionError("the Redis client is closed"))
        if self._protocol is not None:
            self._protocol.fail(redis.ConnectionError("the Redis client is closed"))
            self._protocol = None
