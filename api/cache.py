"""A short-TTL cache for top pages of non-hot boards, with single-flight: a burst of identical
misses makes one Redis call and every caller awaits its result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from cachetools import TTLCache

V = TypeVar("V")


class SingleFlightCache(Generic[V]):
    def __init__(self, ttl_s: float, maxsize: int = 10_000) -> None:
        self.enabled = ttl_s > 0
        self._cache: TTLCache[Hashable, V] = TTLCache(
            maxsize=maxsize, ttl=max(ttl_s, 1e-9), timer=time.monotonic
        )
        self._inflight: dict[Hashable, asyncio.Future[V]] = {}
        self.hits = 0
        self.misses = 0

    async def get(self, key: Hashable, load: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """(value, was it a hit). Loads at most once per key at a time."""
        if not self.enabled:
            return await load(), False
        try:
            value = self._cache[key]
        except KeyError:
            pass
        else:
            self.hits += 1
            return value, True
        pending = self._inflight.get(key)
        if pending is not None:
            self.hits += 1  # served by the call already in flight
            return await asyncio.shield(pending), True
        self.misses += 1
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await load()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs "never retrieved"
            raise
        else:
            self._cache[key] = value
            future.set_result(value)
            return value, False
        finally:
            del self._inflight[key]
