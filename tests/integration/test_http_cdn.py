"""Viewers behind a real HTTP cache: nginx (Debian's, installed by `rankstream stack prepare` or
here when missing) in front of an API node, caching as a CDN does by the answers' own
Cache-Control and revalidating with their ETags. However many viewers poll a board, its answer
reaches the API at most about once per max-age."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from common.boards import load_boards
from common.errors import StackError
from rankstream.stack import ensure_nginx, free_port, port_open
from rankstream.topics import ensure_topics
from tests.helpers import backfill, scrape, wait_for
from tests.integration.test_http_caching import config, fill

pytestmark = pytest.mark.integration
MAX_AGE_S = 1
VIEWERS, POLL_S, RUN_S = 6, 0.05, 3.0


def nginx_conf(folder: Path, port: int, upstream: int) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers may then write the cache here
    temps = "".join(
        f"  {kind}_temp_path {folder / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"{user}daemon off;\npid {folder / 'nginx.pid'};\nerror_log {folder / 'error.log'};\n"
        "events { worker_connections 256; }\n"
        f"http {{\n  access_log off;\n{temps}"
        f"  proxy_cache_path {folder / 'cache'} keys_zone=answers:1m;\n"
        f"  server {{\n    listen 127.0.0.1:{port};\n"
        f"    location / {{\n      proxy_pass http://127.0.0.1:{upstream};\n"
        "      proxy_cache answers;\n      proxy_cache_revalidate on;\n      proxy_cache_lock on;\n"
        "      proxy_cache_use_stale updating;\n      proxy_cache_background_update on;\n"
        "      add_header X-Cache $upstream_cache_status;\n    }\n  }\n}\n"
    )


@contextmanager
def nginx_in_front(folder: Path, upstream: int) -> Iterator[str]:
    try:
        binary = ensure_nginx()
    except StackError as exc:
        pytest.fail(f"nginx is needed for this test and could not be installed: {exc}")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(nginx_conf(folder, port, upstream))
    said = folder / "stderr.log"
    with said.open("wb") as stderr:
        proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(folder)], stderr=stderr)
    try:

        def up() -> bool:  # its port open (a request would reach the API, whose loop waits here)
            assert proc.poll() is None, f"nginx exited: {said.read_text()[-500:]}"
            return port_open(port)

        wait_for(up, 20, "nginx listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def requests_seen(metrics_text: str, route: str) -> int:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "rankstream_api_requests":
            return int(
                sum(
                    s.value
                    for s in family.samples
                    if s.labels.get("route") == route and s.name.endswith("_total")
                )
            )
    return 0


@pytest.mark.parametrize("board", ["gift:h", "gift:w"])  # hot (memory), warm (Redis)
def test_viewers_behind_a_cache_reach_the_api_at_most_once_per_max_age(
    make_settings, tmp_path, rclient, board
):
    settings = make_settings(boards=config(tmp_path, hot=True), http_max_age_s=MAX_AGE_S)
    ensure_topics(settings)
    fill(settings, rclient, board, 0, 200)
    backfill(settings, rclient)
    route = "/v1/boards/{board}/top"

    async def scenario() -> tuple[int, float, set[bytes], int]:
        async with TestClient(TestServer(create_app(settings, load_boards(settings.boards)))) as http:
            while (await http.get("/readyz")).status != 200:  # noqa: ASYNC110 - polling a probe, as Kubernetes does
                await asyncio.sleep(0.05)
            with nginx_in_front(tmp_path / "nginx", http.server.port or 0) as base:
                url = f"{base}/v1/boards/{board}/top?limit=10"
                before = requests_seen(scrape(http), route)
                bodies: set[bytes] = set()

                def viewer() -> int:
                    served, ends = 0, time.monotonic() + RUN_S
                    while time.monotonic() < ends:
                        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local URL
                            assert resp.status == 200
                            bodies.add(resp.read())
                        served += 1
                        time.sleep(POLL_S)  # a viewer's poll interval: load, not a wait for anything
                    return served

                started = time.monotonic()
                served = sum(await asyncio.gather(*(asyncio.to_thread(viewer) for _ in range(VIEWERS))))
                elapsed = time.monotonic() - started
                seen = requests_seen(scrape(http), route) - before
                return served, elapsed, bodies, seen

    served, elapsed, bodies, seen = asyncio.run(scenario())
    assert served >= VIEWERS * 10  # the viewers did poll
    assert len(bodies) == 1  # the board did not change: one answer, whoever served it
    # at most one request per max-age reaches the API, plus one revalidation at the edges
    assert 1 <= seen <= math.ceil(elapsed / MAX_AGE_S) + 1, (seen, served, elapsed)
