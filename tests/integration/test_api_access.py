"""Who may read the public port, and how much (api/access.py), on a real app over real Redis:
bearer tokens (401), what only an admin token may ask for (403), CORS for the allowed origins,
the per-client rate limit (429 with Retry-After) with the client behind a trusted proxy counted
by X-Forwarded-For, and none of it on the probes nor the admin port."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import ADMIN_APP, create_app
from common.boards import load_boards
from common.settings import Settings

pytestmark = pytest.mark.integration

TOP = "/v1/boards/coins:global/top"  # not hot: nothing to replay first
LOOKUP = "/v1/boards/coins:global/members/lookup"
READ, ADMIN = "read-token-1", "admin-token-1"


def serve(settings: Settings, go: Callable[[TestClient[Any, Any]], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with TestClient(TestServer(create_app(settings, load_boards(settings.boards)))) as http:
            return await go(http)

    return asyncio.run(run())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def status_and_code(
    http: TestClient[Any, Any], method: str, path: str, **kwargs: Any
) -> tuple[int, str]:
    resp = await http.request(method, path, **kwargs)
    body = await resp.json()
    return resp.status, body["error"]["code"] if "error" in body else "ok"


def test_tokens_guard_the_reads_and_the_admin_token_guards_nocache_and_big_lookups(make_settings):
    settings = make_settings(
        api_read_tokens=f"{READ}, read-token-2", api_admin_tokens=ADMIN, api_public_lookup_max=3
    )
    few, many = {"members": ["a", "b", "c"]}, {"members": ["a", "b", "c", "d"]}

    async def go(http: TestClient[Any, Any]) -> dict[str, Any]:
        got = {
            "none": await status_and_code(http, "GET", TOP),
            "wrong": await status_and_code(http, "GET", TOP, headers=bearer("nope")),
            "other scheme": await status_and_code(http, "GET", TOP, headers={"Authorization": "Basic eDp5"}),
            "read": await status_and_code(http, "GET", TOP, headers=bearer(READ)),
            "second read": await status_and_code(http, "GET", TOP, headers=bearer("read-token-2")),
            "admin reads": await status_and_code(http, "GET", TOP, headers=bearer(ADMIN)),
            "nocache read": await status_and_code(http, "GET", TOP + "?nocache=1", headers=bearer(READ)),
            "nocache admin": await status_and_code(http, "GET", TOP + "?nocache=1", headers=bearer(ADMIN)),
            "few read": await status_and_code(http, "POST", LOOKUP, json=few, headers=bearer(READ)),
            "many read": await status_and_code(http, "POST", LOOKUP, json=many, headers=bearer(READ)),
            "many admin": await status_and_code(http, "POST", LOOKUP, json=many, headers=bearer(ADMIN)),
            "probe": (await http.get("/livez")).status,  # Kubernetes' probes carry no token
        }
        challenge = await http.get(TOP)
        got["challenge"] = challenge.headers.get("WWW-Authenticate")
        return got

    assert serve(settings, go) == {
        "none": (401, "unauthorized"),
        "wrong": (401, "unauthorized"),
        "other scheme": (401, "unauthorized"),
        "read": (200, "ok"),
        "second read": (200, "ok"),
        "admin reads": (200, "ok"),
        "nocache read": (403, "forbidden"),
        "nocache admin": (200, "ok"),
        "few read": (200, "ok"),
        "many read": (403, "forbidden"),
        "many admin": (200, "ok"),
        "probe": 200,
        "challenge": 'Bearer realm="rankstream"',
    }


def test_without_tokens_every_read_is_open_as_before(make_settings):
    settings = make_settings()
    many = {"members": [f"m{i}" for i in range(200)]}

    async def go(http: TestClient[Any, Any]) -> list[tuple[int, str]]:
        return [
            await status_and_code(http, "GET", TOP + "?nocache=1"),
            await status_and_code(http, "POST", LOOKUP, json=many),
        ]

    assert serve(settings, go) == [(200, "ok"), (200, "ok")]


def test_only_allowed_origins_get_cors_headers_and_preflight_answers(make_settings):
    settings = make_settings(api_cors_origins="https://game.example.com")
    allowed, other = {"Origin": "https://game.example.com"}, {"Origin": "https://evil.example.com"}
    asks = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}

    async def go(http: TestClient[Any, Any]) -> dict[str, Any]:
        ok = await http.get(TOP, headers=allowed)
        refused = await http.get(TOP, headers=other)
        preflight = await http.options(LOOKUP, headers={**allowed, **asks})
        stranger = await http.options(LOOKUP, headers={**other, **asks})
        return {
            "allowed": (ok.status, ok.headers.get("Access-Control-Allow-Origin"), ok.headers.get("Vary")),
            "other": (refused.status, refused.headers.get("Access-Control-Allow-Origin")),
            "preflight": (
                preflight.status,
                preflight.headers.get("Access-Control-Allow-Origin"),
                preflight.headers.get("Access-Control-Allow-Methods"),
                "Authorization" in preflight.headers.get("Access-Control-Allow-Headers", ""),
            ),
            "stranger preflight": stranger.status,
        }

    assert serve(settings, go) == {
        "allowed": (200, "https://game.example.com", "Origin"),
        "other": (200, None),  # answered: the browser, not the server, keeps it from the page
        # (the member route matches the path too: a member called "lookup")
        "preflight": (204, "https://game.example.com", "GET, HEAD, POST", True),
        "stranger preflight": 405,
    }


def test_each_client_has_its_own_bucket_behind_a_trusted_proxy(make_settings):
    # a rate so low that no token comes back during the test: the burst alone decides
    settings = make_settings(
        api_rate_limit_per_s=0.01, api_rate_limit_burst=3, api_trusted_proxies="127.0.0.0/8, 10.0.0.0/8"
    )

    def via_cdn(client: str) -> dict[str, str]:  # the CDN's edge (trusted) appends its peer
        return {"X-Forwarded-For": f"{client}, 10.1.2.3"}

    async def go(http: TestClient[Any, Any]) -> dict[str, Any]:
        first = [(await http.get(TOP, headers=via_cdn("203.0.113.7"))).status for _ in range(4)]
        limited = await http.get(TOP, headers=via_cdn("203.0.113.7"))
        other_client = (await http.get(TOP, headers=via_cdn("198.51.100.9"))).status
        # a client that forges the header is counted by the last untrusted hop: its own address
        forged = [
            (await http.get(TOP, headers=via_cdn(f"192.0.2.{i}, 203.0.113.7"))).status for i in range(2)
        ]
        return {
            "first": first,
            "limited": (
                limited.status,
                (await limited.json())["error"]["code"],
                limited.headers.get("Retry-After"),
            ),
            "other client": other_client,
            "forged": forged,
            "probe": (await http.get("/livez")).status,
        }

    got = serve(settings, go)
    assert got["first"] == [200, 200, 200, 429]
    status, code, retry = got["limited"]
    assert (status, code) == (429, "rate_limited") and retry is not None and int(retry) >= 1
    assert got["other client"] == 200
    assert got["forged"] == [429, 429]  # 203.0.113.7's bucket, whatever came before it
    assert got["probe"] == 200


def test_the_admin_port_takes_no_token(make_settings):
    settings = make_settings(api_read_tokens=READ, api_rate_limit_per_s=0.01, api_rate_limit_burst=1)

    async def go() -> list[int]:
        app = create_app(settings, load_boards(settings.boards))
        async with TestClient(TestServer(app[ADMIN_APP])) as admin:
            return [(await admin.get(path)).status for path in ("/metrics", "/metrics", "/openapi.json")]

    assert asyncio.run(go()) == [200, 200, 200]
