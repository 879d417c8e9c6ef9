"""The alert rules and the dashboard name only metrics the processes export: a worker process
and an API node run a short while (events applied, a dead letter, reads), and every name the
expressions use is on their /metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from api.app import ADMIN_APP, create_app
from common.boards import load_boards
from common.settings import Settings
from rankstream.stack import free_port
from tests.helpers import http_status, stop_workers, wait_for, worker_env
from tests.monitoring import exported, expressions, metric_names

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return str(resp.read().decode())


async def _api_metrics(settings: Settings) -> str:
    app = create_app(settings, load_boards(settings.boards))
    async with TestClient(TestServer(app)) as http, TestClient(TestServer(app[ADMIN_APP])) as admin:
        for path in ("/v1/boards/coins:global/top", "/v1/boards/coins:global/members/u1", "/nothing"):
            await http.get(path)
        return str(await (await admin.get("/metrics")).text())


def test_every_name_the_alerts_and_the_dashboard_use_is_exported(topics: Settings, tmp_path: Path) -> None:
    settings = topics
    port = free_port()
    with (tmp_path / "worker.out").open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rankstream.cli", "worker"], env=worker_env(settings, http_port=port),
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
        event = {"id": "e1", "board": "coins:global", "member": "u1", "score": 3}
        for value in (orjson.dumps(event), b"{not json"):  # an event applied, a dead letter
            producer.produce(settings.topic_updates, value, key=b"coins:global")
        assert producer.flush(30) == 0
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the worker ready")
        wait_for(
            lambda: "rankstream_worker_dead_lettered_total{" in _scrape(f"{base}/metrics"),
            60,
            "the dead letter",
        )
        names = exported(_scrape(f"{base}/metrics")) | exported(asyncio.run(_api_metrics(settings)))
    finally:
        stop_workers(worker)
    missing = {
        w: sorted(metric_names(e) - names) for w, e in expressions().items() if metric_names(e) - names
    }
    assert missing == {}
