"""The pipelined connection against a stub server for what a real Redis rarely does on demand:
a server that speaks before it is asked and closes (max clients reached) must fail the calls,
never leave them waiting, whatever the event loop; error replies map to redis-py's classes."""

from __future__ import annotations

import asyncio
import socket
import threading

import hiredis
import pytest
import redis
import uvloop

from common.store.pipe import RedisPipe, reply_error


def refusing_server() -> int:
    """Accepts, says max clients reached, closes: a port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            conn, _ = sock.accept()
            conn.sendall(b"-ERR max number of clients reached\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(sock.getsockname()[1])


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_server_that_refuses_at_once_fails_the_calls(loop):
    port = refusing_server()

    async def go() -> list[str]:
        real = asyncio.get_running_loop().create_connection

        async def slow(*args, **kwargs):  # the loop busy elsewhere before the connect resumes
            made = await real(*args, **kwargs)
            await asyncio.sleep(0.05)
            return made

        asyncio.get_running_loop().create_connection = slow  # type: ignore[method-assign]
        pipe = RedisPipe(f"redis://127.0.0.1:{port}/0", reply_timeout=0.5)
        out = []
        for _ in range(3):
            try:
                await asyncio.wait_for(pipe.call("PING"), 3)
                out.append("answered")
            except redis.ConnectionError:
                out.append("ConnectionError")
        await pipe.aclose()
        return out

    run = uvloop.run if loop == "uvloop" else asyncio.run
    assert run(go()) == ["ConnectionError"] * 3


def test_error_replies_keep_redis_py_classes():
    def mapped(text: str) -> type:
        return type(reply_error(hiredis.ReplyError(text)))

    assert mapped("LOADING Redis is loading the dataset in memory") is redis.BusyLoadingError
    assert mapped("NOSCRIPT No matching script") is redis.exceptions.NoScriptError
    assert mapped("ERR max number of clients reached") is redis.ConnectionError
    assert mapped("WRONGTYPE Operation against a key") is redis.ResponseError
