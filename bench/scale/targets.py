"""The two Redis set-ups the scale benchmark compares, as it sees them: the harness' single
Redis, and a Redis Cluster of 3 masters with a replica each (rankstream/cluster.py). Every node
the same way: AOF on (everysec, as `rankstream dev` runs Redis: what users pay for a write) and
no automatic AOF rewrite (its fork would land in one measurement and not another); a cluster
node may be silent 15 s before it is failed over (the tests' 1 s would let a box starved by the
bench itself fail a master over mid-run). Per node: its port, pid, role, INFO cpu and
the counters of bench/scale/profile.py."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import redis
from redis.cluster import RedisCluster

from bench.common import BenchError, say
from bench.harness.stack import Stack
from bench.scale.profile import Snapshot, snapshot
from common.settings import Settings
from common.store.topology import connect
from rankstream.cluster import LocalRedisCluster

NODE_TIMEOUT_MS = 15_000
AOF_READY_S = 60.0


@dataclass(frozen=True)
class Node:
    port: int
    pid: int
    replica: bool

    @property
    def label(self) -> str:
        return f"redis_{'replica' if self.replica else 'master'}_{self.port}"


@dataclass
class RedisTarget:
    name: str  # "single" | "cluster"
    url: str
    cluster: bool
    nodes: list[Node]
    _clients: dict[int, redis.Redis] = field(default_factory=dict, init=False)

    def client(self, node: Node) -> redis.Redis:
        if node.port not in self._clients:
            self._clients[node.port] = redis.Redis(port=node.port, socket_timeout=60)
        return self._clients[node.port]

    @property
    def masters(self) -> list[Node]:
        return [n for n in self.nodes if not n.replica]

    @property
    def replicas(self) -> list[Node]:
        return [n for n in self.nodes if n.replica]

    def pids(self) -> dict[str, int]:
        return {node.label: node.pid for node in self.nodes}

    def snapshots(self) -> dict[int, Snapshot]:
        """Each node's counters (bench/scale/profile.py: its own CPU seconds so far too), by port."""
        return {node.port: snapshot(self.client(node), self.cluster) for node in self.nodes}

    @property
    def roles(self) -> dict[str, list[int]]:
        return {"masters": [n.port for n in self.masters], "replicas": [n.port for n in self.replicas]}

    def prepare(self) -> None:
        """AOF on, no automatic rewrite, the long node timeout; until every AOF is written."""
        for node in self.nodes:
            client = self.client(node)
            client.config_set("auto-aof-rewrite-percentage", 0)
            client.config_set("appendonly", "yes")
            if self.cluster:
                client.config_set("cluster-node-timeout", NODE_TIMEOUT_MS)
        deadline = time.monotonic() + AOF_READY_S
        while not all(self._aof_ready(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: AOF not on everywhere after {AOF_READY_S:.0f}s")
            time.sleep(0.1)

    def _aof_ready(self, node: Node) -> bool:
        info = self.client(node).info("persistence")
        return (
            bool(info["aof_enabled"])
            and not info["aof_rewrite_in_progress"]
            and not info["aof_rewrite_scheduled"]
        )

    def flush(self) -> None:
        """Empty Redis (the replicas follow their masters)."""
        for node in self.masters:
            self.client(node).flushall()

    def check_roles(self) -> None:
        """BenchError when a node changed role (a failover happened while measuring)."""
        for node in self.nodes:
            role = self.client(node).info("replication")["role"]
            if (role == "slave") != node.replica:
                raise BenchError(f"{self.name}: node {node.port} is now a {role}: a failover happened")

    def applied(self, seq_keys: Sequence[str]) -> int:
        """The sum of the boards' seq keys: events applied."""
        client = connect(self.url, self.cluster, socket_timeout=60)
        try:
            if isinstance(client, RedisCluster):
                values = client.mget_nonatomic(list(seq_keys))
            else:
                values = cast("list[bytes | None]", client.mget(seq_keys))
        finally:
            client.close()
        return sum(int(v) for v in values if v is not None)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def single_target(stack: Stack) -> RedisTarget:
    server = stack.redis_server
    assert server.proc is not None
    return RedisTarget("single", server.url, False, [Node(server.port, server.proc.pid, replica=False)])


def cluster_target(cluster: LocalRedisCluster) -> RedisTarget:
    masters = set(cluster.master_ports())
    nodes = []
    for server in cluster.nodes:
        assert server.proc is not None
        nodes.append(Node(server.port, server.proc.pid, replica=server.port not in masters))
    return RedisTarget("cluster", cluster.url, True, nodes)


@contextlib.contextmanager
def local_cluster(folder: Path) -> Iterator[LocalRedisCluster]:
    """A fresh local Redis Cluster in `folder`, stopped however the run ends."""
    cluster = LocalRedisCluster(folder)
    say("starting a Redis Cluster (3 masters, a replica each)")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def part_settings(stack: Stack, target: RedisTarget, part: str, index: int) -> Settings:
    """Settings of one part of the scale benchmark: its own topics, group and key prefix on `target`."""
    tag = f"scale-{part}-{uuid.uuid4().hex[:8]}"
    return stack.settings(
        tag,
        key_prefix=f"s{index}:",
        worker_group=f"bench-{tag}",
        redis_url=target.url,
        redis_cluster=target.cluster,
    )
