"""Plain HTTP requests against the processes under test: an answer, a JSON answer, readiness."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import orjson

from bench.common import BenchError
from bench.harness.processes import Child

HOST = "127.0.0.1"  # everything the bench starts listens on loopback
READY_TIMEOUT_S = 120.0


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing listens yet."""
    return http_request(url, timeout=timeout)


def http_request(
    url: str, method: str = "GET", payload: Any = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    """(status, body) of `method` on `url`, `payload` (not None) sent as JSON; status 0 when
    nothing listens yet."""
    data = None if payload is None else orjson.dumps(payload)
    headers = {} if payload is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:  # 503 and friends still carry a body
        return int(exc.code), exc.read()
    except OSError:
        return 0, b""


def get_json(url: str, method: str = "GET", payload: Any = None) -> Any:
    """The JSON answer of a 200; BenchError for any other status."""
    status, body = http_request(url, method, payload)
    if status != 200:
        raise BenchError(f"{method} {url}: {status} {body[:200]!r}")
    return orjson.loads(body)


def wait_ready(
    child: Child, url: str, timeout: float = READY_TIMEOUT_S, poll_s: float = 0.02
) -> tuple[float, Any]:
    """Poll `url` every `poll_s` until 200: (seconds since now, the JSON body or None)."""
    started = time.monotonic()
    deadline = started + timeout
    next_poll = started
    while True:
        status, body = http_get(url, timeout=5)
        if status == 200:
            elapsed = time.monotonic() - started
            try:
                return elapsed, orjson.loads(body)
            except orjson.JSONDecodeError:
                return elapsed, None
        child.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{child.name} not ready at {url} within {timeout:.0f}s: {child.tail()}")
        next_poll += poll_s
        time.sleep(max(0.0, next_poll - time.monotonic()))
