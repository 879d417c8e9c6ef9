"""warm_visibility: how long after a write both API nodes' warm top-10 (no nocache) show it.

Two API nodes on the same Redis; node 1 serves a constant-rate reader of the warm top-10 (the
rate client, its own process, started from a thread here) while this process writes through the
worker's own write path (Applier, bench/harness/fill.py): VIS_WRITES `set`s, one every
VIS_EVERY_S, each of a member (not in the top 10 before) to a score above every other, so each
takes rank 1. t0 is taken right after the apply returns the board's new seq S. Each node is
polled over a keep-alive connection (bench/harness/http1.py), every VIS_POLL_S while a write is
not yet visible there; a write is visible on a node at the first answer with seq >= S and at
rank 1 its member or a later write's (writes do not wait for the previous one to be seen: a
slow cache would make ~1 s of them overlap). Its visibility time is the later node's arrival -
t0. A write not seen on both within VIS_WAIT_S of the last write counts as VIS_WAIT_S (a lower
bound), and is counted as unresolved. Answers whose seq and rank 1 disagree (seq covers write k
but rank 1 is older, or rank 1 is newer than the seq says) are counted per node."""

from __future__ import annotations

import asyncio
import bisect
import random
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.api.reads import BOARD, BOARD_PATH, MEMBERS, member_id
from bench.common import BenchError, Result, say
from bench.harness.fill import apply_set, set_event
from bench.harness.http1 import HttpConn, Request, encode
from bench.harness.probes import HOST, get_json
from bench.harness.rate import RATE_WARMUP_S, constant_rate
from bench.harness.stats import percentile
from worker.apply import Applier

VIS_WRITES = 300
VIS_EVERY_S = 0.020
VIS_POLL_S = 0.002
VIS_WAIT_S = 5.0
TOP_PATH = f"{BOARD_PATH}/top?limit=10"


@dataclass
class _Writes:
    members: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # the board's seq after each write
    t0: list[float] = field(default_factory=list)  # perf_counter() right after each apply returned
    index: dict[str, int] = field(default_factory=dict)  # member -> its write


class _Node:
    """One node's warm top-10, polled while a write is not yet visible there."""

    def __init__(self, name: str, base: str, writes: _Writes) -> None:
        parts = urllib.parse.urlsplit(base)
        self.name, self.host, self.port = name, parts.hostname or HOST, parts.port or 80
        self.request = encode(Request("GET", TOP_PATH), f"{self.host}:{self.port}")
        self.writes = writes
        self.seen: list[float] = []  # arrival of the first answer showing write k (a prefix of them)
        self.wake = asyncio.Event()
        self.answers = self.bad_status = self.stale_top = self.top_ahead = 0

    def observe(self, answer: Any, arrived: float) -> None:
        if not isinstance(answer.get("seq"), int):
            raise BenchError(f"{self.name}: a top answer without its seq: {orjson.dumps(answer)[:300]!r}")
        items = answer.get("items") or [{}]
        newest = self.writes.index.get(items[0].get("member"), -1)  # the write at rank 1 (-1: none)
        covered = bisect.bisect_right(self.writes.seqs, int(answer["seq"])) - 1  # the last write seq covers
        self.stale_top += newest < covered
        self.top_ahead += newest > covered
        while len(self.seen) <= min(newest, covered):
            self.seen.append(arrived)

    async def run(self, done: asyncio.Event, give_up: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: HttpConn(keep_body=True), self.host, self.port)
        next_at = 0.0
        try:
            while not give_up.is_set():
                if len(self.seen) >= len(self.writes.seqs):
                    if done.is_set():
                        return
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                next_at = time.perf_counter() + VIS_POLL_S
                reply = await asyncio.wait_for(conn.send(self.request), 10)
                self.answers += 1
                if reply.status != 200:
                    self.bad_status += 1
                    continue
                self.observe(orjson.loads(reply.body), reply.arrived)
        finally:
            conn.close()


