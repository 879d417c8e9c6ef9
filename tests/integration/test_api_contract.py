"""The HTTP contract: the spec holds for every answer (schemathesis against a live server on
real Redis), bad input is a 4xx JSON error, Redis down is a 503, metrics count routes, and
SIGTERM drains requests in flight. The warm cache: test_warm_cache.py."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from chaos.fuzz import fuzz, judge, locked_env
from common.boards import load_boards
from common.events import Op, UpdateEvent
from common.settings import Settings, load_settings
from rankstream.stack import free_port
from rankstream.topics import ensure_topics
from tests.conftest import Servers, own_settings, own_topics, remove_keys
from tests.helpers import api_env, backfill, http_status, scrape, wait_for
from worker.apply import Applier

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
MEMBERS = [f"u{i}" for i in range(30)]


def fill(settings: Settings, client: redis.Redis) -> None:
    """Data written straight to Redis, then backfilled: gift:room42 is hot in deploy/boards.yaml,
    so this is the path of a board made hot after it already holds data."""
    boards = load_boards(settings.boards)
    applier = Applier(client, boards, settings.key_prefix, 600_000)
    now = int(time.time() * 1000)
    events = []
    for i, member in enumerate(MEMBERS):
        for board in ("gift:room42", "gift:room7", "coins:global", "level:season3", "live:x", "arena:eu"):
            meta = orjson.dumps({"name": member.upper()}) if i % 3 == 0 else None
            event = UpdateEvent(
                f"{board}-{i}", board, board.split(":")[0], member, Op.INCR, float(i % 7), None, meta
            )
            events.append((event, now - i))
    applier.apply(events)
    ensure_topics(settings)
    backfill(settings, client)


class NodeUrl(str):
    """A node's public base URL; `.admin`: its admin port's."""

    admin: str


@contextmanager
def api_process(
    settings: Settings, client: redis.Redis, extra_env: dict[str, str] | None = None
) -> Iterator[NodeUrl]:
    """A real `rankstream api` process on free ports, over real Redis holding test data."""
    fill(settings, client)
    port, admin_port = free_port(), free_port()
    env = {**api_env(settings, port, admin_port), **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankstream.cli", "api"], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    base = NodeUrl(f"http://127.0.0.1:{port}")
    base.admin = f"http://127.0.0.1:{admin_port}"
    wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
    yield base
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert "Traceback" not in stderr


@pytest.fixture
def api_server(settings: Settings, rclient) -> Iterator[NodeUrl]:
    """A server of the test's own (its metrics count only its requests)."""
    with api_process(settings, rclient) as base:
        yield base


@pytest.fixture(scope="module")
def shared_api(servers: Servers) -> Iterator[NodeUrl]:
    """One server for the module's tests that only read, and send bad input: ~40 tests, each of
    which would otherwise start one (~1 s). Its topics and keys are its own, removed after."""
    settings = load_settings({}, **own_settings(servers))
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    try:
        with own_topics(settings), api_process(settings, client) as base:
            yield base
    finally:
        remove_keys(client, settings.key_prefix)
        client.close()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
            return int(resp.status), orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), orjson.loads(exc.read())


FUZZ_VALUES = {  # generation steered onto real boards and members, so it reaches the ranking code
    "board": ["gift:room42", "coins:global", "level:season3", "live:x", "arena:eu"],
    "member": [*MEMBERS[:5], "ghost"],
    "window": ["total", "day", "hour", "30min", "season"],
    "division": ["bronze.1", "bronze.2", "gold.1", "gold"],  # arena:eu's league
    "tier": ["bronze", "gold", "tin"],
}


