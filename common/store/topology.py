"""Which Redis: one server, or a Redis Cluster (RANKSTREAM_REDIS_CLUSTER). The one place a
synchronous client is built (the worker, backfill, the emitter, the CLI); the API's own
connection has its cluster form in common/store/cluster.py.

A cluster client (redis-py's RedisCluster) learns the slot map from any node, sends each command
to its key's slot owner, follows MOVED and ASK, reloads the map after a failover, runs SCAN over
every master and SCRIPT LOAD on every master. Every key of a board carries its hash tag, so a
script call touches one slot (common/store/keys.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import redis
from redis.cluster import RedisCluster

Store = redis.Redis | RedisCluster
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
        return [node.redis_connection or client.get_redis_connection(node) for node in client.get_primaries()]  # type: ignore[no-untyped-call]
    return [client]
