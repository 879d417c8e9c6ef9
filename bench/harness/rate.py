"""Latency at a constant request rate, without coordinated omission: request i is due at
start + i/rate and its latency runs from that due time, so a stall delays the requests behind
it and they count it. wrk has no such mode, so this client does it, in a process of its own:
`python -m bench.harness.rate URL --rate R` prints its result as JSON."""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence

import orjson

from bench.common import BenchError, Result
from bench.harness.cpu import run_tool
from bench.harness.probes import HOST
from bench.harness.stats import percentile

RATE_S = 8.0
RATE_WARMUP_S = 1.0
RATE_CONNECTIONS = 64


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that GETs one path at a time: a few microseconds of
    client CPU per request (aiohttp's client costs ~10x more, which would be measured too)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        head = bytes(self.buffer[:end]).lower()
        length = re.search(rb"\r\ncontent-length:\s*(\d+)", head)
        if length is None:
            self.waiter.set_exception(ConnectionError("no content-length"))
            return
        total = end + 4 + int(length[1])
        if len(self.buffer) >= total:
            status = int(head[9:12])
            del self.buffer[:total]
            self.waiter.set_result(status)

    def get(self, request: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter


async def _drive(url: str, rate: float, duration_s: float, warmup_s: float, connections: int) -> Result:
    """Request i is due at start + i/rate; it takes an idle connection (or opens one, up to
    `connections`, or waits for one) and its latency runs from the due time to the last byte."""
    loop = asyncio.get_running_loop()
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or HOST, parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    warm = int(rate * warmup_s)
    n = warm + int(rate * duration_s)
    latency = [math.nan] * n
    late = [0.0] * n
    counts = {"bad_status": 0, "errors": 0, "opened": 0}
    idle: list[_Conn] = []
    slots = asyncio.Semaphore(connections)

    async def one(i: int, due: float) -> None:
        late[i] = loop.time() - due
        async with slots:
            conn = idle.pop() if idle else None
            try:
                if conn is None:
                    _, conn = await loop.create_connection(_Conn, host, port)
                    counts["opened"] += 1
                status = await asyncio.wait_for(conn.get(request), 30)
            except (OSError, TimeoutError):
                counts["errors"] += 1
                return
            latency[i] = loop.time() - due
            if status != 200:
                counts["bad_status"] += 1
            if not conn.lost:
                idle.append(conn)

    tasks: list[asyncio.Task[None]] = []
    start = loop.time() + 0.05
    i = 0
    while i < n:
        now = loop.time()
        while i < n and start + i / rate <= now:
            tasks.append(asyncio.create_task(one(i, start + i / rate)))
            i += 1
        if i < n:
            await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
    await asyncio.gather(*tasks)
    finished = loop.time()
    for conn in idle:
        if conn.transport is not None:
            conn.transport.close()
    measured = sorted(x * 1000 for x in latency[warm:] if not math.isnan(x))
    lateness = sorted(x * 1000 for x in late[warm:])
    measured_n = n - warm
    window = finished - (start + warm / rate)  # first measured due time to the last answer
    return {
        "rate": rate,
        "requests": measured_n,
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


def constant_rate(url: str, rate: float, pids: Mapping[str, int], duration_s: float = RATE_S) -> Result:
    """`rate` requests/s for `duration_s` (after RATE_WARMUP_S of the same) from a client
    process of its own; latency from each request's scheduled send time."""
    argv = [sys.executable, "-m", "bench.harness.rate", url, "--rate", f"{rate:.1f}"]
    argv += ["--duration", str(duration_s), "--warmup", str(RATE_WARMUP_S)]
    argv += ["--connections", str(RATE_CONNECTIONS)]
    run = run_tool("rate_client", argv, pids, timeout=duration_s + 120)
    if run.returncode != 0:
        raise BenchError(f"rate client exited with {run.returncode}: {run.stderr[-300:]}")
    result: Result = orjson.loads(run.stdout)
    if result["bad_status"] or result["errors"]:
        raise BenchError(f"rate client: {result['bad_status']} bad answers, {result['errors']} errors")
    result["cpu_pct"] = run.cpu_pct
    return result


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.rate", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, default=RATE_S)
    parser.add_argument("--warmup", type=float, default=RATE_WARMUP_S)
    parser.add_argument("--connections", type=int, default=RATE_CONNECTIONS)
    args = parser.parse_args(argv)
    result = asyncio.run(_drive(args.url, args.rate, args.duration, args.warmup, args.connections))
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
