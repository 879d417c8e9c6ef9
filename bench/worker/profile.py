"""Where the worker's CPU goes (part of `bench worker`): the same arrays workload, parsed and
applied in this process under cProfile against the bench's Redis, in the worker's batches
(parse_message, then Applier.apply_isolated per batch: the code the apply thread runs, minus
Kafka). Own time (tottime) is grouped by what it is spent on, in µs per event; the time the
socket waits for Redis' replies is Redis' work, reported apart (`waiting_on_redis`):

    parse       common/events.py (JSON, validation), common/boards.py (board ids)
    chunk       worker/apply.py: windows, chunks, masks, outcomes
    decide      worker/decide.py, worker/boardstate.py, common/store/guarded.py, common/store/encoding.py:
                the worker's decisions, its kept state and reads, the guarded writes' arguments
    arguments   common/store/apply.py, common/idwindow.py: typed requests to ARGV, fingerprints
    redis       the redis client (commands, connection, reply parsing), sockets
    other       the rest (stdlib, dataclasses, enum)

Redis' own time is not in it (it runs in Redis; bench/redis_cost.py counts it).
Knob: RANKSTREAM_BENCH_PROFILE_EVENTS (default 50000)."""

from __future__ import annotations

import cProfile
import pstats
import random

import redis

from bench.common import Result, env_int, say
from bench.worker.workload import ARRAY_SIZE, array_messages, make_events
from common.boards import parse_boards
from common.events import parse_message, ts_ceiling
from worker.apply import Applier

DEFAULT_EVENTS = 50_000
BATCH_MESSAGES = 10  # messages per apply: 1000 events, as the worker's arrays batches
_GROUPS = (
    ("parse", ("common/events.py", "common/boards.py")),
    ("chunk", ("worker/apply.py",)),
    (
        "decide",
        ("worker/decide.py", "worker/boardstate.py", "common/store/guarded.py", "common/store/encoding.py"),
    ),
    ("arguments", ("common/store/apply.py", "common/idwindow.py", "common/store/scripts.py")),
    ("redis", ("/redis/", "hiredis")),
)
_WAITING = ("recv_into", "recv'", "select", "poll'")


def _group(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    if any(part in function for part in _WAITING):
        return "waiting_on_redis"
    for name, parts in _GROUPS:
        if any(part in where for part in parts):
            return name
    return "other"


def profile_worker(client: redis.Redis, boards_yaml: str, rng: random.Random) -> Result:
    n = env_int("PROFILE_EVENTS", DEFAULT_EVENTS)
    say(f"profile: {n} events in arrays of {ARRAY_SIZE}, parsed and applied under cProfile")
    client.flushall()
    boards = parse_boards(boards_yaml)
    messages = [value for _, value in array_messages(make_events(n, "p", rng), ARRAY_SIZE)]
    applier = Applier(client, boards, "prof:", 3600)
    ceiling = ts_ceiling(86_400)
    profiler = cProfile.Profile()  # wall clock: a CPU-time timer would cost more than the code
    profiler.enable()
    for start in range(0, len(messages), BATCH_MESSAGES):
        pairs = []
        for value in messages[start : start + BATCH_MESSAGES]:
            pairs += [(event, event.ts or 0) for event in parse_message(value, boards, ceiling).events]
        applier.apply_isolated(pairs)
    profiler.disable()
    client.flushall()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # (file, line, fn) -> (cc, nc, tt, ct, callers)
    per_group: dict[str, float] = {}
    rows = []
    for (filename, _, function), (_, calls, own, _, _) in stats.items():
        group = _group(filename, function)
        per_group[group] = per_group.get(group, 0.0) + own
        if group != "waiting_on_redis":
            rows.append((own, f"{filename.rsplit('/', 2)[-1]}:{function}", calls))
    waiting = per_group.pop("waiting_on_redis", 0.0)
    total = sum(per_group.values())
    rows.sort(reverse=True)
    return {
        "events": n,
        "us_per_event": round(1e6 * total / n, 2),
        "us_per_event_by_group": {g: round(1e6 * t / n, 2) for g, t in sorted(per_group.items())},
        "waiting_on_redis_us_per_event": round(1e6 * waiting / n, 2),
        "top": [
            {"function": name, "us_per_event": round(1e6 * own / n, 2), "calls": calls}
            for own, name, calls in rows[:12]
        ],
    }
