"""What one event costs Redis, ours against the seeds' bare design, on the same Redis in one run
(part of `bench worker`). Counted with Redis' own INFO: `used_cpu_user + used_cpu_sys` per event
and `used_memory` per (member, window instance).

Workload (issue 10, fixed for every figure): one board of a type with windows [total, day,
week], MEMBERS members with 24-character ids, Redis with AOF as `rankstream dev` runs it.
- distinct: one event per member, onto an empty board (every event adds a member);
- repeating: as many events again, members drawn uniformly from those on the board;
- zipf: as many events again, members drawn Zipf(1.1) from those on the board (a live room: a
  few members get most of the gifts).
The worker keeps the board's state through the three phases, as a worker owning its partitions
does; `*_repeating_cold` runs the repeating stream once more after it forgot the board (as after
a restart: each member read from Redis once).
Ours = worker/apply.py's Applier (the worker deciding, Redis running the guarded writes, with
the offset fence and id window) called in chunks of CHUNK events, as the worker calls it;
`*_redis_decides` = the same with RANKSTREAM_WORKER_STATE_CELLS=0 (apply.lua decides every
event, as releases up to 0.1.0 did: `vs_redis_decides`); the seeds' bare design
(`seed_bare_redis_us_per_event`) = ZINCRBY per window, pipelined per CHUNK events, no dedupe.
Bytes: after the distinct phase the id window's and the fence's keys are deleted (they are
counted per id in bench/memory.py), and used_memory's growth is divided by members x windows;
`bare_zset_bytes_per_member` is the same for the bare design's sorted sets.
Ours runs twice: a type in the general layout, and the same type declaring its score range
(`*_declared`: its day and week pack the tie into the score, total keeps the general layout).
Where Redis' time goes (`profile`, general layout, per workload phase): Redis' own INFO
commandstats, per event, for each command the scripts call, and `script_other_us` = the
scripts' time not inside those commands (Lua itself, and turning arguments and replies between
Lua and Redis); then `script_phases`, a third run of the general layout with apply.lua's own
phases timed (bench/redis_phases.py).
`*_script`: ours with the decided writes through guarded.lua instead of native transactions
(`native_vs_script`); `small_chunks`: the two ways when a batch's events spread over many boards
(a few events a board: common/store/native.py MIN_EVENTS).
`worker_bytes_per_cell`: the worker's kept state of the board after the distinct phase (Python
objects, counted deeply) per (member, window period).
Knob: RANKSTREAM_BENCH_COST_MEMBERS (default 100000).
"""

from __future__ import annotations

import random
import string
import sys
import time
from collections.abc import Callable, Sequence
from typing import cast

import redis

from bench.common import Result, env_int, say, zipf_cum_weights
from bench.memory import memory_usage, used_memory
from bench.redis_phases import read_phases, time_phases
from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.topology import Store, masters
from worker.apply import Applier, Position, Source
from worker.boardstate import DEFAULT_MAX_CELLS

DEFAULT_MEMBERS = 100_000
CHUNK = 500
SMALL_CHUNKS = (1, 5, 25)  # events a board per chunk in `small_chunks`
SMALL_ROUNDS = 20
WINDOWS = ("total", "day", "week")
BOARD = "cost:room1"
PREFIX = "c:"
ID_LENGTH = 24
_WINDOWS = f"windows: [{', '.join(WINDOWS)}]"
CONFIG = (
    f"timezone: UTC\ntypes:\n  cost: {{{_WINDOWS}}}\n  ranged: {{{_WINDOWS}, score_range: [0, 8000000]}}\n"
)


def redis_cpu_s(client: Store) -> float:
    """Redis' own CPU seconds so far: the server's, or the sum over a cluster's masters."""
    total = 0.0
    for node in masters(client):
        info = cast("dict[str, float]", node.info("cpu"))
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def member_ids(n: int, rng: random.Random) -> list[str]:
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=ID_LENGTH)) for _ in range(n)]


def zipf_draws(members: Sequence[str], n: int, rng: random.Random, s: float = 1.1) -> list[str]:
    """n members drawn Zipf(s): the k-th most popular with weight 1/k^s (popularity shuffled)."""
    ranked = list(members)
    rng.shuffle(ranked)
    return rng.choices(ranked, cum_weights=zipf_cum_weights(len(ranked), s), k=n)


