"""Which Redis: one server, or a Redis Cluster (RANKSTREAM_REDIS_CLUSTER). The one place a
synchronous client is built (the worker, backfill, the emitter, the CLI); the API's own
connection has its cluster form in common/store/cluster.py.

A cluster client (redis-py's RedisCluster) learns the slot map from any node, sends each command
to its key's slot owner, follows MOVED and ASK, reloads the map after a failover, runs SCAN over
every master and SCRIPT LOAD on every master. Every key of a board carries its hash tag, so a
script call touches one slot (common/store/keys.py)."""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlparse

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

Store = redis.Redis | RedisCluster
SLOTS = 16_384  # a Redis Cluster's hash slots
CLUSTER_HINT = "set RANKSTREAM_REDIS_CLUSTER=true to use a Redis Cluster"


def connect(url: str, cluster: bool, **kwargs: Any) -> Store:
    """A client of `url`: a cluster client when `cluster` (`url` names any of its nodes; it has
    database 0 only). Raises ValueError for a malformed URL."""
    if not cluster:
        return redis.Redis.from_url(url, **kwargs)
    if urlparse(url).path.strip("/") not in {"", "0"}:
        raise ValueError("a Redis Cluster has database 0 only: end the URL with /0 or nothing")
    return RedisCluster.from_url(url, **kwargs)


def is_cluster_node(client: redis.Redis) -> bool:
    """True when a single-node client is talking to a cluster node (it would get MOVED)."""
    info: dict[str, Any] = client.info("cluster")
    return bool(info.get("cluster_enabled"))


def masters(client: Store) -> list[redis.Redis]:
    """A client per master: each alone (one server), or each of the cluster's primaries."""
    if isinstance(client, RedisCluster):
        primaries = client.get_primaries()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        return [node_client(client, node) for node in primaries]
    return [client]


def node_client(client: RedisCluster, node: ClusterNode) -> redis.Redis:
    """The single-node client of one of the cluster's nodes (its own connection pool)."""
    return node.redis_connection or client.get_redis_connection(node)


def slot_tag(slot: int) -> str:
    """A hash tag whose keys live in `slot` (`s<n>`: the first n that hashes there)."""
    return _tags()[slot]


@cache
def _tags() -> tuple[str, ...]:
    """The tag of every slot, found by trying `s0`, `s1`, ...: ~0.1 s, once a process."""
    table: list[str | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        slot = key_slot(f"s{n}".encode())
        if table[slot] is None:
            table[slot] = f"s{n}"
            left -= 1
        n += 1
    return tuple(t or "" for t in table)
