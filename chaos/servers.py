"""The run's servers and processes: a private Kafka and Redis (AOF, as production runs it) in a
folder of their own, `rankstream worker` and `rankstream api` processes, and the faults: kill -9,
SIGTERM, a broker stopped and started, redis-server killed and started on its AOF."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import redis
from redis.cluster import RedisCluster

from common.settings import Settings, load_settings
from rankstream.cluster import LocalRedisCluster
from rankstream.devstack import SINGLE_BROKER
from rankstream.stack import LocalKafka, LocalRedis, free_port
from rankstream.topics import ensure_topics

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "chaos:"


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `condition()` held (polled); raises TimeoutError naming `what`."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - began


class Process:
    """A `rankstream` subprocess, its stderr in a file (a pipe could fill and block it)."""

    def __init__(self, command: str, env: dict[str, str], log: Path) -> None:
        self.command, self.env, self.log = command, env, log
        self.first_env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log.open("ab") as out:
            argv = [sys.executable, "-m", "rankstream.cli", self.command]
            self.proc = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM; the exit code."""
        assert self.proc is not None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ApiNode(Process):
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port, admin_port = free_port(), free_port()
        env = {**env, "RANKSTREAM_API_PORT": str(self.port), "RANKSTREAM_API_ADMIN_PORT": str(admin_port),
               "RANKSTREAM_API_HOST": "127.0.0.1"}  # fmt: skip
        super().__init__("api", env, log)
        self.base = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        self.token = ""  # sent as a bearer token when set

    def get(self, path: str) -> tuple[int, Any]:
        """(status, JSON body); (0, None) while nothing listens."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            request = urllib.request.Request(self.base + path, headers=headers)  # noqa: S310 - loopback
            with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback
                return int(resp.status), orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return int(exc.code), orjson.loads(body) if body else None
        except OSError:
            return 0, None

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200


@dataclass
class Servers:
    """Kafka and Redis of one run, with the settings every process gets."""

    folder: Path
    kafka: LocalKafka
    redis_server: LocalRedis
    boards_file: Path
    service_redis_port: int = 0  # where the service's processes reach Redis (a proxy's port), if not Redis'
    cluster: LocalRedisCluster | None = None  # a Redis Cluster (3 masters, a replica each) instead
    wait_replicas: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)  # a scenario's own settings for every process

    @classmethod
    def start(cls, folder: Path, boards_yaml: str, *, cluster: bool = False) -> Servers:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        boards_file = folder / "boards.yaml"
        boards_file.write_text(boards_yaml, encoding="utf-8")
        kafka = LocalKafka("kafka", folder / "kafka", port=free_port(), controller_port=free_port())
        nodes = LocalRedisCluster(folder / "cluster") if cluster else None
        if nodes is not None:
            nodes.start()
            redis_server = nodes.nodes[0]
        else:
            redis_server = LocalRedis("redis", folder / "redis", port=free_port(), persist=True)
            redis_server.start()
        kafka.start()
        servers = cls(folder, kafka, redis_server, boards_file, cluster=nodes)
        ensure_topics(servers.settings())
        return servers

    def settings(self) -> Settings:
        return load_settings(
            {},
            kafka_bootstrap=self.kafka.bootstrap,
            redis_url=self.redis_server.url,
            boards=self.boards_file,
            key_prefix=PREFIX,
            worker_group="chaos-workers",
            **SINGLE_BROKER,
        )

    def env(self) -> dict[str, str]:
        """A `rankstream` process' environment (none of the caller's RANKSTREAM_ variables)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
        env.update(
            RANKSTREAM_KAFKA_BOOTSTRAP=self.kafka.bootstrap,
            RANKSTREAM_REDIS_URL=f"redis://127.0.0.1:{self.service_redis_port or self.redis_server.port}/0",
            RANKSTREAM_BOARDS=str(self.boards_file),
            RANKSTREAM_KEY_PREFIX=PREFIX,
            RANKSTREAM_WORKER_GROUP="chaos-workers",
            RANKSTREAM_LOG_LEVEL="WARNING",
            **{f"RANKSTREAM_{k.upper()}": str(v) for k, v in SINGLE_BROKER.items()},
        )
        if self.cluster is not None:
            env.update(
                RANKSTREAM_REDIS_CLUSTER="true", RANKSTREAM_REDIS_WAIT_REPLICAS=str(self.wait_replicas)
            )
        env.update(self.extra_env)
        return env

    def redis(self) -> redis.Redis:
        if self.cluster is not None:
            return cast(
                redis.Redis, RedisCluster(host="127.0.0.1", port=self.redis_server.port, socket_timeout=30)
            )
        return redis.Redis(port=self.redis_server.port, socket_timeout=30)

    def used_memory(self) -> int:
        """Redis' own `used_memory` (a single server's)."""
        client = redis.Redis(port=self.redis_server.port, socket_timeout=30)
        try:
            return int(client.info("memory")["used_memory"])
        finally:
            client.close()

    def worker(self, name: str) -> Process:
        env = {**self.env(), "RANKSTREAM_WORKER_ID": name, "RANKSTREAM_WORKER_HTTP_PORT": str(free_port())}
        return Process("worker", env, self.folder / f"{name}.log")

    def api_node(self, name: str) -> ApiNode:
        return ApiNode(self.env(), self.folder / f"{name}.log")

    # --- faults ---------------------------------------------------------------------------
    def restart_kafka(self, down_s: float) -> None:
        """The broker stopped (SIGTERM, a clean shutdown), down `down_s`, started on its data."""
        self.kafka.stop()
        time.sleep(down_s)  # the outage's length is the fault itself
        self.kafka.start()

    def kill_redis(self) -> None:
        """kill -9 of redis-server, then started again on its append-only file."""
        proc = self.redis_server.proc
        assert proc is not None
        proc.kill()
        proc.wait(30)
        self.redis_server.pid_file.unlink(missing_ok=True)
        self.redis_server.start(timeout=120)

    def fail_over(self, master: int) -> None:
        """kill -9 of the master on port `master`; its replica takes over; the killed node is
        started again once the cluster is whole without it, and rejoins as a replica."""
        assert self.cluster is not None
        self.cluster.kill(master)
        self.cluster.wait_ok(120)
        self.cluster.restart(master)
        self.cluster.wait_ok(120)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.kafka.stop()
            return
        for server in (self.kafka, self.redis_server):
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - stop the other one too; the run's own error matters more
                print(f"stopping {server.name}: {exc}", file=sys.stderr)