def deep_bytes(root: object) -> int:
    """Bytes of the Python objects reachable from `root` (each counted once)."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


def _measure(client: redis.Redis, n: int, apply_chunk: Callable[[int, int], None]) -> float:
    """Redis CPU microseconds per event for n events applied in chunks."""
    before = redis_cpu_s(client)
    for start in range(0, n, CHUNK):
        apply_chunk(start, min(start + CHUNK, n))
    return round(1e6 * (redis_cpu_s(client) - before) / n, 2)


def command_profile(client: redis.Redis, n: int) -> Result:
    """INFO commandstats since the last CONFIG RESETSTAT, per event: µs and calls per command
    (the commands scripts call count on their own), and the scripts' time outside them."""
    stats = cast("dict[str, dict[str, float]]", client.info("commandstats"))
    per = {name.removeprefix("cmdstat_"): row for name, row in stats.items() if name != "cmdstat_config"}
    scripts = sum(row["usec"] for name, row in per.items() if name in ("evalsha", "evalsha_ro", "eval"))
    inside = sum(row["usec"] for name, row in per.items() if name not in ("evalsha", "eval"))
    commands = {
        name: {"us": round(row["usec"] / n, 2), "calls": round(row["calls"] / n, 3)}
        for name, row in sorted(per.items(), key=lambda item: -item[1]["usec"])
        if name not in ("evalsha", "eval") and row["usec"] / n >= 0.05
    }
    return {
        "script_us": round(scripts / n, 2),
        "script_other_us": round((scripts - inside) / n, 2),
        "commands": commands,
    }


def _ours(
    client: redis.Redis,
    streams: tuple[Sequence[str], Sequence[str], Sequence[str]],
    now: int,
    type_name: str = "cost",
    *,
    phases: bool = False,
    state_cells: int = DEFAULT_MAX_CELLS,
    native: bool = True,
) -> Result:
    """Ours on an empty Redis; `phases`: apply.lua timed phase by phase instead (its CPU and
    commands then include the timers; the worker keeps no state: apply.lua decides). `streams`:
    the distinct, repeating and Zipf members."""
    members, repeat, zipf = streams
    cells = 0 if phases else state_cells
    applier = Applier(
        client, parse_boards(CONFIG), PREFIX, 3600, now_ms=lambda: now, epoch="bench", state_cells=cells
    )
    if phases:
        time_phases(applier)
    if applier.states is not None:
        applier.states.native = native
    source = Source("bench", 0, "bench-topic", -1)
    board = f"{type_name}:room1"

    def phase(tag: str, who: Sequence[str], first_offset: int) -> Callable[[int, int], None]:
        def apply_chunk(start: int, stop: int) -> None:
            events = [
                (
                    UpdateEvent(
                        f"{tag}-{i}", board, type_name, who[i], Op.INCR, float(1 + i % 97), now, None
                    ),
                    now,
                )
                for i in range(start, stop)
            ]
            positions = [Position(source, first_offset + i, None) for i in range(start, stop)]
            applier.apply(events, positions)

        return apply_chunk

    base = used_memory(client)
    client.config_resetstat()
    distinct = _measure(client, len(members), phase("d", members, 0))
    distinct_profile = command_profile(client, len(members))
    distinct_phases = read_phases(client, len(members))
    # the id window's and the fence's keys, counted per id in bench/memory.py, are left out by
    # their MEMORY USAGE (deleting them would be a write the worker's kept state did not see)
    side = [*client.scan_iter(match=f"{PREFIX}{{{board}}}:i*", count=10_000), f"{PREFIX}{{{board}}}:fence"]
    held = used_memory(client) - base - memory_usage(client, side)
    kept = applier.states.stats.cells if applier.states is not None else 0
    state_bytes = deep_bytes(applier.states._states) if applier.states is not None else 0
    client.config_resetstat()
    repeating = _measure(client, len(repeat), phase("r", repeat, len(members)))
    repeating_profile = command_profile(client, len(repeat))
    zipf_cost = _measure(client, len(zipf), phase("z", zipf, 2 * len(members)))
    repeating_cold = None
    if applier.states is not None:  # as after a restart: the worker reads each member once
        applier.states.drop_all()
        repeating_cold = _measure(client, len(repeat), phase("c", repeat, 3 * len(members)))
    return {
        "distinct_us_per_event": distinct,
        "repeating_us_per_event": repeating,
        "zipf_us_per_event": zipf_cost,
        "repeating_cold_us_per_event": repeating_cold,
        "worker_bytes_per_cell": round(state_bytes / kept, 1) if kept else None,
        "state": vars(applier.states.stats) if applier.states is not None else None,
        "bytes_per_member_window": round(held / (len(members) * len(WINDOWS)), 1),
        "profile": {"distinct": distinct_profile, "repeating": repeating_profile},
        "script_phases": {"distinct": distinct_phases, "repeating": read_phases(client, len(repeat))},
    }


