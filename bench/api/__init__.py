"""The API benchmark: rankstream's read paths against a bare aiohttp handler, in one run.

On one private Redis (and Kafka, for the topics a `rankstream api` expects), with a board of
100,000 members (u0000000 .. u0099999) written by the worker's own write path (Applier), back
to back (the box is shared and noisy, so the ratios within a run are what counts, not the
absolute numbers):

1. `bare_rps`: wrk against a bare aiohttp app (one GET handler answering a constant body: a real
   top-10 answer's bytes; no middleware, no access log): one aiohttp process' ceiling here
   (bench/harness/bare.py); `bare_uvloop_rps`: the same on uvloop, as `rankstream api` runs
   (None when uvloop is not installed); `bare_redis_rps`: on uvloop, each request first makes one
   Redis round trip on the API's own connection (common/store/pipe.py): the ceiling of any read
   that asks Redis in this framework. Ratios are to `bare_rps`.
2. The uncached reads (`nocache=1`), wrk with bench/lua/wrk_reads.lua: each request is a
   random one of a pool formatted at init (seeded), so the reads spread over the board
   (>= 10,000 distinct members or offsets, checked):
   - `redis_top10_rps`: GET .../top?limit=10&offset=<random 0..99990> (until this version: always
     offset 0, one hot page);
   - `member_rps`: GET .../members/<random member>;
   - `around_rps`: GET .../members/<random member>/around?n=5;
   - `lookup500_rps`: POST .../members/lookup, 500 random distinct members (one of 64 bodies);
   ratios `redis_vs_bare`, `member_vs_bare`, `around_vs_bare`, `lookup500_vs_bare`.
3. `warm_top10_rps`: GET .../top?limit=10 (no nocache): the API answers it from its in-memory
   cache of an unchanged board; `warm_top10_vs_bare`. `cached_top10_*` / `cached_vs_bare*` are
   the same measurement under their old names (equal to `warm_top10_*`). `not_modified_rps`:
   the same request with If-None-Match naming its answer's ETag, so each answer is a 304
   (bench/lua/not_modified.lua); `not_modified_vs_bare`.
4. `<read>_p99_ms_at_half` (and p50) for the four uncached reads: each at half its own measured
   maximum, at a constant rate, cycling through RATE_REQUESTS (10,000) distinct pre-generated
   requests (bench/harness/rate.py --requests), each request timed from its *scheduled* send time:
   a stall delays the requests behind it and they count it (no coordinated omission). With 2
   cores, the client shares them with the API and Redis. `half_rate_*` are the top-10's.
   `bare_p99_ms_at_half`: the bare app at the top-10's half rate, same client, same rounds: the
   floor this box and client put under every p99 at that rate.
5. `warm_visibility_p99_ms` (p50, max, count, unresolved): a second API node on the same Redis;
   while node 1 serves a constant-rate reader of the warm top-10 at half `warm_top10_rps`, ~300
   writes, one every 20 ms, each puts a member at rank 1 through Applier; per write, the time
   until both nodes' warm top-10 show it (bench/api/visibility.py). `warm_top10_p99_ms_during_writes`:
   that reader's latency.

Every read is checked first (200, its route's shape, from Redis when uncached: bench/api/reads.py),
and wrk fails the bench on any non-2xx. wrk runs `ROUNDS` times per target, interleaved; the
best round of each counts (bench/harness/wrk.py), as does the lowest-p99 round at half rate.
`details.server_cpu_us_per_request` and the `*_vs_bare_cpu` ratios (server CPU per request) are
less sensitive to the shared box. Knobs: RANKSTREAM_BENCH_ROUNDS (2), RANKSTREAM_BENCH_WRK_S (8).
"""

from __future__ import annotations

import os
import random
import time
import urllib.error
import urllib.request

from bench.api.reads import (
    BOARD,
    BOARD_PATH,
    MEMBERS,
    READS,
    at_half,
    check_reads,
    check_warm,
    check_wrk_info,
    member_id,
    write_request_files,
    wrk_script,
)
from bench.api.rows import AT_MOST, GOALS, ROWS
from bench.api.summary import summarize
from bench.api.visibility import warm_visibility
from bench.common import REPO, BenchError, Result, say
from bench.harness.bare import have_uvloop, start_bare
from bench.harness.fill import board_applier, fill
from bench.harness.nodes import start_api
from bench.harness.probes import get_json, http_get, wait_ready
from bench.harness.processes import children, rss_bytes
from bench.harness.report import header
from bench.harness.stack import private_stack
from bench.harness.wrk import WRK_CONNECTIONS, Script, Target, wrk_knobs, wrk_rounds
from common.boards import load_boards
from rankstream.topics import ensure_topics

__all__ = ["AT_MOST", "GOALS", "ROWS", "run"]

FOLDER = REPO / ".stack" / "bench" / "api"
BOARDS_YAML = "timezone: UTC\ntypes:\n  gift: {windows: [total]}\n"
SEED = 20261123


NOT_MODIFIED = REPO / "bench" / "lua" / "not_modified.lua"


