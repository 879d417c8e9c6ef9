"""Choosing the Redis topology (RANKSTREAM_REDIS_CLUSTER) and routing the API's commands."""

from __future__ import annotations

import asyncio

import pytest
from redis.crc import key_slot

from common.errors import ConfigError
from common.settings import load_settings
from common.store.cluster import ClusterPipe, open_pipe, slot_of
from common.store.pipe import RedisPipe
from common.store.topology import connect


def test_the_routing_key_of_each_command():
    key = b"rs:{gift:room1}:seq"
    assert slot_of(("GET", key)) == key_slot(key) == key_slot(b"{gift:room1}")
    assert slot_of(("EVALSHA", "abc", 2, key, b"other")) == key_slot(key)
    assert slot_of(("EVALSHA", "abc", 0, "arg")) is None
    assert slot_of(("PING",)) is None


def test_the_setting_picks_the_api_connection():
    async def go() -> tuple[object, object]:
        single = open_pipe("redis://127.0.0.1:6379/0", False, 1.0, 2.0, "")
        cluster = open_pipe("redis://127.0.0.1:7000", True, 1.0, 2.0, "")
        await single.aclose()
        await cluster.aclose()
        return single, cluster

    single, cluster = asyncio.run(go())
    assert isinstance(single, RedisPipe)
    assert isinstance(cluster, ClusterPipe)
    assert cluster.url_of(("10.0.0.5", 7001)) == "redis://10.0.0.5:7001/0"


def test_a_node_url_keeps_the_cluster_urls_scheme_and_credentials():
    pipe = ClusterPipe("rediss://app:s3cret@redis-0:6380/0")
    assert pipe.url_of(("10.0.0.5", 7001)) == "rediss://app:s3cret@10.0.0.5:7001/0"


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_the_cluster_setting_reads_from_the_environment(value: str):
    assert load_settings({"RANKSTREAM_REDIS_CLUSTER": value}).redis_cluster is True
    assert load_settings({}).redis_cluster is False


def test_a_cluster_has_database_0_only():
    with pytest.raises(ValueError, match="database 0 only"):
        connect("redis://127.0.0.1:7000/3", True)
    with pytest.raises(ConfigError, match="redis:// or rediss://"):
        open_pipe("unix:///tmp/redis.sock", True, 1.0, 2.0, "")