def _bare(client: redis.Redis, members: Sequence[str], repeat: Sequence[str], zipf: Sequence[str]) -> Result:
    keys = [f"bare:{{{BOARD}}}:{w}" for w in WINDOWS]

    def phase(who: Sequence[str]) -> Callable[[int, int], None]:
        def apply_chunk(start: int, stop: int) -> None:
            pipe = client.pipeline(transaction=False)
            for i in range(start, stop):
                for key in keys:
                    pipe.zincrby(key, float(1 + i % 97), who[i])
            pipe.execute()

        return apply_chunk

    base = used_memory(client)
    distinct = _measure(client, len(members), phase(members))
    held = used_memory(client) - base
    repeating = _measure(client, len(repeat), phase(repeat))
    zipf_cost = _measure(client, len(zipf), phase(zipf))
    return {
        "distinct_us_per_event": distinct,
        "repeating_us_per_event": repeating,
        "zipf_us_per_event": zipf_cost,
        "bytes_per_member": round(held / (len(members) * len(WINDOWS)), 1),
    }


def _spread(applier: Applier, rng: random.Random, now: int, k: int, rounds: range) -> None:
    """Batches of CHUNK events, k a board over CHUNK/k boards of 200 members each."""
    source, boards = Source("bench", 0, "bench-topic", -1), CHUNK // k
    for n in rounds:
        events = [
            (
                UpdateEvent(
                    f"{n}-{i}", f"cost:b{i // k}", "cost", f"m{rng.randrange(200)}", Op.INCR, 1.0, now, None
                ),
                now,
            )
            for i in range(boards * k)
        ]
        applier.apply(events, [Position(source, n * CHUNK + i, None) for i in range(len(events))])


def _small_chunks(client: redis.Redis, now: int, rng: random.Random) -> Result:
    """CHUNK events a batch spread over CHUNK/k boards, the boards' states kept: Redis CPU per
    event with the decided writes as transactions and through guarded.lua, each way forced for
    every chunk (why common/store/native.py MIN_EVENTS is)."""
    out: Result = {}
    for k in SMALL_CHUNKS:
        row: dict[str, float] = {}
        for way in ("native", "script"):
            client.flushall()
            applier = Applier(client, parse_boards(CONFIG), PREFIX, 3600, now_ms=lambda: now, epoch="bench")
            assert applier.states is not None
            applier.states.native, applier.states.native_min_events = way == "native", 1
            applier.states.native_max_boards = CHUNK  # every board of the round
            _spread(applier, rng, now, k, range(3))  # the states are read once
            before = redis_cpu_s(client)
            _spread(applier, rng, now, k, range(3, 3 + SMALL_ROUNDS))
            row[way] = round(1e6 * (redis_cpu_s(client) - before) / (SMALL_ROUNDS * CHUNK), 2)
        row["native_vs_script"] = round(row["native"] / row["script"], 2)
        out[f"{k}_per_board"] = row
    return out