def not_modified(url: str) -> str:
    """The ETag of `url`'s answer, checked to get a 304 when sent back in If-None-Match."""
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the bench's own API
        tag = resp.headers["ETag"]
    request = urllib.request.Request(url, headers={"If-None-Match": tag})  # noqa: S310
    try:
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310
    except urllib.error.HTTPError as exc:  # urllib raises on a 304
        if exc.code == 304:
            return str(tag)
    raise BenchError(f"{url} with If-None-Match {tag} did not answer 304")


def run() -> Result:
    rounds, duration = wrk_knobs()
    head = header()
    started = time.monotonic()
    rng = random.Random(SEED)
    with private_stack(FOLDER, BOARDS_YAML) as stack, children(FOLDER / "procs") as group:
        settings = stack.settings("api", key_prefix="ba:")
        ensure_topics(settings)
        say(f"filling {BOARD} with {MEMBERS:,} members through Applier")
        boards = load_boards(stack.boards_file)
        members = [member_id(i) for i in range(MEMBERS)]
        filled = fill(stack.client, boards, settings.key_prefix, board=BOARD, members=members, rng=rng)
        files = write_request_files(FOLDER, rng)
        api, base = start_api(group, "api", settings)
        ready_s, _ = wait_ready(api, f"{base}/readyz")
        samples = check_reads(base, files)
        warm_url = f"{base}{BOARD_PATH}/top?limit=10"
        sample = get_json(warm_url)
        check_warm(sample)
        _, body = http_get(warm_url)
        server_pids = stack.pids()
        api_pids = {"api": api.pid, **server_pids}
        bare, bare_base = start_bare(group, body)
        targets = [Target("bare", f"{bare_base}/", {"bare": bare.pid, **server_pids})]
        bare_uv = start_bare(group, body, uvloop=True) if have_uvloop() else None
        if bare_uv is not None:
            targets.append(Target("bare_uvloop", f"{bare_uv[1]}/", {"bare": bare_uv[0].pid, **server_pids}))
        redis_url = settings.redis_url.get_secret_value()
        bare_redis, bare_redis_base = start_bare(group, body, redis=redis_url)
        targets.append(Target("bare_redis", f"{bare_redis_base}/", {"bare": bare_redis.pid, **server_pids}))
        for i, read in enumerate(READS):
            targets.append(Target(read.name, f"{base}/", api_pids, wrk_script(read, SEED + i)))
        targets.append(Target("warm_top10", warm_url, api_pids))
        targets.append(
            Target("not_modified", warm_url, api_pids, Script(NOT_MODIFIED, (not_modified(warm_url),)))
        )
        results = wrk_rounds(targets, rounds, duration)
        for read in READS:
            check_wrk_info(read, results[read.name]["info"])
        maxima = {read.name: float(results[read.name]["rps"]) for read in READS}
        floor = (f"{bare_base}/", {"bare": bare.pid, **server_pids})
        half = at_half(base, maxima, files, api_pids, rounds, floor)
        for child in (bare, bare_redis, *(() if bare_uv is None else (bare_uv[0],))):
            group.stop(child)
        api2, base2 = start_api(group, "api2", settings)
        wait_ready(api2, f"{base2}/readyz")
        check_warm(get_json(f"{base2}{BOARD_PATH}/top?limit=10"))
        vis_pids = {"api": api.pid, "api2": api2.pid, "bench": os.getpid(), **server_pids}
        applier = board_applier(stack.client, boards, settings.key_prefix)
        vis = warm_visibility(applier, [base, base2], results["warm_top10"]["rps"] / 2, vis_pids, rng)
        api_rss = rss_bytes(api.pid)
        stop_s = group.stop(api)
    summary, details = summarize({"bare_uvloop": None, **results}, half, vis)
    return {
        **summary,
        "members": MEMBERS,
        "board": BOARD,
        "fill_members_per_s": filled["members_per_s"],
        "top10_body_bytes": len(body),
        "notes": [
            f"{os.cpu_count()} cores shared by the server under test, Redis, an idle Kafka and the load "
            "generator (wrk -t1, or the rate client): a server's rps is not what it does with a core of "
            "its own; server_cpu_us_per_request and the *_vs_bare_cpu ratios are less sensitive to that "
            "and to noise",
            "at_half: constant rate from a separate client process, latency from each request's scheduled "
            "send time; best (lowest p99) of the rounds, every round's p99 in details.at_half_by_read",
            "redis_top10_* reads random offsets 0..99990 (before: offset 0 only); cached_* = warm_top10_*",
            "warm_visibility: a write not visible on both nodes within 5 s counts as 5 s (a lower bound) "
            "and in warm_visibility_unresolved",
        ],
        "wrk": {"threads": 1, "connections": WRK_CONNECTIONS, "duration_s": duration, "rounds": rounds},
        "details": {
            **details,
            "fill": filled,
            "api_ready_s": round(ready_s, 3),
            "api_rss_mb": None if api_rss is None else round(api_rss / 2**20, 1),
            "api_stop_s": round(stop_s, 2),
            "sample_answer": sample,
            "sample_answers": samples,
            "warm_source": sample.get("source"),
        },
        **head,
        "duration_s": round(time.monotonic() - started, 1),
    }
