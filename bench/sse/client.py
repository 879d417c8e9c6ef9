"""`python -m bench.sse.client`: N event streams on one API node, spread over the boards; prints
`ready` once every stream has its first page and the warm-up has passed, then, after the
measured seconds, one JSON line: how late each write reached a probe stream.

One stream per board is a probe: it parses every page and, from the `clock` member's score (the
write's send time, ms since the epoch; each board is written every 1/RATE s), works out when each
write folded into the page was sent. The other streams read and drop bytes: they load the node
as clients would, at a fraction of a parser's cost here."""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from collections.abc import Sequence

import aiohttp
import orjson

CONNECT_S = 120.0


class Probe:
    def __init__(self, rate: float) -> None:
        self.step_ms = 1000.0 / rate
        self.last: float | None = None  # the clock score of the page before
        self.delays: list[float] = []
        self.measuring = False

    def page(self, body: bytes, received_ms: float) -> None:
        top = orjson.loads(body)
        clock = next((i["score"] for i in top["items"] if i["member"] == "clock"), None)
        if clock is None:
            return
        if self.last is not None and self.measuring:
            sent = clock
            while sent > self.last:  # every write since the page before: one each step_ms
                self.delays.append(received_ms - sent)
                sent -= self.step_ms
        self.last = clock


async def _stream(
    session: aiohttp.ClientSession, url: str, probe: Probe | None, first: asyncio.Event
) -> None:
    async with session.get(url) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {await response.text()}")
        if probe is None:
            await response.content.readuntil(b"\n\n")  # the retry field
            await response.content.readuntil(b"event: top")
            first.set()
            while await response.content.readany():
                pass
            return
        data = b""
        async for line in response.content:
            if line.startswith(b"data: "):
                data = line[6:].rstrip(b"\n")
            elif line == b"\n" and data:
                probe.page(data, time.time() * 1000)
                data = b""
                first.set()


async def _run(
    base: str, boards: Sequence[str], *, streams: int, rate: float, warm_s: float, seconds: float
) -> dict[str, object]:
    probes = [Probe(rate) for _ in boards]
    firsts = [asyncio.Event() for _ in range(streams)]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for i in range(streams):
            board = boards[i % len(boards)]
            probe = probes[i] if i < len(boards) else None
            url = f"{base}/v1/boards/{board}/events?limit=10"
            tasks.append(asyncio.create_task(_stream(session, url, probe, firsts[i])))
            if i % 200 == 199:
                await asyncio.sleep(0.2)  # a ramp: 1,000 new streams a second
        deadline = time.monotonic() + CONNECT_S
        while not all(f.is_set() for f in firsts) and time.monotonic() < deadline:
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                raise RuntimeError(f"a stream failed: {failed[0].exception()}")
            await asyncio.sleep(0.1)
        connected = sum(f.is_set() for f in firsts)
        if connected < streams:
            raise RuntimeError(f"only {connected} of {streams} streams got a first page in {CONNECT_S:.0f} s")
        await asyncio.sleep(warm_s)
        cpu0 = _cpu_s()
        print("ready", flush=True)
        for probe in probes:
            probe.measuring = True
        await asyncio.sleep(seconds)
        for probe in probes:
            probe.measuring = False
        cpu = _cpu_s() - cpu0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delays = sorted(d for p in probes for d in p.delays)
    return {"streams": streams, "delays_ms": delays, "client_cpu_pct": round(100 * cpu / seconds, 1)}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sse.client", description=__doc__)
    parser.add_argument("--base", required=True)
    parser.add_argument("--boards", required=True, help="comma-separated")
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="writes per second per board")
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    result = asyncio.run(
        _run(
            args.base,
            args.boards.split(","),
            streams=args.streams,
            rate=args.rate,
            warm_s=args.warm,
            seconds=args.seconds,
        )
    )
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0
