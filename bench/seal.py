"""What period results cost the write path (worker/apply.py, apply.lua): Redis CPU per event on a
type that declares `period_results` against the same type without, in one run on one private Redis.

A declared window's instances carry the SEAL flag: apply.lua GETs the period's marker once per call
and each event's reply carries one more field; the first event of each (board, period) also adds
the period to `{results}:due` (one ZADD, once per process). ROUNDS interleaved rounds apply EVENTS
incr events over BOARDS boards of each type (`[total, hour, day]`; results for hour and day), in
batches as the worker sends them, from one client; Redis' own `used_cpu_user + used_cpu_sys` per
event (`redis_us_per_event`), and `MEMORY USAGE` per due period (`bytes_per_result`:
its `{results}:due` entry, what a period holds until its result is sent; its marker, written when
it is sealed, replaces nothing and expires with the period).
Goal: `seal_cost_ratio` (declared / plain Redis CPU per event) <= 1.05.
Knobs: RANKSTREAM_BENCH_SEAL_EVENTS (200000), _BOARDS (500), _ROUNDS (4).
"""

from __future__ import annotations

import random
import time

import redis

from bench.common import REPO, Result, env_int, say
from bench.harness.report import Row, header, met
from bench.harness.stats import ratio
from bench.redis_cost import redis_cpu_s
from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.keys import results_due
from rankstream.stack import LocalRedis, free_port
from worker.apply import Applier

FOLDER = REPO / ".stack" / "bench-seal"
PREFIX, BATCH, MEMBERS = "seal:", 5000, 2000
BOARDS = parse_boards(
    "types:\n"
    "  declared: {windows: [total, hour, day], period_results: {windows: [hour, day], top: 100}}\n"
    "  plain: {windows: [total, hour, day]}\n"
)
GOALS = {"seal_cost_ratio": 1.05}
PER_EVENT = [Row(f"{t}.redis_us_per_event") for t in ("declared", "plain")]
ROWS = [Row("seal_cost_ratio", "seal_cost_ratio", at_most=True), *PER_EVENT, Row("bytes_per_result")]


def _round(applier: Applier, type_name: str, n: int, boards: int, *, rng: random.Random, now: int) -> float:
    """Redis CPU seconds for `n` incr events of `type_name` over `boards` boards."""
    client = applier._client
    before = redis_cpu_s(client)
    for start in range(0, n, BATCH):
        batch = []
        for i in range(start, min(start + BATCH, n)):
            board = f"{type_name}:b{rng.randrange(boards)}"
            member = f"m{rng.randrange(MEMBERS)}"
            batch.append(
                (UpdateEvent(f"{type_name}{i}", board, type_name, member, Op.INCR, 1.0, now, None), now)
            )
        applier.apply(batch)
    return redis_cpu_s(client) - before


def run() -> Result:
    n, boards, rounds, head = (
        env_int("SEAL_EVENTS", 200_000),
        env_int("SEAL_BOARDS", 500),
        env_int("SEAL_ROUNDS", 4),
        header(),
    )
    began, now = time.monotonic(), int(time.time() * 1000)
    server = LocalRedis("redis", FOLDER / "redis", port=free_port())
    server.start()
    client = redis.Redis(port=server.port, socket_timeout=120)
    try:
        applier = Applier(client, BOARDS, PREFIX, 3600, now_ms=lambda: now, epoch="bench")
        rng = random.Random(20261123)
        cpu = {"declared": 0.0, "plain": 0.0}
        for k in range(rounds):
            say(f"round {k + 1}/{rounds}: {n // rounds} events on each type")
            for type_name in ("declared", "plain") if k % 2 == 0 else ("plain", "declared"):
                cpu[type_name] += _round(applier, type_name, n // rounds, boards, rng=rng, now=now)
        due = int(client.zcard(results_due(PREFIX)))
        held = int(client.memory_usage(results_due(PREFIX), samples=0) or 0)
    finally:
        client.close()
        server.stop()
    per_event = {t: {"redis_us_per_event": round(cpu[t] / (n // rounds * rounds) * 1e6, 2)} for t in cpu}
    values = {"seal_cost_ratio": ratio(per_event["declared"]["redis_us_per_event"],
                                       per_event["plain"]["redis_us_per_event"])}  # fmt: skip
    return {
        **values, **per_event, "results_due": due, "bytes_per_result": round(held / max(due, 1), 1),
        "events": n, "boards": boards, "rounds": rounds, "goals": GOALS, **head,
        "met": met(values, GOALS, at_most=tuple(GOALS)), "duration_s": round(time.monotonic() - began, 1),
    }  # fmt: skip
