"""Period results (common/results.py): what reading a closed period's top 10,000 costs Redis, on
a board whose period holds a million members, at several page sizes, on one private Redis.

1. Two boards of MEMBERS members each in one day period, filled through the worker's own write
   path (worker/apply.py's Applier, `set`, at one instant, two processes): `general` (tie index,
   tie-prefixed zset members) and `packed` (a declared score_range: the tie inside the score).
   Scores are gift totals (Pareto); one member in META_SHARE has a ~90-byte meta.
2. ROUNDS reads of the 10,000-member top with `read_result(page=...)` (top.lua per page: ZCARDs,
   ZREVRANGE of the page, HMGET of its metas) per page size, the sizes interleaved, from a
   client of its own. Redis' own accounting, per read: `INFO commandstats` after CONFIG
   RESETSTAT (evalsha usec / calls: `mean_us` per call; `inside_us`: what top.lua's commands
   took of it) and every call's duration in SLOWLOG (slowlog-log-slower-than 0, reset:
   `p50_us`, `p99_us`, `max_us`; `max_us_best_read`: the longest call of the read whose longest
   was shortest, what a call costs without the shared box's stalls); `wall_ms`: the median read.
3. The same on `general` once every member of its top carries a 1000-byte meta (`worst_meta`:
   the contract's limit), and the naive design on each: one `ZREVRANGE 0 9999 WITHSCORES` and
   one HMGET of the 10,000 metas (`naive`: on `general`).
Goal: at RESULT_PAGE, mean and longest call (best read) <= 1 ms of Redis time, in `general` and
`packed`; `best_page`: the largest page whose `max_us_best_read` is <= MARGIN_US in both.
Knobs: RANKSTREAM_BENCH_RESULTS_MEMBERS (1000000), _ROUNDS (10).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import cast

import orjson
import redis

from bench.common import REPO, BenchError, Result, env_int, say
from bench.harness.cpu import CpuMeter
from bench.harness.fill import FILL_BATCH
from bench.harness.processes import fork_all
from bench.harness.report import Row, header, met
from bench.harness.stats import percentile, ratio
from bench.redis_cost import member_ids
from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.periods import Period, period_at
from common.results import RESULT_PAGE, read_result
from common.store import reads
from common.store.encoding import tie_mode, tie_prefix_length, window_packing
from common.store.keys import BoardKeys, window_instance
from rankstream.stack import LocalRedis, free_port
from worker.apply import Applier

FOLDER = REPO / ".stack" / "bench-results"
PREFIX, TOP, META_SHARE, SCORE_MAX, MARGIN_US = "pr:", 10_000, 10, 50_000_000, 700
PAGES = (100, 200, 250, 500, 1000, 2000)
INSIDE = ("zcard", "zrevrange", "hmget", "get")  # what top.lua calls: its µs per call are in evalsha's
_RESULTS = f"period_results: {{windows: [day], top: {TOP}}}"
BOARDS = parse_boards(
    f"timezone: UTC\ntypes:\n  general: {{windows: [day], {_RESULTS}}}\n"
    f"  packed: {{windows: [day], score_range: [0, {SCORE_MAX}], {_RESULTS}}}\n"
)
LAYOUTS = {"general": "general:room1", "packed": "packed:room1"}
WINDOW = BOARDS.types["general"].window("day")
Applied = tuple[UpdateEvent, int]
GOALS = {"result_page_mean_us": 1000.0, "result_page_max_us_best_read": 1000.0}
_PER_PAGE = ("mean_us", "max_us_best_read", "max_us")
_SHOWN = ("result_page_max_us", "result_page", "best_page", "best_page_worst_meta", "members", "fill_s",
          *(f"{x}.p{p}.{m}" for x in (*LAYOUTS, "worst_meta") for p in PAGES for m in _PER_PAGE),
          "general.p500.wall_ms", "naive.zrevrange_mean_us", "naive.zrevrange_max_us", "naive.hmget_mean_us",
          "naive.wall_ms", "naive_call_vs_result_page_call", "result_page_vs_naive_redis_ms",
          "box_cpu.others")  # fmt: skip
ROWS = [*(Row(goal, goal, at_most=True) for goal in GOALS), *(Row(name) for name in _SHOWN)]


def _meta(i: int, size: int) -> bytes:
    """A profile as producers send them: ~100 bytes, or padded to `size` bytes."""
    body = {"name": f"Player {i}", "avatar": f"https://cdn.example.com/a/{i:012d}.png", "lvl": i % 60}
    raw = orjson.dumps(body)
    return raw if size <= len(raw) else orjson.dumps({**body, "bio": "x" * (size - len(raw) - 10)})


def _event(board: str, i: int, member: str, score: float, *, meta: bytes | None, now: int) -> Applied:
    return UpdateEvent(f"{board}-{i}", board, board.split(":", 1)[0], member, Op.SET, score, now, meta), now


def _fill(port: int, board: str, members: Sequence[str], now: int) -> None:
    client = redis.Redis(port=port, client_name="fill", socket_timeout=120)
    applier, rng = Applier(client, BOARDS, PREFIX, 3600, now_ms=lambda: now, epoch="bench"), random.Random(7)
    for start in range(0, len(members), FILL_BATCH):
        applier.apply([
            _event(board, i, members[i], float(min(SCORE_MAX, int(100 * rng.paretovariate(1.2)))),
                   meta=_meta(i, 0) if i % META_SHARE == 0 else None, now=now)
            for i in range(start, min(start + FILL_BATCH, len(members)))
        ])  # fmt: skip


def fill(port: int, members: Sequence[str], now: int) -> Result:
    started = time.monotonic()
    fork_all([(_fill, (port, board, members, now)) for board in LAYOUTS.values()], "fill")
    return {"fill_s": round(time.monotonic() - started, 1)}


def _ref(board: str, period: Period) -> reads.WindowRef:
    kind, instance = BOARDS.types[board.split(":", 1)[0]], window_instance(WINDOW.name, period.id)
    packing = window_packing(kind, WINDOW, period.start_ms)
    return reads.WindowRef(BoardKeys(PREFIX, board), instance, True, tie_mode(kind), packing)


def one_read(admin: redis.Redis, read: Callable[[], object], commands: Sequence[str]) -> Result:
    """Redis' own accounting of one read: commandstats of `commands` (and of what top.lua calls
    inside them), and each call's duration from SLOWLOG, as (command, µs)."""
    admin.config_resetstat()
    admin.slowlog_reset()
    started = time.perf_counter()
    read()
    wall = 1000 * (time.perf_counter() - started)
    stats = cast("dict[str, dict[str, float]]", admin.info("commandstats"))
    stat = {k.removeprefix("cmdstat_"): v for k, v in stats.items()}
    calls = {name: stat[name]["calls"] for name in commands if name in stat}
    durations = [
        (name, e["duration"]) for e in admin.slowlog_get(100_000) if e.get("client_name") == b"reader"
        if (name := e["command"].split(b" ")[0].lower().decode()) in commands
    ]  # fmt: skip
    if len(durations) != sum(calls.values()):
        raise BenchError(f"SLOWLOG holds {len(durations)} of {sum(calls.values())} calls")
    return {"calls": calls, "wall_ms": wall, "durations": durations,
            "usec": {n: stat[n]["usec"] for n in (*commands, *INSIDE) if n in stat}}  # fmt: skip