def measure_redis_cost(client: redis.Redis, rng: random.Random) -> Result:
    n = env_int("COST_MEMBERS", DEFAULT_MEMBERS)
    members = member_ids(n, rng)
    repeat = [members[rng.randrange(n)] for _ in range(n)]
    zipf = zipf_draws(members, n, rng)
    now = int(time.time() * 1000)
    say(f"redis cost: {n} members x {len(WINDOWS)} windows, ours then the bare design")
    client.flushall()
    streams = (members, repeat, zipf)
    ours = _ours(client, streams, now)
    client.flushall()
    declared = _ours(client, streams, now, "ranged")
    client.flushall()
    lua = _ours(client, streams, now, state_cells=0)
    client.flushall()
    scripted = _ours(client, streams, now, native=False)
    client.flushall()
    small = _small_chunks(client, now, rng)
    client.flushall()
    timed = _ours(client, streams, now, phases=True)
    client.flushall()
    bare = _bare(client, members, repeat, zipf)
    client.flushall()
    workloads = ("distinct", "repeating", "zipf")
    ratio = {w: round(ours[f"{w}_us_per_event"] / bare[f"{w}_us_per_event"], 2) for w in workloads}
    return {
        "members": n,
        "windows": list(WINDOWS),
        "chunk": CHUNK,
        "redis_us_per_event": ours["distinct_us_per_event"],
        "redis_us_per_event_repeating": ours["repeating_us_per_event"],
        "seed_bare_redis_us_per_event": bare["distinct_us_per_event"],
        "seed_bare_redis_us_per_event_repeating": bare["repeating_us_per_event"],
        "redis_us_per_event_zipf": ours["zipf_us_per_event"],
        "seed_bare_redis_us_per_event_zipf": bare["zipf_us_per_event"],
        "redis_vs_bare": ratio["distinct"],
        "redis_vs_bare_repeating": ratio["repeating"],
        "redis_vs_bare_zipf": ratio["zipf"],
        # the repeating stream once more after the worker forgot the board (as after a restart)
        "redis_us_per_event_repeating_cold": ours["repeating_cold_us_per_event"],
        "redis_vs_bare_repeating_cold": round(
            ours["repeating_cold_us_per_event"] / bare["repeating_us_per_event"], 2
        ),
        "redis_us_per_event_redis_decides": lua["distinct_us_per_event"],
        "redis_us_per_event_repeating_redis_decides": lua["repeating_us_per_event"],
        "redis_us_per_event_zipf_redis_decides": lua["zipf_us_per_event"],
        "vs_redis_decides": round(ours["distinct_us_per_event"] / lua["distinct_us_per_event"], 2),
        "vs_redis_decides_repeating": round(
            ours["repeating_us_per_event"] / lua["repeating_us_per_event"], 2
        ),
        "vs_redis_decides_zipf": round(ours["zipf_us_per_event"] / lua["zipf_us_per_event"], 2),
        "worker_bytes_per_cell": ours["worker_bytes_per_cell"],
        "worker_state": ours["state"],
        "redis_bytes_per_member_window": ours["bytes_per_member_window"],
        "bare_zset_bytes_per_member": bare["bytes_per_member"],
        "bytes_vs_bare": round(ours["bytes_per_member_window"] / bare["bytes_per_member"], 2),
        "redis_us_per_event_declared": declared["distinct_us_per_event"],
        "redis_us_per_event_repeating_declared": declared["repeating_us_per_event"],
        "redis_vs_bare_zipf_declared": round(declared["zipf_us_per_event"] / bare["zipf_us_per_event"], 2),
        "redis_vs_bare_declared": round(declared["distinct_us_per_event"] / bare["distinct_us_per_event"], 2),
        "redis_vs_bare_repeating_declared": round(
            declared["repeating_us_per_event"] / bare["repeating_us_per_event"], 2
        ),
        "redis_bytes_per_member_window_declared": declared["bytes_per_member_window"],
        "bytes_vs_bare_declared": round(declared["bytes_per_member_window"] / bare["bytes_per_member"], 2),
        "profile": {**ours["profile"], "script_phases": timed["script_phases"]},
        "redis_us_per_event_script": scripted["distinct_us_per_event"],
        "redis_us_per_event_repeating_script": scripted["repeating_us_per_event"],
        "redis_us_per_event_zipf_script": scripted["zipf_us_per_event"],
        "native_vs_script": {
            w: round(ours[f"{w}_us_per_event"] / scripted[f"{w}_us_per_event"], 2) for w in workloads
        },
        "small_chunks": small,
    }
