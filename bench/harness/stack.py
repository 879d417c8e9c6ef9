"""A private Kafka and Redis for one benchmark run, on free ports, in a folder of its own."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import say
from bench.harness.kafka import QUIET_KAFKA
from common.settings import Settings, load_settings
from rankstream.devstack import SINGLE_BROKER
from rankstream.stack import LocalKafka, LocalRedis, free_port


@dataclass
class Stack:
    """The servers, a client of Redis, and the board config the run's settings name."""

    kafka: LocalKafka
    redis_server: LocalRedis
    client: redis.Redis
    folder: Path
    boards_file: Path

    def settings(self, tag: str, **overrides: Any) -> Settings:
        """Settings with topics of their own, so runs never read each other's events;
        `overrides` (key_prefix, worker_group, boards, ...) as load_settings takes them."""
        values: dict[str, Any] = {
            "kafka_bootstrap": self.kafka.bootstrap,
            "redis_url": self.redis_server.url,
            "boards": self.boards_file,
            "topic_updates": f"bench.{tag}.update_rank",
            "topic_dlq": f"bench.{tag}.update_rank.dlq",
            "topic_cache": f"bench.{tag}.update_cache",
            "kafka": QUIET_KAFKA,
            **SINGLE_BROKER,  # the private Kafka has one broker
        }
        return load_settings({}, **{**values, **overrides})

    def pids(self) -> dict[str, int]:
        assert self.kafka.proc is not None
        assert self.redis_server.proc is not None
        return {"redis": self.redis_server.proc.pid, "kafka": self.kafka.proc.pid}


def write_boards(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _stop_quietly(server: LocalKafka | LocalRedis) -> None:
    try:
        server.stop()
    except Exception as exc:  # noqa: BLE001 - stop the other server too; report, do not mask the run's error
        say(f"stopping {server.name} failed: {exc}")


@contextlib.contextmanager
def private_stack(folder: Path, boards_yaml: str, *, persist: bool = False) -> Iterator[Stack]:
    """A fresh Kafka and Redis on free ports in `folder` (emptied first), `boards_yaml` as
    folder/boards.yaml; both servers stopped however the run ends. `persist`: Redis with AOF,
    as `rankstream dev` runs it, where what users pay for a write is measured."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    boards_file = write_boards(folder / "boards.yaml", boards_yaml)
    redis_server = LocalRedis("redis", folder / "redis", port=free_port(), persist=persist)
    kafka = LocalKafka("kafka", folder / "kafka", port=free_port(), controller_port=free_port())
    try:
        redis_server.start()
        say(f"redis on port {redis_server.port}; starting kafka on {kafka.bootstrap}")
        kafka.start()
        client = redis.Redis(port=redis_server.port, socket_timeout=60)
        try:
            yield Stack(kafka, redis_server, client, folder, boards_file)
        finally:
            client.close()
    finally:
        _stop_quietly(kafka)
        _stop_quietly(redis_server)
