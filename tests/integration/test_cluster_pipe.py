"""The API's cluster connection (common/store/cluster.py) on a real Redis Cluster: each command
reaches its slot's master, a stale slot map is corrected by MOVED without the caller seeing it,
scripts are loaded where they run, and PING asks every master. Slots moving (ASK, TRYAGAIN) and
masters failing over: tests/integration/test_cluster_ops.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.cluster import RedisCluster

from common.settings import Settings
from common.store.cluster import ClusterPipe, open_pipe
from common.store.scripts import LuaScript

# a script no Redis has loaded before (its SHA is new each run)
ECHO = LuaScript("echo", f"-- {uuid.uuid4()}\nreturn redis.call('GET', KEYS[1])")

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("topology", ["cluster"], indirect=True)]


def test_every_key_reaches_its_master_and_a_stale_map_is_corrected(settings: Settings, rclient):
    assert isinstance(rclient, RedisCluster)
    keys = [f"{settings.key_prefix}{{b{i}}}:seq" for i in range(300)]
    for i, key in enumerate(keys):
        rclient.set(key, i)
    masters = {rclient.get_node_from_key(k).name for k in keys}  # type: ignore[no-untyped-call]
    assert len(masters) == 3  # the keys spread over every master

    async def go() -> tuple[list[int], list[int], int, int]:
        pipe = ClusterPipe(settings.redis_url.get_secret_value())
        try:
            first = [int(v) for v in await asyncio.gather(*(pipe.send("GET", k) for k in keys))]
            loaded = pipe.reloads
            # every slot pointed at one master: two thirds of the keys are refused with MOVED
            wrong = next(n for n in pipe._slots if n is not None)
            pipe._slots = [wrong] * len(pipe._slots)
            second = [int(v) for v in await asyncio.gather(*(pipe.send("GET", k) for k in keys))]
            if pipe._reload is not None:
                await pipe._reload  # the reload MOVED started (the reads went straight to the owner)
            return first, second, loaded, pipe.reloads
        finally:
            await pipe.aclose()

    first, second, loaded, reloads = asyncio.run(go())
    assert first == second == list(range(300))
    assert loaded == 1
    assert reloads >= 2  # MOVED reloaded the whole map


def test_scripts_load_on_every_master_and_ping_asks_them_all(settings: Settings, rclient):
    keys = [f"{settings.key_prefix}{{s{i}}}:seq" for i in range(30)]
    for i, key in enumerate(keys):
        rclient.set(key, i)
    masters = rclient.get_primaries()
    assert [rclient.get_redis_connection(n).script_exists(ECHO.sha)[0] for n in masters] == [False] * 3

    async def go() -> tuple[list[bytes], object]:
        pipe = open_pipe(settings.redis_url.get_secret_value(), True, 1.0, 2.0, "test-cluster-pipe")
        assert isinstance(pipe, ClusterPipe)
        try:
            got = await asyncio.gather(*(ECHO.run_pipe(pipe, [k], []) for k in keys))  # NOSCRIPT first
            return list(got), await pipe.call("PING")
        finally:
            await pipe.aclose()

    got, pong = asyncio.run(go())
    assert [int(v) for v in got] == list(range(30))
    assert pong in {b"PONG", "PONG"}
    assert [rclient.get_redis_connection(n).script_exists(ECHO.sha)[0] for n in masters] == [True] * 3
