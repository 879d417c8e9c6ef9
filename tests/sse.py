"""A reader of server-sent events for tests, written from the HTML standard's parsing rules
(independent of the product's, rankstream/watch.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import ClientResponse


@dataclass
class Event:
    event: str = "message"
    id: str | None = None
    data: list[str] = field(default_factory=list)
    comment: str | None = None  # a comment line, reported on its own

    def json(self) -> Any:
        return orjson.loads("\n".join(self.data))


class EventReader:
    def __init__(self, response: ClientResponse) -> None:
        self.response = response
        self.retry_ms: int | None = None

    async def next(self, within: float = 30.0) -> Event:
        """The next event or comment."""
        return await asyncio.wait_for(self._next(), within)

    async def _next(self) -> Event:
        current = Event()
        seen = False
        while True:
            raw = await self.response.content.readline()
            if not raw:
                raise EOFError("the stream ended")
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                return Event(comment=line[1:].strip())
            if not line:
                if seen and (current.data or current.id is not None):
                    return current
                current, seen = Event(), False
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            seen = True
            if name == "event":
                current.event = value
            elif name == "data":
                current.data.append(value)
            elif name == "id":
                current.id = value
            elif name == "retry":
                self.retry_ms = int(value)

    async def page(self, within: float = 30.0) -> Event:
        """The next `top` event (comments and other events skipped)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within
        while True:
            found = await self.next(max(0.01, end - loop.time()))
            if found.event == "top" and found.comment is None:
                return found
