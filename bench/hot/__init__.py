"""The hot-board benchmark: a board of 1,000,000 members served from an API node's memory.

On one private Kafka and Redis, back to back (the box is shared and noisy: ratios within the
run count, not absolute numbers):

1. Fill `gift:hot` with 1M members through the worker's write path (Applier), then publish its
   state to update_cache as a worker does at start (worker.main.cache_publisher: backfill).
2. `ready_s_1m`: a real `rankstream api` process, from spawn to /readyz 200 (polled every
   20 ms); `replay_records_per_s`: records replayed / the API's own `ready_after_s`
   (bench/hot/loading.py; the replay under cProfile: bench/hot/profile.py).
3. `bytes_per_member`: RSS growth of a fresh process building what the API builds (HotWindow
   with 1M puts, finish_loading, meta for 5 %), per member; tracemalloc's count beside it
   (bench/hot/footprint.py).
4. `hot_top10_rps` (top 10 from memory), `hot_member_rps` and `hot_around_rps` (one member,
   and the 5 either side of it, from memory), `bare_rps` (bare aiohttp, the top 10's body) and
   `redis_top10_rps` (a second API node without the hot section, `nocache=1`, same data):
   wrk, interleaved rounds, best of each.
5. `visibility_p99_ms`: with a real worker and the hot API running, events produced at a
   steady rate, each a new member that outranks all others; a poller reads the top 1 every
   2 ms. Event i is visible once the top member is v<j>, j >= i (the board's events stay in
   order from update_rank to update_cache to memory) (bench/hot/visibility.py).
6. `promotion_s_100k`: a 100k-member board no config makes hot, read often on an API node with
   RANKSTREAM_HOT_PROMOTE_READS_PER_S: from its decision to load the board to its first answer
   from memory (bench/hot/promotion.py).

Knobs: RANKSTREAM_BENCH_HOT_MEMBERS (1000000), RANKSTREAM_BENCH_ROUNDS (2),
RANKSTREAM_BENCH_WRK_S (8), RANKSTREAM_BENCH_VIS_RATE (500), RANKSTREAM_BENCH_VIS_S (10),
RANKSTREAM_BENCH_PROFILE (1: cProfile the replay in a child process; 0: skip it),
RANKSTREAM_BENCH_PROMOTE_MEMBERS (100000).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from bench.common import ENV_PREFIX, BenchError, Result, env_int, say
from bench.harness.bare import start_bare
from bench.harness.fill import fill
from bench.harness.nodes import check_top, start_api
from bench.harness.probes import get_json, http_get, wait_ready
from bench.harness.processes import Child, Children, children, rss_bytes
from bench.harness.report import Row, header, met
from bench.harness.stack import Stack, private_stack, write_boards
from bench.harness.stats import ratio
from bench.harness.wrk import Target, cpu_us_per_request, wrk_knobs, wrk_rounds
from bench.hot.board import BOARD, COLD_YAML, FOLDER, HOT_YAML
from bench.hot.footprint import footprint
from bench.hot.loading import backfill, replay
from bench.hot.profile import profile_replay
from bench.hot.promotion import promotion
from bench.hot.visibility import DEFAULT_VIS_RATE, DEFAULT_VIS_S, VIS_LINGER_MS, visibility
from common.boards import load_boards
from common.settings import Settings
from rankstream.topics import ensure_topics

DEFAULT_MEMBERS = 1_000_000
MEMBER = "u0000001"  # member and around reads: one member of the filled board

GOALS: dict[str, float] = {
    "replay_records_per_s": 300_000,
    "ready_s_1m": 5,
    "bytes_per_member": 150,
    "hot_vs_bare": 0.85,
    "hot_member_vs_bare": 0.7,
    "hot_around_vs_bare": 0.7,
    "hot_vs_redis": 3,
    "visibility_p99_ms": 100,
}
AT_MOST = ("ready_s_1m", "bytes_per_member", "visibility_p99_ms")

ROWS = [
    Row("members"),
    Row("fill_members_per_s"),
    Row("backfill_s"),
    Row("backfill_records_per_s"),
    Row("ready_s_1m", "ready_s_1m", at_most=True),
    Row("ready_after_s"),
    Row("promotion_s_100k"),
    Row("promotion_from_first_read_s"),
    Row("replay_records_per_s", "replay_records_per_s"),
    Row("bytes_per_member", "bytes_per_member", at_most=True),
    Row("bytes_per_member_tracemalloc"),
    Row("api_rss_bytes_per_member"),
    Row("bare_rps"),
    Row("hot_top10_rps"),
    Row("redis_top10_rps"),
    Row("hot_vs_bare", "hot_vs_bare"),
    Row("hot_member_vs_bare", "hot_member_vs_bare"),
    Row("hot_around_vs_bare", "hot_around_vs_bare"),
    Row("hot_member_rps"),
    Row("hot_around_rps"),
    Row("hot_vs_redis", "hot_vs_redis"),
    Row("hot_vs_bare_cpu"),
    Row("hot_vs_redis_cpu"),
    Row("hot_top10_p50_ms"),
    Row("hot_top10_p99_ms"),
    Row("visibility_p50_ms"),
    Row("visibility_p99_ms", "visibility_p99_ms", at_most=True),
    Row("visibility_max_ms"),
    Row("visibility_events"),
    Row("visibility_observed"),
    Row("visibility_resolved"),
    Row("details.server_cpu_us_per_request.bare"),
    Row("details.server_cpu_us_per_request.hot_top10"),
    Row("details.server_cpu_us_per_request.redis_top10"),
    Row("details.cpu_pct.hot_top10.others"),
    Row("details.visibility.stages.update_rank.p50_ms"),
    Row("details.visibility.stages.update_rank.p99_ms"),
    Row("details.visibility.stages.redis.p50_ms"),
    Row("details.visibility.stages.redis.p99_ms"),
    Row("details.visibility.stages.update_cache.p50_ms"),
    Row("details.visibility.stages.update_cache.p99_ms"),
    Row("details.visibility.stages.api.p50_ms"),
    Row("details.visibility.stages.api.p99_ms"),
    Row("details.visibility.cpu_pct.worker"),
    Row("details.visibility.cpu_pct.api"),
    Row("details.visibility.cpu_pct.others"),
]


def _throughput(
    group: Children,
    stack: Stack,
    settings: Settings,
    *,
    hot_api: Child,
    hot_base: str,
    members: int,
    wrk: tuple[int, int],
) -> tuple[dict[str, Result], Result]:
    """wrk: bare, hot (memory), redis (a second API node reading the same data from Redis)."""
    cold_settings = settings.model_copy(
        update={"boards": write_boards(FOLDER / "boards-cold.yaml", COLD_YAML)}
    )
    cold_api, cold_base = start_api(group, "api-cold", cold_settings)
    wait_ready(cold_api, f"{cold_base}/readyz")
    hot_url = f"{hot_base}/v1/boards/{BOARD}/top?limit=10"
    member_url = f"{hot_base}/v1/boards/{BOARD}/members/{MEMBER}"
    around_url = f"{hot_base}/v1/boards/{BOARD}/members/{MEMBER}/around?n=5"
    for url in (member_url, around_url):
        if http_get(url)[0] != 200:
            raise BenchError(f"{url} did not answer 200")
    redis_url = f"{cold_base}/v1/boards/{BOARD}/top?limit=10&nocache=1"
    check_top(get_json(redis_url), "redis", members)
    _, body = http_get(hot_url)
    bare, bare_base = start_bare(group, body)
    pids = stack.pids()
    results = wrk_rounds(
        [
            Target("bare", f"{bare_base}/", {"bare": bare.pid, **pids}),
            Target("hot_top10", hot_url, {"api": hot_api.pid, **pids}),
            Target("hot_member", member_url, {"api": hot_api.pid, **pids}),
            Target("hot_around", around_url, {"api": hot_api.pid, **pids}),
            Target("redis_top10", redis_url, {"api": cold_api.pid, **pids}),
        ],
        *wrk,
    )
    rss = {
        "api_hot": rss_bytes(hot_api.pid),
        "api_cold": rss_bytes(cold_api.pid),
        "bare": rss_bytes(bare.pid),
    }
    group.stop(bare)
    group.stop(cold_api)
    return results, {"top10_body_bytes": len(body), "rss": rss}


def run() -> Result:
    members = env_int("HOT_MEMBERS", DEFAULT_MEMBERS)
    # a bad knob fails now, not after the fill
    wrk = wrk_knobs()
    env_int("VIS_RATE", DEFAULT_VIS_RATE)
    env_int("VIS_S", DEFAULT_VIS_S)
    want_profile = os.environ.get(f"{ENV_PREFIX}PROFILE", "1").strip() != "0"
    head = header()
    started = time.monotonic()
    rng = random.Random(20261124)
    with private_stack(FOLDER, HOT_YAML) as stack, children(FOLDER / "procs") as group:
        boards = load_boards(stack.boards_file)
        settings = stack.settings("hot", key_prefix="bh:", worker_group="bench-hot")
        ensure_topics(settings)
        say(f"filling {BOARD} with {members:,} members through Applier")
        filled = fill(stack.client, boards, settings.key_prefix, board=BOARD,
                      members=[f"u{i:07d}" for i in range(members)], rng=rng)  # fmt: skip
        say(f"filled at {filled['members_per_s']:,.0f} members/s; backfilling update_cache")
        settings, backfilled = backfill(stack, settings, boards)
        say(f"backfilled {backfilled['records']:,} records in {backfilled['backfill_s']} s")
        hot_api, hot_base, replayed = replay(group, settings, members)
        profile = profile_replay(settings) if want_profile else None
        say("memory per member (fresh processes)")
        mem = footprint(members, use_tracemalloc=False)
        traced = footprint(members, use_tracemalloc=True)
        results, extra = _throughput(
            group, stack, settings, hot_api=hot_api, hot_base=hot_base, members=members, wrk=wrk
        )
        vis = visibility(group, stack, settings, hot_api, hot_base)
        promoted = promotion(group, stack, settings, boards)
    phases = {"fill": filled, "backfill": backfilled, "replay": replayed, "replay_profile": profile,
              "memory_rss": mem, "memory_tracemalloc": traced, "visibility": vis,
              "promotion": promoted}  # fmt: skip
    return {
        **_summary(members, phases, results, extra),
        **head,
        "duration_s": round(time.monotonic() - started, 1),
    }


def _summary(members: int, phases: dict[str, Any], results: dict[str, Result], extra: Result) -> Result:
    filled, backfilled, replayed = phases["fill"], phases["backfill"], phases["replay"]
    mem, traced, vis = phases["memory_rss"], phases["memory_tracemalloc"], phases["visibility"]
    bare, hot, cold = (results[k]["rps"] for k in ("bare", "hot_top10", "redis_top10"))
    cpu_us = {
        "bare": cpu_us_per_request(results["bare"], "bare"),
        "hot_top10": cpu_us_per_request(results["hot_top10"], "api"),
        "redis_top10": cpu_us_per_request(results["redis_top10"], "api"),
    }
    rss = extra["rss"]
    summary: Result = {
        "replay_records_per_s": replayed["replay_records_per_s"],
        "ready_s_1m": replayed["ready_s"],
        "bytes_per_member": mem["bytes_per_member"],
        "hot_vs_bare": ratio(hot, bare),
        "hot_member_vs_bare": ratio(results["hot_member"]["rps"], bare),
        "hot_around_vs_bare": ratio(results["hot_around"]["rps"], bare),
        "hot_vs_redis": ratio(hot, cold),
        "visibility_p99_ms": vis["p99_ms"],
    }
    return {
        **summary,
        "goals": GOALS,
        "goals_at_most": list(AT_MOST),
        "met": met(summary, GOALS, AT_MOST),
        "members": members,
        "fill_members_per_s": filled["members_per_s"],
        "backfill_s": backfilled["backfill_s"],
        "backfill_records_per_s": backfilled["records_per_s"],
        "backfill_worker_producer_error": backfilled.get("worker_producer_error"),
        "ready_after_s": replayed["ready_after_s"],
        "promotion_s_100k": phases["promotion"]["promotion_s"],
        "promotion_from_first_read_s": phases["promotion"]["from_first_read_s"],
        "promotion_members": phases["promotion"]["members"],
        "records_replayed": replayed["records_replayed"],
        "bytes_per_member_tracemalloc": traced["bytes_per_member"],
        "api_rss_bytes_per_member": (
            round((rss["api_hot"] - rss["api_cold"]) / members, 1)
            if rss["api_hot"] and rss["api_cold"]
            else None
        ),
        "bare_rps": bare,
        "hot_top10_rps": hot,
        "hot_member_rps": results["hot_member"]["rps"],
        "hot_around_rps": results["hot_around"]["rps"],
        "redis_top10_rps": cold,
        "hot_vs_bare_cpu": ratio(cpu_us["bare"], cpu_us["hot_top10"]),
        "hot_vs_redis_cpu": ratio(cpu_us["redis_top10"], cpu_us["hot_top10"]),
        "hot_top10_p50_ms": results["hot_top10"].get("p50_ms"),
        "hot_top10_p99_ms": results["hot_top10"].get("p99_ms"),
        "visibility_p50_ms": vis["p50_ms"],
        "visibility_max_ms": vis["max_ms"],
        "visibility_events": vis["events"],
        "visibility_observed": vis["observed"],
        "visibility_resolved": vis["resolved"],
        "notes": [
            f"{os.cpu_count()} cores shared by everything measured and the load generators; "
            "server_cpu_us_per_request and the *_cpu ratios are less sensitive to that and to noise",
            "bytes_per_member: a fresh process building the API's structure; api_rss_bytes_per_member: the "
            "real hot API node after replay minus a node without hot boards (replay leftovers, "
            "fragmentation, librdkafka buffers included)",
            "visibility: stages are when each event was readable in update_rank (consumer with 10 ms fetch "
            "waits), applied in Redis (seq polled every 2 ms), readable in update_cache, served by the API "
            f"(top 1 polled every 2 ms); producer linger {VIS_LINGER_MS} ms, counted",
        ],
        "details": {
            **phases,
            **results,
            "cpu_pct": {name: r["cpu_pct"] for name, r in results.items()},
            "server_cpu_us_per_request": cpu_us,
            "rss_mb": {k: None if v is None else round(v / 2**20, 1) for k, v in rss.items()},
            "top10_body_bytes": extra["top10_body_bytes"],
        },
    }
