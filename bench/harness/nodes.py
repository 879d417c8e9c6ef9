"""`rankstream worker` and `rankstream api` processes on a benchmark's settings, and what the
bench asks them: has the worker got its partitions, is a top answer from the path under test."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from bench.common import BenchError
from bench.harness.probes import HOST, http_get
from bench.harness.processes import Child, Children, child_env
from common.settings import Settings
from rankstream.stack import free_port
from rankstream.topics import UPDATE_PARTITIONS

WORKER_READY_S = 90.0


def node_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a rankstream process on these settings (and nothing else)."""
    return child_env(
        {
            "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "RANKSTREAM_REDIS_URL": settings.redis_url.get_secret_value(),
            "RANKSTREAM_REDIS_CLUSTER": "true" if settings.redis_cluster else "false",
            "RANKSTREAM_BOARDS": str(settings.boards),
            "RANKSTREAM_KEY_PREFIX": settings.key_prefix,
            "RANKSTREAM_TOPIC_UPDATES": settings.topic_updates,
            "RANKSTREAM_TOPIC_DLQ": settings.topic_dlq,
            "RANKSTREAM_TOPIC_CACHE": settings.topic_cache,
            "RANKSTREAM_LOG_LEVEL": "WARNING",
            **extra,
        }
    )


def start_api(
    group: Children, name: str, settings: Settings, *, admin_port: int = 0, **extra: str
) -> tuple[Child, str]:
    """An API node on a free port, warm cache on (the default), its admin port `admin_port` (0:
    a free one); `extra`: more RANKSTREAM_* settings; (the process, its base URL)."""
    port = free_port()
    env = node_env(
        settings, RANKSTREAM_API_PORT=str(port), RANKSTREAM_API_ADMIN_PORT=str(admin_port or free_port()),
        RANKSTREAM_API_HOST=HOST, **extra,
    )  # fmt: skip
    child = group.spawn(name, [sys.executable, "-m", "rankstream.cli", "api"], env)
    return child, f"http://{HOST}:{port}"


def start_worker(
    group: Children,
    name: str,
    settings: Settings,
    *,
    http_port: int,
    worker_id: str = "",
    env: Mapping[str, str] | None = None,
) -> Child:
    """A worker in settings.worker_group; its /readyz and /metrics on `http_port` (0: none);
    `env`: more RANKSTREAM_* settings for it."""
    extra = {"RANKSTREAM_WORKER_GROUP": settings.worker_group, "RANKSTREAM_WORKER_HTTP_PORT": str(http_port)}
    extra.update(env or {})
    if worker_id:
        extra["RANKSTREAM_WORKER_ID"] = worker_id
    return group.spawn(name, [sys.executable, "-m", "rankstream.cli", "worker"], node_env(settings, **extra))


def assigned_partitions(port: int, timeout: float = 1.0) -> int:
    """How many of update_rank's partitions the worker's /readyz reports assigned to it."""
    _, body = http_get(f"http://{HOST}:{port}/readyz", timeout=timeout)  # a 503 body still tells
    try:
        return int(orjson.loads(body).get("partitions", 0)) if body else 0
    except (orjson.JSONDecodeError, AttributeError):
        return 0


def partitions_assigned(port: int, timeout: float = 1.0) -> bool:
    """Whether the worker's /readyz reports all of update_rank's partitions assigned to it."""
    return assigned_partitions(port, timeout) >= UPDATE_PARTITIONS


def wait_assigned(worker: Child, port: int) -> float:
    """Until the worker's /readyz says it holds every update_rank partition; seconds."""
    started = time.monotonic()
    while time.monotonic() - started < WORKER_READY_S:
        worker.check_alive()
        if partitions_assigned(port, timeout=2):
            return time.monotonic() - started
        time.sleep(0.1)
    raise BenchError(f"the worker got no partitions within {WORKER_READY_S:.0f}s: {worker.tail()}")


def check_top(answer: Any, source: str, total: int, limit: int = 10) -> None:
    """A top answer that proves the path under test really ran."""
    if (
        answer.get("source") != source
        or answer.get("total") != total
        or len(answer.get("items", ())) != limit
    ):
        raise BenchError(
            f"unexpected top answer (want source {source}, total {total}): {orjson.dumps(answer)[:300]!r}"
        )
