"""A real Redis Cluster on loopback from the same redis-server binary: masters with one replica
each, made by `redis-cli --cluster create`. The test fixtures and the scale benchmark start one;
it also moves slots live (MOVED/ASK) and kills masters (failover), as the tests of those need."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from common.errors import StackError
from common.store.topology import SLOTS
from rankstream.stack import (
    REDIS_INSTALL_HINT,
    LocalRedis,
    TlsFiles,
    ensure_redis_server,
    ephemeral_low,
    port_bindable,
)

BUS_OFFSET = 10_000  # a node's cluster bus listens on its port + 10000 (so the port is <= 55535)


NODE_PORTS = (20_000, 30_000)  # where nodes listen, their buses 10000 higher (free_port's are below)


def free_node_port(taken: set[int]) -> int:
    """A loopback port free for a cluster node and for its bus (the port + 10000), both below the
    kernel's ephemeral range where it has one (Linux' 32768 by default cuts the nodes' range to
    20000-22767), so no outgoing connection takes either while the node starts (one CI run met a
    node failing to bind a bus port a connection had taken meanwhile)."""
    rng = random.SystemRandom()
    low, until = NODE_PORTS
    ephemeral = ephemeral_low()
    if ephemeral is not None and ephemeral - BUS_OFFSET - low >= 100:
        until = min(until, ephemeral - BUS_OFFSET)
    for _ in range(1_000):
        port = rng.randrange(low, until)
        near = {port, port + BUS_OFFSET}
        if not near & taken and port_bindable(port) and port_bindable(port + BUS_OFFSET):
            return port
    raise StackError(f"no free port pair for a Redis Cluster node in {low}-{until + BUS_OFFSET}")


def _cmd(client: redis.Redis, *args: str | int) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def redis_cli() -> str:
    ensure_redis_server()
    found = shutil.which("redis-cli")
    if found is None:
        raise StackError(f"redis-cli not found (it comes with redis-server): {REDIS_INSTALL_HINT}")
    return found


def _cli(argv: list[str], what: str, timeout: float = 120.0) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"{what} failed: {exc}") from None
    if proc.returncode != 0 or "[ERR]" in proc.stdout:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise StackError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


@dataclass
class LocalRedisCluster:
    """`masters` masters with `replicas` replicas each; `node_timeout_ms` is how long a master
    may be silent before its replica takes over."""

    folder: Path
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1_000
    tls: TlsFiles | None = None  # TLS between clients and nodes, and between nodes
    nodes: list[LocalRedis] = field(default_factory=list, init=False)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """Any node names the cluster; the clients discover the rest."""
        return self.nodes[0].url

    def start(self, timeout: float = 60.0) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        taken: set[int] = set()
        for i in range(self.masters * (1 + self.replicas)):
            folder = self.folder / f"node{i}"
            extra: tuple[str, ...] = ("--cluster-enabled", "yes", "--cluster-config-file",
                                      str(folder / "nodes.conf"), "--cluster-node-timeout",
                                      str(self.node_timeout_ms))  # fmt: skip
            if self.tls is not None:
                extra += ("--tls-cluster", "yes", "--tls-replication", "yes")
            port = free_node_port(taken)
            taken |= {port, port + BUS_OFFSET}
            self.nodes.append(LocalRedis(f"redis{i}", folder, port=port, extra=extra, tls=self.tls))
        for node in self.nodes:
            node.start()
        hosts = [f"127.0.0.1:{port}" for port in self.ports]
        argv = [redis_cli(), *self._cli_tls(), "--cluster", "create", *hosts]
        argv += ["--cluster-replicas", str(self.replicas)]
        _cli([*argv, "--cluster-yes"], "creating the Redis Cluster", timeout)
        self.wait_ok(timeout)

    def stop(self) -> None:
        for port in self.alive():  # a frozen node would take SIGTERM only once resumed
            with contextlib.suppress(ProcessLookupError):
                self.thaw(port)
        for node in self.nodes:
            with contextlib.suppress(StackError, OSError, subprocess.TimeoutExpired):
                node.stop(timeout=5)

    def client(self, port: int) -> redis.Redis:
        tls = {} if self.tls is None else self.tls.redis_kwargs()
        return redis.Redis(port=port, socket_timeout=5, decode_responses=True, **tls)

    def _cli_tls(self) -> list[str]:
        return [] if self.tls is None else self.tls.redis_cli_args()

    def alive(self) -> list[int]:
        return [n.port for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node sees every slot served, the same master per slot, and each
        replica in sync with its master."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                last = self._not_ok()
            except redis.RedisError as exc:
                last = str(exc)
            if not last:
                return
            time.sleep(0.1)
        raise StackError(f"the Redis Cluster in {self.folder} is not ok after {timeout:.0f}s: {last}")

    def _not_ok(self) -> str:
        maps = set()
        for port in self.alive():
            client = self.client(port)
            info = client.cluster("info")
            if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != SLOTS:
                return f"node {port}: {info['cluster_state']}, {info['cluster_slots_ok']} slots ok"
            maps.add(tuple(sorted((s, o) for s, o in self._owners(client).items())))
            repl = client.info("replication")
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return f"replica {port}: link to its master {repl.get('master_link_status')}"
        return "" if len(maps) == 1 else f"{len(maps)} different slot maps"

    def _owners(self, client: redis.Redis) -> dict[tuple[int, int], int]:
        return {(int(r[0]), int(r[1])): int(r[2][1]) for r in _cmd(client, "CLUSTER", "SLOTS")}

    def owner(self, slot: int) -> int:
        """The port of the master serving `slot`, as the first live node sees it."""
        owners = self._owners(self.client(self.alive()[0]))
        return next(port for (lo, hi), port in owners.items() if lo <= slot <= hi)

    def slots_of(self, master: int) -> list[int]:
        """The slots the master on port `master` serves, in order."""
        owners = self._owners(self.client(self.alive()[0]))
        return [s for (lo, hi), port in sorted(owners.items()) if port == master for s in range(lo, hi + 1)]

    def master_ports(self) -> list[int]:
        return sorted(set(self._owners(self.client(self.alive()[0])).values()))

    def replica_of(self, master: int) -> int:
        return next(
            p for p in self.alive() if self.client(p).info("replication").get("master_port") == master
        )

    def node_id(self, port: int) -> str:
        return str(_cmd(self.client(port), "CLUSTER", "MYID"))

    def kill(self, port: int) -> None:
        """SIGKILL a node: what a crashed machine looks like to the others."""
        node = next(n for n in self.nodes if n.port == port)
        if node.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)

    def freeze(self, port: int) -> None:
        """SIGSTOP a node: alive but silent (a stalled machine); `thaw` resumes it."""
        self._signal(port, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        self._signal(port, signal.SIGCONT)

    def _signal(self, port: int, sig: signal.Signals) -> None:
        node = next(n for n in self.nodes if n.port == port)
        if node.proc is not None and node.proc.poll() is None:
            os.killpg(node.proc.pid, sig)

    def restart(self, port: int) -> None:
        """Start a killed node again: it rejoins (its nodes.conf) as a replica of its successor."""
        node = next(n for n in self.nodes if n.port == port)
        node.start()

    def migrate_slot(self, slot: int, to: int, batch: int = 5, pause_s: float = 0.02) -> int:
        """Move `slot` to the master on port `to` the way redis-cli does, a few keys at a time
        with `pause_s` between batches (clients meet ASK and TRYAGAIN meanwhile); then every
        master is told the new owner. Returns how many keys moved."""
        source = self.owner(slot)
        src, dst = self.client(source), self.client(to)
        src_id, dst_id = self.node_id(source), self.node_id(to)
        _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := _cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, batch):
            _cmd(src, "MIGRATE", "127.0.0.1", to, "", 0, 10_000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause_s)
        others = [p for p in self.master_ports() if p not in {source, to}]
        for port in (to, source, *others):  # the new owner first, as redis-cli does
            _cmd(self.client(port), "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    def reshard(self, source: int, to: int, slots: int) -> None:
        """`redis-cli --cluster reshard`: move `slots` slots from one master to another."""
        argv = [redis_cli(), *self._cli_tls(), "--cluster", "reshard", f"127.0.0.1:{source}"]
        argv += ["--cluster-from", self.node_id(source), "--cluster-to", self.node_id(to)]
        argv += ["--cluster-slots", str(slots)]
        _cli([*argv, "--cluster-yes"], "resharding the Redis Cluster", timeout=300)
