"""Helpers for integration tests: a worker loop in a thread, an API app on real Redis, waiting."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Consumer, Message

from api.app import create_app
from common.boards import load_boards
from common.settings import Settings
from worker.consumer import WorkerLoop
from worker.main import build_loop
from worker.metrics import WorkerMetrics


@contextmanager
def running_worker(settings: Settings) -> Iterator[WorkerLoop]:
    """The real worker loop (same wiring as `rankstream worker`) in a thread."""
    loop, client = build_loop(settings, WorkerMetrics())
    thread = threading.Thread(target=loop.run, name="worker", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.request_stop()
        thread.join(30)
        loop.close()
        client.close()


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_all(consumer: Consumer, count: int, timeout: float = 60.0, exact: bool = True) -> list[Message]:
    """`count` messages (or at least `count` when not `exact`): reads until that many arrived,
    then until the topic stays quiet for 2 s, so extras are seen too."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < count:
        got += [m for m in consumer.consume(500, 0.5) if m.error() is None]
    while batch := [m for m in consumer.consume(500, 2.0) if m.error() is None]:
        got += batch
    assert len(got) == count if exact else len(got) >= count, f"expected {count} messages, got {len(got)}"
    return got


def header_map(msg: Message) -> dict[str, bytes]:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return {k: v for k, v in pairs if isinstance(v, bytes)}


def api_call(settings: Settings, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """One request against the real API app on real Redis: (status, JSON body)."""

    async def go() -> tuple[int, Any]:
        client = aioredis.Redis.from_url(settings.redis_url.get_secret_value())
        app = create_app(settings, load_boards(settings.boards), client)
        async with TestClient(TestServer(app)) as http:
            resp = await http.request(method, path, **kwargs)
            return resp.status, await resp.json()

    return asyncio.run(go())
