"""The bench's own HTTP/1.1 client pieces: a request (method, path, JSON body) encoded once to
the bytes sent, a file of requests (one JSON object a line), and one keep-alive connection as an
asyncio Protocol: a few microseconds of client CPU per request (aiohttp's client costs ~10x
more, which would be measured too)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, cast

import orjson

_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)")


class Request(NamedTuple):
    """What to send: a body (any JSON value) goes JSON-encoded, Content-Type application/json."""

    method: str
    path: str  # with its query
    body: Any = None  # None: no body


def encode(request: Request, host: str) -> bytes:
    """The request's bytes on the wire; `host` is the Host header (host:port)."""
    head = f"{request.method} {request.path} HTTP/1.1\r\nHost: {host}\r\n"
    if request.body is None:
        return f"{head}\r\n".encode()
    body = orjson.dumps(request.body)
    return f"{head}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def write_requests(path: Path, requests: Iterable[Request]) -> int:
    """One JSON object a line: {"method", "path", "body"?}; how many were written."""
    n = 0
    with path.open("wb") as out:
        for request in requests:
            line: dict[str, Any] = {"method": request.method, "path": request.path}
            if request.body is not None:
                line["body"] = request.body
            out.write(orjson.dumps(line) + b"\n")
            n += 1
    return n


def read_requests(path: Path) -> list[Request]:
    out: list[Request] = []
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                x = orjson.loads(line)
                out.append(Request(x["method"], x["path"], x.get("body")))
    return out


class Reply(NamedTuple):
    status: int
    body: bytes  # empty unless the connection keeps bodies
    arrived: float  # time.perf_counter() when its last byte was read


class HttpConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request in flight at a time; answers must carry a
    Content-Length (aiohttp's do). `keep_body`: the reply holds the body (else b"", cheaper)."""

    def __init__(self, keep_body: bool = False) -> None:
        self.keep_body = keep_body
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Reply] | None = None
        self.lost = False
        self._status = 0
        self._body_at = -1  # where the body of the answer being read starts (-1: head not read)
        self._total = 0  # head + body bytes of that answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        if self._body_at < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            length = _LENGTH.search(head)
            if length is None:
                self.waiter.set_exception(ConnectionError("no content-length"))
                return
            self._status, self._body_at = int(head[9:12]), end + 4
            self._total = self._body_at + int(length[1])
        if len(self.buffer) < self._total:
            return
        body = bytes(self.buffer[self._body_at : self._total]) if self.keep_body else b""
        del self.buffer[: self._total]
        self._body_at = -1
        self.waiter.set_result(Reply(self._status, body, time.perf_counter()))

    def send(self, request: bytes) -> asyncio.Future[Reply]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
