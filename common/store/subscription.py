"""A pub/sub connection for asyncio code (the API's change feed, api/warm.py): framing and
session as common/store/pipe.py's, replies pushed to a callback instead of matched to callers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import hiredis
import redis

from common.store.pipe import connection_args, pack, parsed
from common.store.tls import NO_TLS, RedisTls


class _Feed(asyncio.Protocol):
    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.reader = hiredis.Reader()
        self.deliver = deliver
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            for reply in parsed(self.reader, data):
                self.deliver(reply)
        except redis.ConnectionError as exc:
            self.deliver(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.deliver(redis.ConnectionError(f"Redis connection lost: {exc or 'closed'}"))


class Subscription:
    """Every reply Redis pushes (`[b"subscribe", channel, n]`, `[b"message", channel, data]`)
    goes to `deliver`, and so does the exception that ends the connection (a ConnectionError,
    or the error Redis answered). The session's own replies (AUTH, CLIENT SETNAME) are not
    delivered."""

    def __init__(
        self, url: str, deliver: Callable[[Any], None], connect_timeout: float = 1.0, name: str = "",
        tls: RedisTls = NO_TLS,
    ) -> None:  # fmt: skip
        self._host, self._port, hello, self._ssl = connection_args(url, name, tls)
        self._hello = [c for c in hello if c[0] != b"SELECT"]  # pub/sub spans every db
        self._deliver, self._connect_timeout = deliver, connect_timeout
        self._skip = len(self._hello)
        self._protocol: _Feed | None = None

    def _on_reply(self, reply: Any) -> None:
        if self._skip and not isinstance(reply, Exception):
            self._skip -= 1  # the session's OKs
            return
        self._deliver(reply)

    async def open(self, *channels: str) -> None:
        loop = asyncio.get_running_loop()
        where = f"{self._host}:{self._port}"
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Feed(self._on_reply), self._host, self._port, ssl=self._ssl),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise redis.ConnectionError(f"cannot connect to Redis at {where}: {exc}") from None
        self._protocol = protocol
        commands = [*self._hello, [b"SUBSCRIBE", *(c.encode() for c in channels)]]
        try:
            assert protocol.transport is not None
            protocol.transport.write(b"".join(pack(c) for c in commands))
        except RuntimeError as exc:  # uvloop: the connection closed before this write
            raise redis.ConnectionError(f"Redis at {where} closed the connection: {exc}") from None

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()
        self._protocol = None
