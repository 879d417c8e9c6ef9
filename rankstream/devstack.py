"""`rankstream stack` and `rankstream dev` (make run): the local stack in one known folder."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from common.errors import StackError
from common.settings import Settings
from rankstream.demo import DEMO_HOT_BOARD
from rankstream.stack import (
    KAFKA_VERSION,
    LocalKafka,
    LocalRedis,
    docker_engine_available,
    ensure_java,
    ensure_kafka_jars,
    ensure_nginx,
    ensure_redis_server,
    pid_alive,
    port_open,
    read_pid,
)
from rankstream.topics import ensure_topics

_log = logging.getLogger(__name__)


COMPOSE_FILE = Path(__file__).resolve().parent.parent / "deploy" / "compose.yaml"
# one broker: every partition on it, and a write acknowledged once it has it
SINGLE_BROKER = {"topic_replication": 1, "topic_min_insync_replicas": 1}


def stack_topics(settings: Settings, kafka_bootstrap: str) -> None:
    """The topics on the local stack's single broker. Not strict: a stack kept from an older
    release may hold topics made with other settings; they are logged, and left as they are."""
    ensure_topics(
        settings.model_copy(update={"kafka_bootstrap": kafka_bootstrap, **SINGLE_BROKER}), strict=False
    )


class DevStack:
    """Kafka and Redis for local use, on fixed ports, surviving between `make run`s."""

    def __init__(self, folder: Path, kafka_port: int = 9092, redis_port: int = 6379) -> None:
        self.folder = folder.resolve()
        self.kafka_bootstrap = f"127.0.0.1:{kafka_port}"
        self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self.kafka = LocalKafka(
            "kafka", self.folder / "kafka", port=kafka_port, controller_port=kafka_port + 1
        )
        # append-only file: Redis must not forget what Kafka's committed offsets say was applied
        self.redis = LocalRedis("redis", self.folder / "redis", port=redis_port, persist=True)

    def prepare(self) -> str:
        """Install or fetch what the servers need (Redis binary, Java check, Kafka jars), and nginx
        where it can (only the test of an HTTP cache in front of an API node needs it); start
        nothing."""
        redis_server, java, jars = ensure_redis_server(), ensure_java(), ensure_kafka_jars()
        try:
            nginx = ensure_nginx()
        except StackError as exc:  # the service runs without it
            nginx = f"no nginx ({exc}; only tests/integration/test_http_cdn.py needs it)"
        return f"ready: {redis_server}, {java}, Kafka {KAFKA_VERSION} jars in {jars}, {nginx}"

    def _running(self, server: LocalKafka | LocalRedis, port: int) -> bool:
        pid = read_pid(server.pid_file)
        return pid is not None and pid_alive(pid) and port_open(port)

    def up(self, settings: Settings) -> bool:
        """Start what is not running; return True when this call started anything."""
        started = False
        if not self._running(self.redis, self.redis.port):
            self.redis.start()
            started = True
        if not self._running(self.kafka, self.kafka.port):
            self.kafka.start()
            started = True
        stack_topics(settings, self.kafka.bootstrap)
        return started

    def down(self) -> None:
        self.kafka.stop()
        self.redis.stop()

    def status(self) -> str:
        kafka = "up" if self._running(self.kafka, self.kafka.port) else "down"
        redis = "up" if self._running(self.redis, self.redis.port) else "down"
        return (
            f"kafka {kafka} ({self.kafka.bootstrap})  redis {redis} ({self.redis.url})  folder {self.folder}"
        )


class ComposeStack:
    """The same Kafka and Redis from deploy/compose.yaml, where a Docker engine answers."""

    kafka_bootstrap = "127.0.0.1:9092"
    redis_url = "redis://127.0.0.1:6379/0"

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()

    def _compose(self, *args: str) -> None:
        argv = ["docker", "compose", "-f", str(COMPOSE_FILE), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise StackError(f"docker compose {' '.join(args)} failed: {proc.stderr.strip()[-300:]}")

    def prepare(self) -> str:
        self._compose("pull", "kafka", "redis")
        return f"ready: images of {COMPOSE_FILE}"

    def up(self, settings: Settings) -> bool:
        self._compose("up", "-d", "--wait", "kafka", "redis")
        stack_topics(settings, self.kafka_bootstrap)
        return True

    def down(self) -> None:
        self._compose("down")

    def status(self) -> str:
        return f"compose stack of {COMPOSE_FILE}: kafka {self.kafka_bootstrap}, redis {self.redis_url}"


def choose_stack(engine: str, folder: Path, kafka_port: int, redis_port: int) -> DevStack | ComposeStack:
    """`docker` or `local`; `auto` takes Docker when an engine answers, else the local processes."""
    if engine == "docker" or (engine == "auto" and docker_engine_available()):
        return ComposeStack(folder)
    return DevStack(folder, kafka_port=kafka_port, redis_port=redis_port)


def _wait_http(url: str, timeout: float, want: bytes, given_up: Callable[[], bool]) -> bool:
    """Until `url` answers 200 with `want` in its body (True), `timeout` passes or `given_up()`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not given_up():
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our own loopback URL
                if resp.status == 200 and want in resp.read():
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def run_dev(stack: DevStack | ComposeStack, settings: Settings, events_per_s: float) -> int:
    """Stack, worker, API and demo producer until Ctrl-C; then everything stops cleanly."""
    started_stack = stack.up(settings)
    logs = stack.folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RANKSTREAM_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "RANKSTREAM_REDIS_URL": stack.redis_url,
        "RANKSTREAM_BOARDS": str(settings.boards.resolve()),
        "RANKSTREAM_API_PORT": str(settings.api_port),
    }
    children: dict[str, subprocess.Popen[bytes]] = {}
    for name, extra in (("worker", []), ("api", []), ("demo", ["--rate", str(events_per_s)])):
        with (logs / f"{name}.log").open("ab") as out:
            argv = [sys.executable, "-m", "rankstream.cli", name, *extra]
            children[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    stopping = False

    def _stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    url = f"http://127.0.0.1:{settings.api_port}/v1/boards/{DEMO_HOT_BOARD}/top?limit=10"

    def exited() -> str | None:
        return next((name for name, child in children.items() if child.poll() is not None), None)

    def check_children() -> None:
        name = exited()
        if name is not None:
            raise StackError(f"{name} exited with {children[name].returncode}; see {logs / name}.log")

    try:  # Ctrl-C while it starts stops it at once, as it does later
        live = _wait_http(url, timeout=60, want=b'"rank"', given_up=lambda: stopping or exited() is not None)
        if not stopping:
            check_children()
            if not live:
                raise StackError(f"the API did not serve a live top-10 within 60s; see {logs}")
            base = f"http://127.0.0.1:{settings.api_port}"
            print(
                f"\nrankstream is running. Open the live board:\n  {base}/boards/{DEMO_HOT_BOARD}\n"
                f"Its top-10 as JSON:\n  {url}\n"
                f"In the terminal: .venv/bin/rankstream top {DEMO_HOT_BOARD} --watch\n"
                f"Logs: {logs}   Ctrl-C stops everything.\n"
            )
            sys.stdout.flush()
        while not stopping:
            check_children()
            time.sleep(0.5)
    finally:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            try:
                child.wait(timeout=settings.shutdown_deadline_s + 5)
            except subprocess.TimeoutExpired:
                child.kill()
        if started_stack:
            stack.down()
    print("stopped")
    return 0
