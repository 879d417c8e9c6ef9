"""WAIT for replicas before a batch's Kafka commit (RANKSTREAM_REDIS_WAIT_REPLICAS).

Redis replicates asynchronously: a master acknowledges a write before its replicas have it, so a
master that dies before sending it loses it when its replica is promoted. The worker commits the
batch's Kafka offsets after its Redis writes, so a lost tail of writes would be events never
applied and never redelivered. With `replicas` > 0 the worker first makes every master confirm
that many replicas hold everything it wrote: a probe write on each master, then WAIT on the same
connection (WAIT counts the replicas that acknowledged the connection's last write, and a
master's replication offset only grows, so the probe covers every earlier write of the batch,
whichever connection sent them). Fewer confirmations than asked within the timeout is an
infrastructure fault: the batch is not committed, it is retried (fenced, so nothing counts twice),
and the worker waits for its replicas rather than risk losing events.

What it cannot close: a replica promoted while holding the writes of a batch that had not yet
been confirmed is fine (the batch is redone, fenced); a master and all its confirming replicas
lost at once loses what they held, as any replicated store would."""

from __future__ import annotations

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from common.errors import InfrastructureError
from common.store.keys import replica_probe
from common.store.topology import Store

PROBE_TTL_MS = 60_000
_MAX_TAGS = 100_000


class ReplicaWait:
    def __init__(self, client: Store, prefix: str, replicas: int, timeout_ms: int) -> None:
        self._client, self._prefix = client, prefix
        self.replicas, self.timeout_ms = replicas, timeout_ms

    def wait(self) -> None:
        """Return once every master has `replicas` replicas holding all its writes so far."""
        pipe = self._client.pipeline(transaction=False)
        for key, node in self._probes():
            pipe.execute_command("SET", key, "1", "PX", PROBE_TTL_MS)
            if node is None:
                pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
            else:
                pipe.execute_command("WAIT", self.replicas, self.timeout_ms, target_nodes=node)
        confirmed = [int(n) for n in pipe.execute()[1::2]]
        if min(confirmed) < self.replicas:
            raise InfrastructureError(
                f"only {min(confirmed)} of {self.replicas} Redis replicas confirmed the batch's writes "
                f"within {self.timeout_ms} ms: not committing it (RANKSTREAM_REDIS_WAIT_REPLICAS)"
            )

    def _probes(self) -> list[tuple[str, ClusterNode | None]]:
        """A probe key per master: one for a single server; for a cluster a key of a slot each
        master serves (found by trying tags, a few tries per master)."""
        if not isinstance(self._client, RedisCluster):
            return [(replica_probe(self._prefix, "0"), None)]
        slots = self._client.nodes_manager.slots_cache
        wanted = {node.name: node for node in self._client.get_primaries()}  # type: ignore[no-untyped-call]
        found: list[tuple[str, ClusterNode | None]] = []
        for i in range(_MAX_TAGS):
            key = replica_probe(self._prefix, str(i))
            owners = slots.get(key_slot(key.encode()))
            if owners and owners[0].name in wanted:
                found.append((key, wanted.pop(owners[0].name)))
                if not wanted:
                    break
        return found