@pytest.mark.slow
def test_fuzzing_from_the_spec_finds_no_5xx_and_every_answer_conforms(settings, rclient, tmp_path):
    """200 schemathesis cases or more (chaos/fuzz.py; `make chaos` runs thousands): 100 with reads
    open, then 100 with read tokens and a rate limit on, half carrying a token and half none, each
    half on the spec as published and half steered onto real boards. No 5xx; every answer, 401
    and 429 included, as the spec says."""
    with api_process(settings, rclient) as base:
        opened = fuzz(base, base.admin, label="open", cases=100, seed=5, folder=tmp_path, values=FUZZ_VALUES)
    token = "fuzz-" + "t" * 20
    with api_process(settings, rclient, locked_env(token)) as base:
        with_token = fuzz(base, base.admin, label="locked, a token", cases=50, seed=7, folder=tmp_path,
                          token=token, values=FUZZ_VALUES)  # fmt: skip
        without = fuzz(base, base.admin, label="locked, no token", cases=50, seed=9, folder=tmp_path,
                       values=FUZZ_VALUES)  # fmt: skip
    reports = [r.line() for r in (*opened, *with_token, *without)]
    assert judge(opened, with_token, without, cases=100) == [], reports
    assert sum(r.cases for r in (*opened, *with_token, *without)) >= 200, reports


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v1/boards/gift:room42/top?limit=501", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?limit=0", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?offset=-1", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?limit=ten", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?window=day&period=2026-02-30", 400, "bad_period"),
        ("/v1/boards/gift:room42/top?window=week&period=2026-W99", 400, "bad_period"),
        ("/v1/boards/gift:room42/top?window=fortnight", 400, "bad_window"),
        ("/v1/boards/gift:room42/top?trend=1", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?window=day&trend=yes", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?window=day&period=2020-01-01", 404, "period_expired"),
        ("/v1/boards/gift:room42/members/u1?window=month&period=2024-01&trend=1", 404, "period_expired"),
        ("/v1/boards/live:x/top?window=30min&period=2026-11-22T13:15", 400, "bad_period"),
        ("/v1/boards/live:x/top?window=season&period=2026-01-06%2B1", 400, "bad_period"),
        (
            "/v1/boards/live:x/top?window=season&period=2026-01-05+1",
            404,
            "period_expired",
        ),  # "+" unescaped reads as a space: parsed all the same
        ("/v1/boards/live:x/top?window=season&at=946684800000", 404, "no_period"),
        ("/v1/boards/gift:room42/top?order=sideways", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?ties=dense", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/top?at=-5&window=day", 400, "bad_parameter"),
        ("/v1/boards/Gift:room42/top", 400, "bad_board"),
        ("/v1/boards/gift:room%7B42%7D/top", 400, "bad_board"),
        ("/v1/boards/gift:room42/members/a%0Ab", 400, "bad_member"),
        (f"/v1/boards/gift:room42/members/{'x' * 129}", 400, "bad_member"),
        ("/v1/boards/gift:room42/members/u1/around?n=101", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/count?min=low", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/count?max=1e999", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/rank", 400, "bad_parameter"),
        ("/v1/boards/gift:room42/rank?score=nan", 400, "bad_parameter"),
        ("/v1/boards/nosuch:room/top", 404, "unknown_board_type"),
        ("/v1/boards/gift:room42/members/ghost", 404, "member_not_found"),
        ("/v1/boards/gift:room42/members/ghost/around", 404, "member_not_found"),
        ("/v1/nothing/here", 404, "not_found"),
    ],
)
def test_bad_requests_get_json_errors(shared_api, path, status, code):
    got_status, body = _get(f"{shared_api}{path}")
    assert (got_status, body["error"]["code"]) == (status, code)
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"not json", "bad_body"), (b'{"members": []}', "bad_body"), (b'{"members": [1]}', "bad_body"),
     (orjson.dumps({"members": [f"m{i}" for i in range(501)]}), "bad_body"),
     (b'{"members": ["ok", ""]}', "bad_member"), (b"[]", "bad_body")],
)  # fmt: skip
def test_bad_lookup_bodies_get_json_errors(shared_api, body, code):
    url = f"{shared_api}/v1/boards/gift:room42/members/lookup"
    request = urllib.request.Request(url, data=body, method="POST")  # noqa: S310 - loopback URL
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback URL
    assert info.value.code == 400
    assert orjson.loads(info.value.read())["error"]["code"] == code


def in_process(settings: Settings, requests: Any) -> Any:
    async def go() -> Any:
        app = create_app(settings, load_boards(settings.boards))
        async with TestClient(TestServer(app)) as http:
            return await requests(http)

    return asyncio.run(go())


def test_a_method_no_route_takes_is_a_json_405(settings):
    async def requests(http: TestClient[Any, Any]) -> list[tuple[int, Any, str | None]]:
        out = []
        for method, path in (
            ("POST", "/v1/boards/gift:room7/top"),
            ("GET", "/v1/boards/gift:room7/members/lookup"),
        ):
            resp = await http.request(method, path)
            out.append((resp.status, (await resp.json())["error"]["code"], resp.headers.get("Allow")))
        return out

    # members/lookup also matches GET's members/{member}: that route answers (404: no such member)
    assert in_process(settings, requests) == [
        (405, "method_not_allowed", "GET,HEAD"),
        (404, "member_not_found", None),
    ]


def test_redis_unreachable_is_a_503_not_a_trace(make_settings):
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def requests(http: TestClient[Any, Any]) -> list[tuple[int, Any]]:
        out = []
        for path in ("/v1/boards/gift:room7/top", "/v1/boards/gift:room7/members/u1", "/livez"):
            resp = await http.get(path)
            out.append((resp.status, await resp.json()))
        metrics = scrape(http)
        out.append((0, "rankstream_api_redis_errors_total 2.0" in metrics))
        return out

    (s1, b1), (s2, b2), (s3, _), (_, counted) = in_process(settings, requests)
    assert (s1, b1["error"]["code"]) == (503, "redis_unavailable")
    assert (s2, b2["error"]["code"]) == (503, "redis_unavailable")
    assert s3 == 200  # alive: only Redis-backed answers fail
    assert counted


