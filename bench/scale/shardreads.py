"""The scale benchmark's sharded reads: a sharded board's top-10 and member rank against the same
board unsharded, each read while events stream into the board read.

On the 3-master cluster, one prefix, two boards filled with the same events (big1:global
unsharded, big3:global with 3 shards), one API node (`rankstream api`, warm cache bypassed with
nocache=1: every read goes to Redis) and one worker. First the unsharded board's maximum top-10
rate (wrk), while events stream into it at half the sharded board's maximum ingest rate (measured
by bench/scale/shards.py; on this 2-core box a maximum taken without them overloads the box once
they flow). Then, for each board in turn, in interleaved rounds: events stream into it at that
rate, and the top-10, then a member's rank (over the board's members), are read at a constant
half of that maximum top-10 rate (the rate client: latency from each request's scheduled time);
the lowest p99 of the rounds.

    sharded_top10_p99_ms, unsharded_top10_p99_ms, sharded_rank_p99_ms, unsharded_rank_p99_ms
    sharded_vs_unsharded_top10_p99, sharded_vs_unsharded_rank_p99   (goal: each <= 2)"""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson

from bench.common import BenchError, Result, say
from bench.harness.cpu import cpu_us_per_unit
from bench.harness.http1 import Request, write_requests
from bench.harness.kafka import paced, produce
from bench.harness.nodes import start_api, start_worker
from bench.harness.probes import get_json, wait_ready
from bench.harness.processes import Children
from bench.harness.rate import constant_rate
from bench.harness.stack import Stack
from bench.harness.stats import ratio
from bench.harness.wrk import wrk
from bench.scale.shards import BOARD
from bench.scale.targets import RedisTarget, part_settings
from bench.worker.workload import live_stream, make_events
from rankstream.topics import ensure_topics

BOARDS = {"unsharded": f"big1:{BOARD}", "sharded": f"big3:{BOARD}"}
ROWS = (
    "sharded_top10_p99_ms",
    "unsharded_top10_p99_ms",
    "sharded_rank_p99_ms",
    "unsharded_rank_p99_ms",
    "sharded_vs_unsharded_top10_p99",
    "sharded_vs_unsharded_rank_p99",
    "unsharded_top10_max_rps",
    "sharded_vs_unsharded_api_cpu_top10",
    "sharded_vs_unsharded_api_cpu_rank",
)
ROUNDS = 2
WRK_S = 8


def _requests(folder: Path, board: str, members: list[str]) -> dict[str, Path]:
    rng = random.Random(11)
    files = {"top10": folder / f"top10-{board}.jsonl", "rank": folder / f"rank-{board}.jsonl"}
    write_requests(files["top10"], [Request("GET", f"/v1/boards/{board}/top?limit=10&nocache=1")])
    picks = [rng.choice(members) for _ in range(10_000)]
    write_requests(
        files["rank"], [Request("GET", f"/v1/boards/{board}/members/{m}?nocache=1") for m in picks]
    )
    return files


