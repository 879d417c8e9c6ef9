"""WAIT for replicas before a batch's Kafka commit (RANKSTREAM_REDIS_WAIT_REPLICAS).

Redis replicates asynchronously: a master acknowledges a write before its replicas have it, so a
master that dies before sending it loses it when its replica is promoted. The worker commits the
batch's Kafka offsets after its Redis writes, so a lost tail of writes would be events never
applied and never redelivered. With `replicas` > 0 the worker first makes every master confirm
that many replicas hold everything it wrote: on each master's own connection, a probe write
then WAIT (WAIT counts the replicas that acknowledged the connection's last write, and a
master's replication offset only grows, so the probe covers every earlier write of the batch,
whichever connection sent them). Each master is asked on a plain connection of its own, never
through the cluster client: that one would send a failed WAIT again to another node, which
would confirm writes it never saw. Any failure, or fewer confirmations than asked within the
timeout, is an infrastructure fault: the batch is not committed, it is retried (fenced, so
nothing counts twice), and the worker waits for its replicas rather than risk losing events.

What it cannot close: a master and all its confirming replicas lost at once loses what they
held, as any replicated store would."""

from __future__ import annotations

import contextlib

import redis
from redis.cluster import RedisCluster
from redis.connection import Connection
from redis.exceptions import RedisClusterException

from common.errors import InfrastructureError
from common.store.keys import replica_probe
from common.store.topology import Store, node_client, slot_tag

PROBE_TTL_MS = 60_000


class ReplicaWait:
    def __init__(self, client: Store, prefix: str, replicas: int, timeout_ms: int) -> None:
        self._client, self._prefix = client, prefix
        self.replicas, self.timeout_ms = replicas, timeout_ms
        # (the slot map, its masters' names, the probes): redis-py patches the map in place on
        # MOVED, adding a master the probes must then include
        self._known: tuple[object, frozenset[str], list[tuple[redis.Redis, str]]] | None = None

    def wait(self) -> None:
        """Return once every master has `replicas` replicas holding all its writes so far. The
        masters are asked at once (each written to, then each read: one WAIT's time in all)."""
        probes = self._probes()
        if not probes:
            raise InfrastructureError("no Redis master to confirm the batch's writes on")
        asked: list[tuple[redis.ConnectionPool, Connection]] = []
        clean = False  # every reply read: the connections go back to their pools as they are
        try:
            for server, key in probes:
                pool = server.connection_pool
                conn: Connection = pool.get_connection()
                asked.append((pool, conn))
                commands = [("SET", key, "1", "PX", PROBE_TTL_MS), ("WAIT", self.replicas, self.timeout_ms)]
                conn.send_packed_command(conn.pack_commands(commands))  # type: ignore[no-untyped-call]
            confirmed = [self._confirmed(conn) for _, conn in asked]
            clean = True
        except redis.RedisError as exc:  # e.g. MOVED: the slot moved since the map was read
            self._forget_map()
            raise InfrastructureError(f"confirming the batch's writes on replicas: {exc}") from None
        finally:
            for pool, conn in asked:
                if not clean:
                    conn.disconnect()  # type: ignore[no-untyped-call]  # replies may be left unread on it
                pool.release(conn)
        if min(confirmed) < self.replicas:
            raise InfrastructureError(
                f"only {min(confirmed)} of {self.replicas} Redis replicas confirmed the batch's writes "
                f"within {self.timeout_ms} ms: not committing it (RANKSTREAM_REDIS_WAIT_REPLICAS)"
            )

    @staticmethod
    def _confirmed(conn: Connection) -> int:
        conn.read_response()  # the probe's OK (an error reply raises)
        return int(conn.read_response())

    def _probes(self) -> list[tuple[redis.Redis, str]]:
        """(a master's own client, a key of a slot it serves): the one server, or every master
        of a cluster that serves a slot, probed on its highest slot (a reshard or a rebalance
        moves a master's lowest slots first: a probe on a moving slot fails, and holds every
        commit until the slot has moved)."""
        if not isinstance(self._client, RedisCluster):
            return [(self._client, replica_probe(self._prefix, "0"))]
        slots = self._client.nodes_manager.slots_cache
        primaries = self._client.get_primaries()  # type: ignore[no-untyped-call]  # untyped in redis-py
        names = frozenset(node.name for node in primaries)
        if self._known is not None and self._known[0] is slots and self._known[1] == names:
            return self._known[2]
        last: dict[str, int] = {}
        for slot, owners in sorted(slots.items(), reverse=True):
            if owners:
                last.setdefault(owners[0].name, slot)
        probes = []
        for name, slot in last.items():
            node = self._client.get_node(node_name=name)  # type: ignore[no-untyped-call]  # untyped in redis-py
            server = node_client(self._client, node)
            probes.append((server, replica_probe(self._prefix, slot_tag(slot))))
        self._known = (slots, names, probes)  # the map held: its identity is its version
        return probes

    def _forget_map(self) -> None:
        """A probe failed: the next batch asks again, on a map read anew."""
        self._known = None
        if isinstance(self._client, RedisCluster):
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                self._client.nodes_manager.initialize()