def test_the_admin_routes_answer_on_the_admin_port_only(api_server):
    for path in ("/metrics", "/openapi.json"):
        assert _get(f"{api_server}{path}")[0] == 404, path
        assert http_status(f"{api_server.admin}{path}") == 200, path
    for path in ("/livez", "/readyz"):  # the probes answer on both
        assert _get(f"{api_server}{path}")[0] == 200 and _get(f"{api_server.admin}{path}")[0] == 200, path
    status, body = _get(f"{api_server.admin}/v1/boards/gift:room42/top")  # no board route there
    assert (status, body["error"]["code"]) == (404, "not_found")


def test_metrics_count_requests_by_route(api_server):
    for _ in range(3):
        _get(f"{api_server}/v1/boards/gift:room42/members/u1")
    _get(f"{api_server}/v1/boards/gift:room42/members/ghost")
    with urllib.request.urlopen(f"{api_server.admin}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    route = "/v1/boards/{board}/members/{member}"  # the canonical name, without the patterns
    assert f'rankstream_api_requests_total{{route="{route}",status="200"}} 3.0' in text
    assert f'rankstream_api_requests_total{{route="{route}",status="404"}} 1.0' in text
    assert f'rankstream_api_request_seconds_count{{route="{route}"}} 4.0' in text


def test_sigterm_drains_requests_in_flight(settings, rclient):
    fill(settings, rclient)
    port = free_port()
    env = {**api_env(settings, port), "RANKSTREAM_TOP_CACHE_TTL_S": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "rankstream.cli", "api"], env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
        result: dict[str, Any] = {}

        def slow_request() -> None:
            result["answer"] = _get(f"{base}/v1/boards/gift:room7/top")  # not hot: read from Redis

        rclient.execute_command("CLIENT", "PAUSE", "1500", "ALL")  # Redis stalls: the request hangs
        worker = threading.Thread(target=slow_request)
        worker.start()
        time.sleep(0.4)
        proc.send_signal(signal.SIGTERM)  # mid-request
        worker.join(10)
        assert proc.wait(30) == 0
        status, body = result["answer"]
        assert status == 200 and len(body["items"]) == 10
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_prints_readable_tables_from_a_running_api(shared_api):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    top = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "top", "gift:room42", "--limit", "3", "--api", shared_api],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert top.returncode == 0, top.stderr
    lines = top.stdout.splitlines()
    assert lines[0].startswith("gift:room42  window total  period all  members 30")
    # u27 (i=27, 27 % 7 = 6, the earliest of the sixes) leads; ties: earlier first
    assert lines[3].split()[:3] == ["1", "u27", "6"] and lines[3].split()[3] == "U27"
    assert len(lines) == 7 and lines[-1].startswith("source memory  seq ")  # gift:room42 is hot
    member = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "member", "gift:room42", "u1", "--api", shared_api],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert member.returncode == 0 and " u1 " in member.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "member", "gift:room42", "ghost", "--api", shared_api],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.strip() == "rankstream: member_not_found: 'ghost' is not on this board"


def _raw(base: str, request: bytes) -> bytes:
    """`request` as sent, on its own connection; the answer's first bytes."""
    where = urllib.parse.urlsplit(base)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def test_a_body_too_big_is_a_json_413(shared_api):
    body = orjson.dumps({"members": ["x" * 128] * 9000})  # over 1 MiB
    url = f"{shared_api}/v1/boards/gift:room42/members/lookup"
    request = urllib.request.Request(url, data=body, method="POST")  # noqa: S310 - loopback
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
    assert refused.value.code == 413
    assert orjson.loads(refused.value.read())["error"]["code"] == "request_entity_too_large"


@pytest.mark.parametrize(
    "headers",
    [b"X-Big: " + b"a" * 9000 + b"\r\n", b"".join(b"X-H%d: v\r\n" % i for i in range(70))],
    ids=["a header line over 8190 bytes", "more than 64 headers"],
)
def test_headers_past_the_limits_are_refused_with_400(shared_api, headers):
    """Refused by aiohttp's parser, before any route: its own text answer, not JSON (71 headers
    are within aiohttp's default of 128: the node's limit of 64 is in effect)."""
    request = b"GET /v1/boards/gift:room42/top HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    assert _raw(shared_api, request).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert _get(f"{shared_api}/livez")[0] == 200  # and the node goes on
