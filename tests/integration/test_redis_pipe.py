"""The API's pipelined Redis connection (common/store/pipe.py) on real Redis: each caller gets
its own reply, whatever the others do; a session Redis refuses fails the calls instead of
running them elsewhere; error replies keep redis-py's exception types; a dropped connection
fails what was written on it and the next call reconnects."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import NoScriptError

from common.store.pipe import RedisPipe

pytestmark = pytest.mark.integration


def test_each_caller_gets_its_own_reply(settings, rclient):
    keys = [f"{settings.key_prefix}pipe:{i}" for i in range(200)]
    for i, key in enumerate(keys):
        rclient.set(key, i)

    async def go() -> list[object]:
        pipe = RedisPipe(settings.redis_url.get_secret_value())
        try:
            futures = [pipe.send("GET", key) for key in keys]
            for future in futures[::3]:
                future.cancel()  # callers that went away: their replies are consumed in turn
            got = [await f for f in futures if not f.cancelled()]
            bad = pipe.send("HGET", keys[0], "x")  # WRONGTYPE: an error for this caller alone
            after = pipe.send("GET", keys[1])
            errors = []
            for future in (bad, pipe.send("EVALSHA", "0" * 40, 0)):
                try:
                    await future
                except redis.ResponseError as exc:
                    errors.append(type(exc).__name__)
            return [got, errors, await after]
        finally:
            await pipe.aclose()

    got, errors, after = asyncio.run(go())
    assert got == [str(i).encode() for i in range(200) if i % 3]
    assert errors == ["ResponseError", NoScriptError.__name__]
    assert after == b"1"


def test_a_refused_session_fails_the_calls(settings, rclient):
    """Database 99 does not exist: nothing may run on the connection's default database."""
    url = settings.redis_url.get_secret_value().rsplit("/", 1)[0] + "/99"
    key = f"{settings.key_prefix}pipe:db"
    rclient.set(key, "db0")

    async def go() -> list[str]:
        pipe = RedisPipe(url)
        out = []
        try:
            for _ in range(2):  # and again on the next connection
                try:
                    out.append(repr(await pipe.call("GET", key)))
                except redis.ConnectionError as exc:
                    out.append("refused" if "refused the session" in str(exc) else str(exc))
        finally:
            await pipe.aclose()
        return out

    assert asyncio.run(go()) == ["refused", "refused"]


def test_a_dropped_connection_fails_its_calls_and_the_next_reconnects(settings, rclient):
    async def go() -> tuple[str, bytes]:
        pipe = RedisPipe(settings.redis_url.get_secret_value(), name="pipe-test-drop")
        try:
            await pipe.call("PING")
            # a call Redis holds (BLPOP on a list nobody fills) while the connection is killed
            waiting = pipe.send("BLPOP", f"{settings.key_prefix}pipe:never", 5)
            await asyncio.sleep(0.1)
            for client in rclient.client_list():
                if client.get("name") == "pipe-test-drop":
                    rclient.client_kill_filter(_id=client["id"])
            try:
                await waiting
                failed = "answered"
            except redis.ConnectionError:
                failed = "ConnectionError"
            return failed, await pipe.call("PING")
        finally:
            await pipe.aclose()

    assert asyncio.run(go()) == ("ConnectionError", b"PONG")