def run(
    stack: Stack, group: Children, target: RedisTarget, *, n: int, ingest_max: float, index: int
) -> Result:
    """`ingest_max`: the sharded board's maximum ingest rate (events/s, bench/scale/shards.py)."""
    settings = part_settings(stack, target, "reads", index)
    ensure_topics(settings)
    events = make_events(n, "fill", random.Random(20261129))
    members = sorted({str(e["member"]) for e in events})
    messages = [
        (board.encode(), orjson.dumps({**e, "id": f"{board}-{e['id']}", "board": board}))
        for e in events
        for board in BOARDS.values()
    ]
    worker = start_worker(group, "reads-worker", settings, http_port=0)
    api, base = start_api(group, "reads-api", settings)
    try:
        produce(settings.kafka_bootstrap, settings.topic_updates, messages)
        wait_ready(api, f"{base}/readyz")
        _wait_filled(base, len(members))
        files = {name: _requests(stack.folder, board, members) for name, board in BOARDS.items()}
        pids = {"api": api.pid, "worker": worker.pid, **target.pids()}
        top = f"{base}/v1/boards/{BOARDS['unsharded']}/top?limit=10&nocache=1"
        ingest_rate = ingest_max / 2
        stream = live_stream("live", board=BOARDS["unsharded"])
        with paced(settings.kafka_bootstrap, settings.topic_updates, ingest_rate, stream):
            wrk(top, 2, pids)  # warm-up
            top_max = float(wrk(top, WRK_S, pids)["rps"])  # its maximum while events stream in
        read_rate = top_max / 2
        say(f"sharded reads: unsharded top-10 max {top_max:,.0f} req/s; reading at {read_rate:,.0f}/s "
            f"while {ingest_rate:,.0f} events/s stream into the board read")  # fmt: skip
        runs: dict[str, list[float]] = {}
        api_us: dict[str, list[float]] = {}
        where: dict[str, list[Result]] = {}
        for round_no in range(ROUNDS):
            for name, board in BOARDS.items():
                with paced(
                    settings.kafka_bootstrap,
                    settings.topic_updates,
                    ingest_rate,
                    live_stream("live", board=board),
                ):
                    for read in ("top10", "rank"):
                        got = constant_rate(f"{base}/", read_rate, pids, requests_file=files[name][read])
                        runs.setdefault(f"{name}_{read}", []).append(float(got["p99_ms"]))
                        # where a read's CPU goes (ingest's share in it): the API node, the Redis
                        # masters together, and how busy the box was
                        per_read = cpu_us_per_unit(got["cpu_pct"], read_rate)
                        api_us.setdefault(f"{name}_{read}", []).append(per_read["api"])
                        masters = sum(v for k, v in per_read.items() if k.startswith("redis_master"))
                        where.setdefault(f"{name}_{read}", []).append({
                            "api_us": per_read["api"],
                            "redis_masters_us": round(masters, 1),
                            "worker_us": per_read["worker"],
                            "box_busy_pct": got["cpu_pct"].get("machine"),
                            "p50_ms": got["p50_ms"],
                        })  # fmt: skip
                        p50, p99 = got["p50_ms"], got["p99_ms"]
                        say(f"round {round_no + 1}: {name} {read}: p50 {p50} ms, p99 {p99} ms")
    finally:
        group.stop(api)
        group.stop(worker)
    best = {key: min(values) for key, values in runs.items()}
    return {
        "unsharded_top10_max_rps": round(top_max, 1),
        "sharded_reads_rate_rps": round(read_rate, 1),
        "sharded_reads_ingest_rate": round(ingest_rate, 1),
        "sharded_top10_p99_ms": best["sharded_top10"],
        "unsharded_top10_p99_ms": best["unsharded_top10"],
        "sharded_rank_p99_ms": best["sharded_rank"],
        "unsharded_rank_p99_ms": best["unsharded_rank"],
        "sharded_vs_unsharded_top10_p99": ratio(best["sharded_top10"], best["unsharded_top10"]),
        "sharded_vs_unsharded_rank_p99": ratio(best["sharded_rank"], best["unsharded_rank"]),
        "sharded_reads_runs_p99_ms": runs,
        # where the rest goes: a sharded read's API CPU against an unsharded one's, per round
        "sharded_reads_api_us_per_read": api_us,
        "sharded_reads_cpu_per_read": where,
        "sharded_vs_unsharded_api_cpu_top10": ratio(
            min(api_us["sharded_top10"]), min(api_us["unsharded_top10"])
        ),
        "sharded_vs_unsharded_api_cpu_rank": ratio(
            min(api_us["sharded_rank"]), min(api_us["unsharded_rank"])
        ),
    }


def _wait_filled(base: str, members: int, timeout: float = 300) -> None:
    """Until both boards hold every member of the fill."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        totals = [
            get_json(f"{base}/v1/boards/{b}/top?limit=1&nocache=1").get("total") for b in BOARDS.values()
        ]
        if totals == [members, members]:
            return
        time.sleep(0.5)
    raise BenchError(f"the boards were not filled within {timeout:.0f}s")
