"""Latency at a constant request rate, without coordinated omission: request i is due at
start + i/rate and its latency runs from that due time, so a stall delays the requests behind
it and they count it. wrk has no such mode, so this client does it, in a process of its own:
`python -m bench.harness.rate URL --rate R [--requests FILE]` prints its result as JSON.

Without --requests every request GETs URL; with it, request i is line i mod len of FILE (one
request a line as bench/harness/http1.py writes them: {"method", "path", "body"?}, a body sent
JSON-encoded with its Content-Length) against URL's host and port. The client runs on uvloop
when it is installed (less client CPU on a box it shares with the server).

constant_rate() uses the Go client of the same contract (bench/go/rate, bench/harness/gorate.py)
when Go is installed: this one's own lateness reached tens of ms at p99 here, and counted."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import sys
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.common import BenchError, Result
from bench.harness.cpu import run_tool
from bench.harness.gorate import go_rate_client
from bench.harness.http1 import HttpConn, Request, encode, read_requests
from bench.harness.probes import HOST
from bench.harness.stats import percentile

RATE_S = 8.0
RATE_WARMUP_S = 1.0
RATE_CONNECTIONS = 64
ANSWER_TIMEOUT_S = 30.0  # after the last request's due time: those unanswered by then are errors


async def _drive(
    url: str,
    requests: Sequence[Request],
    rate: float,
    *,
    duration_s: float,
    warmup_s: float,
    connections: int,
) -> Result:
    """Request i is due at start + i/rate; it takes an idle connection (or opens one, up to
    `connections`, or waits for one) and its latency runs from the due time to the last byte.
    Times are time.perf_counter(): uvloop's loop.time() is cached per loop turn, in milliseconds."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or HOST, parts.port or 80
    wire = [encode(r, f"{host}:{port}") for r in requests]
    warm = int(rate * warmup_s)
    n = warm + int(rate * duration_s)
    latency = [math.nan] * n
    late = [0.0] * n
    counts = {"bad_status": 0, "errors": 0, "opened": 0}
    idle: list[HttpConn] = []
    slots = asyncio.Semaphore(connections)

    async def one(i: int, due: float) -> None:
        late[i] = clock() - due
        async with slots:
            conn = idle.pop() if idle else None
            try:
                if conn is None:
                    _, conn = await loop.create_connection(HttpConn, host, port)
                    counts["opened"] += 1
                reply = await conn.send(wire[i % len(wire)])  # no timer each: see the wait below
            except OSError:
                counts["errors"] += 1
                return
            latency[i] = reply.arrived - due
            if reply.status != 200:
                counts["bad_status"] += 1
            if not conn.lost:
                idle.append(conn)

    tasks: list[asyncio.Task[None]] = []
    start = clock() + 0.05
    i = 0
    while i < n:
        now = clock()
        while i < n and start + i / rate <= now:
            tasks.append(asyncio.create_task(one(i, start + i / rate)))
            i += 1
        if i < n:
            # at least a millisecond, the event loops' timer grain (uvloop spins on shorter ones);
            # how late that starts a request is in its latency and in start_late_*
            await asyncio.sleep(max(0.001, start + i / rate - clock()))
    answered, unanswered = await asyncio.wait(tasks, timeout=ANSWER_TIMEOUT_S)
    finished = clock()
    for task in answered:
        task.result()  # a bug raises here rather than being logged and forgotten
    for task in unanswered:
        task.cancel()
    counts["errors"] += len(unanswered)
    for conn in idle:
        conn.close()
    measured = sorted(x * 1000 for x in latency[warm:] if not math.isnan(x))
    lateness = sorted(x * 1000 for x in late[warm:])
    window = finished - (start + warm / rate)  # first measured due time to the last answer
    return {
        "rate": rate,
        "requests": n - warm,
        "distinct_requests": len(set(wire[: min(n, len(wire))])),  # sent, warm-up included
        "ok": len(measured),
        **counts,
        "achieved_rps": round(len(measured) / window, 1) if window > 0 else math.nan,
        "p50_ms": round(percentile(measured, 0.50), 3),
        "p90_ms": round(percentile(measured, 0.90), 3),
        "p99_ms": round(percentile(measured, 0.99), 3),
        "p999_ms": round(percentile(measured, 0.999), 3),
        "max_ms": round(measured[-1], 3) if measured else math.nan,
        # how late the client itself started requests (a busy client inflates every latency)
        "start_late_p50_ms": round(percentile(lateness, 0.50), 3),
        "start_late_p99_ms": round(percentile(lateness, 0.99), 3),
    }


def constant_rate(
    url: str,
    rate: float,
    pids: Mapping[str, int],
    duration_s: float = RATE_S,
    requests_file: Path | None = None,
) -> Result:
    """`rate` requests/s for `duration_s` (after RATE_WARMUP_S of the same) from a client
    process of its own; latency from each request's scheduled send time. `requests_file`: the
    requests to cycle through (see the module's doc); None: GET `url`."""
    go = go_rate_client()
    if go is not None:  # bench/harness/gorate.py: why, and how to ask for this one instead
        argv = [str(go), "-url", url, "-rate", f"{rate:.1f}"]
        argv += ["-duration", str(duration_s), "-warmup", str(RATE_WARMUP_S)]
        argv += ["-connections", str(RATE_CONNECTIONS)]
        if requests_file is not None:
            argv += ["-requests", str(requests_file)]
        requests_file = None
    else:
        argv = [sys.executable, "-m", "bench.harness.rate", url, "--rate", f"{rate:.1f}"]
        argv += ["--duration", str(duration_s), "--warmup", str(RATE_WARMUP_S)]
        argv += ["--connections", str(RATE_CONNECTIONS)]
    if requests_file is not None:
        argv += ["--requests", str(requests_file)]
    run = run_tool("rate_client", argv, pids, timeout=duration_s + 120)
    if run.returncode != 0:
        raise BenchError(f"rate client exited with {run.returncode}: {run.stderr[-300:]}")
    result: Result = orjson.loads(run.stdout)
    if result["bad_status"] or result["errors"]:
        raise BenchError(f"rate client: {result['bad_status']} bad answers, {result['errors']} errors")
    result["cpu_pct"] = run.cpu_pct
    return result


def _runner() -> tuple[str, Callable[[Coroutine[Any, Any, Result]], Result]]:
    if importlib.util.find_spec("uvloop") is None:
        return "asyncio", asyncio.run
    import uvloop  # noqa: PLC0415 - optional

    return "uvloop", uvloop.run


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.rate", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, default=RATE_S)
    parser.add_argument("--warmup", type=float, default=RATE_WARMUP_S)
    parser.add_argument("--connections", type=int, default=RATE_CONNECTIONS)
    parser.add_argument("--requests", type=Path, help="one JSON request a line, sent in turn")
    args = parser.parse_args(argv)
    if args.requests is not None:
        requests = read_requests(args.requests)
        if not requests:
            parser.error(f"{args.requests}: no requests")
    else:
        parts = urllib.parse.urlsplit(args.url)
        requests = [Request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))]
    loop_name, run = _runner()
    coro = _drive(
        args.url,
        requests,
        args.rate,
        duration_s=args.duration,
        warmup_s=args.warmup,
        connections=args.connections,
    )
    result = {**run(coro), "loop": loop_name}
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