async def _write(
    applier: Applier, picks: Sequence[str], base_score: float, writes: _Writes, nodes: Sequence[_Node]
) -> None:
    start = time.perf_counter()
    for k, member in enumerate(picks):
        await asyncio.sleep(max(0.0, start + k * VIS_EVERY_S - time.perf_counter()))
        seq = apply_set(applier, set_event(f"vis-{k}", BOARD, member, base_score + k + 1))
        t0 = time.perf_counter()  # the loop was blocked in the apply: no answer was read meanwhile
        writes.index[member] = k
        writes.members.append(member)
        writes.seqs.append(seq)
        writes.t0.append(t0)
        for node in nodes:
            node.wake.set()


async def _measure(
    applier: Applier, picks: Sequence[str], base_score: float, nodes: Sequence[_Node]
) -> float:
    """Write and poll; seconds the writes took."""
    writes = nodes[0].writes
    done, give_up = asyncio.Event(), asyncio.Event()
    polling = [asyncio.create_task(node.run(done, give_up)) for node in nodes]
    started = time.perf_counter()
    try:
        await _write(applier, picks, base_score, writes, nodes)
        write_s = time.perf_counter() - started
        done.set()
        for node in nodes:
            node.wake.set()
        await asyncio.wait(polling, timeout=VIS_WAIT_S)
        give_up.set()
        for node in nodes:
            node.wake.set()
        await asyncio.gather(*polling)
    finally:
        for task in polling:
            task.cancel()
    return write_s


def _stats(values_ms: Sequence[float]) -> Result:
    ordered = sorted(values_ms)
    return {
        "p50_ms": round(percentile(ordered, 0.50), 2),
        "p90_ms": round(percentile(ordered, 0.90), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2) if ordered else None,
    }


def warm_visibility(
    applier: Applier, bases: Sequence[str], read_rate: float, pids: dict[str, int], rng: random.Random
) -> Result:
    """The visibility run (see the module's doc); the reader's rate is `read_rate` on bases[0]."""
    before = get_json(f"{bases[0]}{TOP_PATH}&nocache=1")
    top10 = {i["member"] for i in before["items"]}
    picks = [m for m in (member_id(i) for i in rng.sample(range(MEMBERS), VIS_WRITES + 10)) if m not in top10]
    picks = picks[:VIS_WRITES]
    writes = _Writes()
    nodes = [_Node(f"node{i + 1}", base, writes) for i, base in enumerate(bases)]
    read_s = VIS_WRITES * VIS_EVERY_S + 2.0
    say(f"visibility: {VIS_WRITES} writes every {VIS_EVERY_S * 1000:.0f} ms, both nodes polled; "
        f"node1 read at a constant {read_rate:,.0f} req/s")  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(constant_rate, f"{bases[0]}{TOP_PATH}", read_rate, pids, read_s)
        time.sleep(RATE_WARMUP_S + 0.5)  # the reader started and warmed up
        write_s = asyncio.run(_measure(applier, picks, float(before["items"][0]["score"]), nodes))
        reader = reading.result()
    per_write = [
        max(node.seen[k] for node in nodes) - t0 if all(len(node.seen) > k for node in nodes) else VIS_WAIT_S
        for k, t0 in enumerate(writes.t0)
    ]
    unresolved = sum(1 for k in range(len(writes.t0)) if any(len(node.seen) <= k for node in nodes))
    result: Result = {
        "writes": len(writes.t0),
        "unresolved": unresolved,
        **_stats([x * 1000 for x in per_write]),
        "write_s": round(write_s, 2),
        "nodes": {
            node.name: {
                **_stats([(t - t0) * 1000 for t, t0 in zip(node.seen, writes.t0, strict=False)]),
                "seen": len(node.seen),
                "answers": node.answers,
                "bad_status": node.bad_status,
                "stale_top": node.stale_top,
                "top_ahead": node.top_ahead,
            }
            for node in nodes
        },
        "reader": reader,
    }
    say(f"visibility: p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms, "
        f"{unresolved} unresolved")  # fmt: skip
    return result
