"""The seed design the worker is measured against (one Lua call per event: msgId dedupe, then
ZINCRBY per window), two ways: at Redis' own ceiling, driven by redis-benchmark with no Python
and no Kafka at all; and as a plain Python consumer would run it, one message per poll, one
script call per event, one synchronous commit per message."""

from __future__ import annotations

import contextlib
import csv
import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson
import redis
from confluent_kafka import Consumer, KafkaException

from bench.common import BenchError, Result, say
from bench.harness.cpu import CpuMeter, cpu_us_per_unit, run_tool
from bench.harness.kafka import QUIET_KAFKA
from bench.harness.stack import Stack
from bench.worker.drain import STALL_S
from bench.worker.workload import MEMBERS, WINDOWS, fresh_topic, make_events, single_messages

SEED_SCRIPT = Path(__file__).resolve().parent.parent / "lua" / "seed_update.lua"
SEED_REQUESTS = 300_000
SEED_CLIENTS = 50
DEDUPE_TTL_S = 7 * 24 * 3600  # the seed design's msgId dedupe record (the naive and ceiling runs)
SEED_ROOM = "s:{gift:room1}"


def _load_seed_script(client: redis.Redis) -> str:
    return client.script_load(SEED_SCRIPT.read_text(encoding="utf-8"))


# --- at Redis' own ceiling --------------------------------------------------------------------


def redis_benchmark() -> str:
    found = shutil.which("redis-benchmark")
    if found is None:
        raise BenchError("redis-benchmark not found: apt-get install -y redis-tools")
    return found


def seed_benchmark_argv(port: int, sha: str, requests: int, clients: int) -> list[str]:
    """redis-benchmark replaces EVERY `__rand_int__` with its own random 12-digit number in
    [0, -r). With -r MEMBERS the member matches the rankstream run's member count; the event id
    takes two of them side by side, so ids stay unique (MEMBERS^2 = 4e8 values) while members
    repeat. One fixed board: a single Redis does not care which slot a key hashes to."""
    keys = [f"{SEED_ROOM}:id:__rand_int____rand_int__", *(f"{SEED_ROOM}:{w}" for w in WINDOWS)]
    argv = [redis_benchmark(), "-h", "127.0.0.1", "-p", str(port), "-n", str(requests)]
    argv += ["-c", str(clients), "-r", str(MEMBERS), "--csv"]
    return [*argv, "EVALSHA", sha, str(len(keys)), *keys, "u__rand_int__", "1", str(DEDUPE_TTL_S)]


def parse_rps(csv_text: str) -> float:
    """requests/s from redis-benchmark --csv: a header row naming "rps", then one row per test."""
    rows = [r for r in csv.reader(csv_text.splitlines()) if r]
    if len(rows) < 2 or "rps" not in rows[0]:
        raise BenchError(f"unexpected redis-benchmark output: {csv_text.strip()[:200]!r}")
    column = rows[0].index("rps")
    return float(rows[-1][column])


def _seed_sanity(client: redis.Redis, requests: int) -> dict[str, int]:
    """redis-benchmark counts error replies as requests: prove the script really ran."""
    ids = client.dbsize() - len(WINDOWS)
    pairs = cast("list[tuple[bytes, float]]", client.zrange(f"{SEED_ROOM}:total", 0, -1, withscores=True))
    increments = int(sum(score for _, score in pairs))
    if ids < 0.99 * requests or increments != ids:
        raise BenchError(
            f"seed ceiling run is not trustworthy: {requests} calls, {ids} ids, {increments} incr"
        )
    return {"new_ids": ids, "members": len(pairs)}