def summary(reads: Sequence[Result], commands: Sequence[str]) -> Result:
    """Per call: mean (commandstats), p50, p99 and max (SLOWLOG), and the longest call of the read
    whose longest call was shortest (what a call costs without the box's stalls); per read: calls,
    Redis ms, the median wall time; `inside_us`: µs per call in the commands top.lua calls."""
    calls = sum(r["calls"].get(n, 0) for r in reads for n in commands)
    usec = {n: sum(r["usec"].get(n, 0) for r in reads) for n in (*commands, *INSIDE)}
    took = sorted(us for r in reads for name, us in r["durations"] if name in commands)
    spent = sum(usec[n] for n in commands)
    out = {
        "calls": round(calls / len(reads), 1), "mean_us": round(spent / calls, 1),
        "p50_us": percentile(took, 0.5), "p99_us": percentile(took, 0.99), "max_us": took[-1],
        "max_us_best_read": min(max(us for name, us in r["durations"] if name in commands) for r in reads),
        "redis_ms_per_read": round(spent / len(reads) / 1000, 2),
        "wall_ms": round(statistics.median(r["wall_ms"] for r in reads), 2),
    }  # fmt: skip
    if commands == ("evalsha",):
        out["inside_us"] = {n: round(usec[n] / calls, 1) for n in INSIDE}
    return out


def sweep(admin: redis.Redis, reader: redis.Redis, board: str, period: Period, rounds: int) -> Result:
    """`rounds` reads of the top at each page size, the page sizes interleaved in each round (a
    burst of noise on the box then lands on one read, not on one page size)."""
    board_type, done = BOARDS.types[board.split(":", 1)[0]], {page: list[Result]() for page in PAGES}

    def read(page: int) -> None:
        got = read_result(reader, PREFIX, board_type, board, window=WINDOW, period=period, page=page)
        if len(got.top) != TOP:
            raise BenchError(f"{board} page {page}: {len(got.top)} members read, not {TOP}")

    for _ in range(rounds):
        for page in PAGES:
            done[page].append(one_read(admin, functools.partial(read, page), ("evalsha",)))
    return {f"p{page}": summary(got, ("evalsha",)) for page, got in done.items()}


def naive(admin: redis.Redis, reader: redis.Redis, ref: reads.WindowRef, rounds: int) -> Result:
    """One ZREVRANGE of the whole top with scores, then one HMGET of its 10,000 metas."""
    plen = 0 if ref.packing is not None else tie_prefix_length(ref.mode)

    def read() -> object:
        rows = cast("list[tuple[bytes, float]]", reader.zrevrange(ref.rank_key, 0, TOP - 1, withscores=True))
        return reader.hmget(ref.keys.meta, [m[plen:] for m, _ in rows])

    done = [one_read(admin, read, ("zrevrange", "hmget")) for _ in range(rounds)]
    alone = {name: summary(done, (name,)) for name in ("zrevrange", "hmget")}
    return {**summary(done, ("zrevrange", "hmget")),
            **{f"{n}_{k}": alone[n][k] for n in alone for k in ("mean_us", "p50_us", "max_us")}}  # fmt: skip


def heavy_metas(client: redis.Redis, board: str, period: Period, now: int) -> None:
    """Every member of the top gets a 1000-byte meta, through the worker's path (same score)."""
    board_type = BOARDS.types[board.split(":", 1)[0]]
    top = read_result(client, PREFIX, board_type, board, window=WINDOW, period=period).top
    applier = Applier(client, BOARDS, PREFIX, 3600, now_ms=lambda: now, epoch="bench")
    for start in range(0, len(top), FILL_BATCH):
        applier.apply([_event(board, -1 - start - i, e.member, e.score, meta=_meta(start + i, 1000), now=now)
                       for i, e in enumerate(top[start : start + FILL_BATCH])])  # fmt: skip


def run() -> Result:
    n, rounds, head = env_int("RESULTS_MEMBERS", 1_000_000), env_int("RESULTS_ROUNDS", 10), header()
    began, now = time.monotonic(), int(time.time() * 1000)
    period = period_at(WINDOW, now, BOARDS.timezone)
    assert period is not None
    assert _ref(LAYOUTS["packed"], period).packing is not None, "the packed type must pack its day window"
    server = LocalRedis("redis", FOLDER / "redis", port=free_port())
    server.start()
    assert server.proc is not None
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, server.proc.pid, -10)
    admin = redis.Redis(port=server.port, client_name="bench", socket_timeout=120)
    reader = redis.Redis(port=server.port, client_name="reader", socket_timeout=120)
    try:
        say(f"fill: {n} members on each of {', '.join(LAYOUTS.values())} (day {period.id}), in parallel")
        filled = fill(server.port, member_ids(n, random.Random(20261123)), now)
        admin.config_set("slowlog-log-slower-than", "0")
        admin.config_set("slowlog-max-len", "1000000")
        for board in LAYOUTS.values():  # loads top.lua; checks the board is whole
            if (total := read_result(reader, PREFIX, BOARDS.types[board.split(":")[0]], board,
                                     window=WINDOW, period=period).members) != n:  # fmt: skip
                raise BenchError(f"{board}: {total} members in the period, not {n}")
        meter = CpuMeter({"redis": server.proc.pid})
        meter.start()
        out: Result = {}
        for layout, board in (*LAYOUTS.items(), ("worst_meta", LAYOUTS["general"])):
            if layout == "worst_meta":  # last: it rewrites the general board's metas
                heavy_metas(admin, board, period, now)
            say(f"{layout}: top {TOP} at pages {PAGES}, {rounds} rounds each; the naive read")
            out[layout] = sweep(admin, reader, board, period, rounds)
            out[f"naive_{layout}"] = naive(admin, reader, _ref(board, period), rounds)
        box = meter.stop()
    finally:
        admin.close()
        reader.close()
        server.stop()
    at, naive_ = {lay: out[lay][f"p{RESULT_PAGE}"] for lay in LAYOUTS}, out["naive_general"]
    values = {f"result_page_{m}": max(r[m] for r in at.values()) for m in _PER_PAGE}

    def best(*layouts: str) -> int | None:
        ok = [p for p in PAGES if all(out[x][f"p{p}"]["max_us_best_read"] <= MARGIN_US for x in layouts)]
        return max(ok, default=None)

    return {
        **values, **filled, **out, "naive": naive_, "result_page": RESULT_PAGE, "best_page": best(*LAYOUTS),
        "best_page_worst_meta": best("worst_meta"), "margin_us": MARGIN_US, "members": n, "top": TOP,
        "rounds": rounds, "pages": list(PAGES), "box_cpu": box, "goals": GOALS, **head,
        "naive_call_vs_result_page_call": ratio(naive_["zrevrange_mean_us"], at["general"]["mean_us"]),
        "result_page_vs_naive_redis_ms": ratio(  # total Redis time of a paged read over the naive one
            at["general"]["redis_ms_per_read"], naive_["redis_ms_per_read"]),
        "met": met(values, GOALS, at_most=tuple(GOALS)), "duration_s": round(time.monotonic() - began, 1),
    }  # fmt: skip