def measure_seed_ceiling(stack: Stack, requests: int = SEED_REQUESTS, clients: int = SEED_CLIENTS) -> Result:
    stack.client.flushall()
    argv = seed_benchmark_argv(stack.redis_server.port, _load_seed_script(stack.client), requests, clients)
    say(f"seed ceiling: redis-benchmark -n {requests} -c {clients}")
    run = run_tool("redis_benchmark", argv, stack.pids(), timeout=600)
    if run.returncode != 0:
        raise BenchError(f"redis-benchmark exited with {run.returncode}: {run.stderr.strip()[-200:]}")
    rps = parse_rps(run.stdout)
    return {
        "events_per_s": round(rps, 1),
        "requests": requests,
        "clients": clients,
        "wall_s": round(run.wall_s, 2),
        "cpu_pct": run.cpu_pct,
        "cpu_us_per_event": cpu_us_per_unit(run.cpu_pct, rps),
        **_seed_sanity(stack.client, requests),
        "command": " ".join(argv[1:]),
    }


# --- as a naive Python consumer ---------------------------------------------------------------


def _apply_naive(client: redis.Redis, sha: str, value: bytes) -> int:
    event = orjson.loads(value)
    tag = f"s:{{{event['board']}}}"
    keys = [f"{tag}:id:{event['id']}", *(f"{tag}:{w}" for w in WINDOWS)]
    args = [event["member"], event["score"], DEDUPE_TTL_S]
    return cast("int", client.evalsha(sha, len(keys), *keys, *args))


@dataclass
class NaiveStats:
    """Where the naive consumer's wall time goes, summed over the measured messages."""

    elapsed_s: float = 0.0
    applied: int = 0
    poll_s: float = 0.0
    apply_s: float = 0.0
    commit_s: float = 0.0

    def per_event_ms(self, n: int) -> dict[str, float]:
        return {
            "poll": round(1000 * self.poll_s / n, 3),
            "apply": round(1000 * self.apply_s / n, 3),
            "commit": round(1000 * self.commit_s / n, 3),
        }


def naive_consume(consumer: Consumer, client: redis.Redis, sha: str, n: int) -> NaiveStats:
    """Poll one message, apply it, commit it synchronously, repeat. The clock runs from the
    first message to the last commit (the group join is not throughput)."""
    stats = NaiveStats()
    started: float | None = None
    seen = 0
    idle_since = time.monotonic()
    while seen < n:
        t0 = time.perf_counter()
        msg = consumer.poll(1.0)
        t1 = time.perf_counter()
        if msg is None:
            if time.monotonic() - idle_since > STALL_S:
                raise BenchError(f"naive consumer: no message for {STALL_S:.0f}s at {seen}/{n}")
            continue
        if msg.error() is not None:
            continue  # e.g. partition EOF: not an event
        if started is None:
            started = time.monotonic()
        else:
            stats.poll_s += t1 - t0
        stats.applied += _apply_naive(client, sha, msg.value() or b"")
        t2 = time.perf_counter()
        consumer.commit(message=msg, asynchronous=False)
        t3 = time.perf_counter()
        stats.apply_s += t2 - t1
        stats.commit_s += t3 - t2
        seen += 1
        idle_since = time.monotonic()
    assert started is not None
    stats.elapsed_s = time.monotonic() - started
    return stats


def measure_naive(stack: Stack, n: int, rng: random.Random) -> Result:
    tag = f"naive-{uuid.uuid4().hex[:8]}"
    settings, _ = fresh_topic(stack, tag, single_messages(make_events(n, tag, rng)))
    sha = _load_seed_script(stack.client)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"bench-{tag}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **QUIET_KAFKA,
        }
    )
    say(f"naive: consuming {n} events one by one")
    meter = CpuMeter({"bench": os.getpid(), **stack.pids()})
    try:
        consumer.subscribe([settings.topic_updates])
        meter.start()  # includes the group join, which the clock below does not
        stats = naive_consume(consumer, stack.client, sha, n)
        cpu = meter.stop()
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()
    if stats.applied != n:
        raise BenchError(f"naive consumer applied {stats.applied} of {n} events")
    return {
        "events_per_s": round(n / stats.elapsed_s, 1),
        "events": n,
        "elapsed_s": round(stats.elapsed_s, 2),
        "per_event_ms": stats.per_event_ms(n),
        "cpu_pct": cpu,
    }
