"""What exactly-once costs in Redis memory, measured with Redis' own INFO (part of `bench worker`).

One real worker ingests, through Kafka, N events with distinct ids into ONE board (so the board
holds N ids in its id window), as arrays of 100 from the six partitions. Then, on the quiet Redis,
the id window's keys are deleted and the drop of `used_memory` divided by N is
`redis_bytes_per_event_id`; the same for the boards' fences (`redis_bytes_per_fence`, one per
board, holding one field per source partition) over the 200 boards the throughput runs wrote.
Knob: RANKSTREAM_BENCH_ID_EVENTS (N, default 120000).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterable
from typing import cast

import redis

from bench.common import Result, env_int, say
from bench.harness.cpu import CpuMeter
from bench.harness.processes import Children
from bench.harness.stack import Stack
from bench.worker.drain import WorkerRun, watch
from bench.worker.workload import ARRAY_SIZE, array_messages, fresh_topic, make_events
from rankstream.stack import free_port

DEFAULT_ID_EVENTS = 120_000
BOARD = "gift:room0"


def used_memory(client: redis.Redis) -> int:
    return int(cast("dict[str, int]", client.info("memory"))["used_memory"])


def memory_usage(client: redis.Redis, keys: Iterable[bytes | str]) -> int:
    """The keys' bytes by Redis' own MEMORY USAGE, every element counted (SAMPLES 0)."""
    names = list(keys)
    total = 0
    for start in range(0, len(names), 1000):
        pipe = client.pipeline(transaction=False)
        for name in names[start : start + 1000]:
            pipe.memory_usage(name, samples=0)
        total += sum(int(n or 0) for n in pipe.execute())
    return total


def freed_by_deleting(client: redis.Redis, keys: Iterable[bytes]) -> int:
    """Bytes of `used_memory` the keys held: the drop when they are deleted."""
    names = list(keys)
    before = used_memory(client)
    for start in range(0, len(names), 1000):
        client.delete(*names[start : start + 1000])
    return before - used_memory(client)


def fence_bytes(client: redis.Redis, prefix: str) -> Result:
    """Per fence (one per board that was written), from the boards a throughput run left."""
    fences = list(client.scan_iter(match=f"{prefix}{{*}}:fence", count=10_000))
    fields = sum(int(client.hlen(k)) - 1 for k in fences)  # less the epoch field
    freed = freed_by_deleting(client, fences)
    return {
        "fences": len(fences),
        "source_fields": fields,
        "bytes": freed,
        "bytes_per_fence": round(freed / max(1, len(fences)), 1),
    }


def measure_id_memory(stack: Stack, group: Children, rng: random.Random) -> Result:
    n = env_int("ID_EVENTS", DEFAULT_ID_EVENTS)
    tag = f"ids-{uuid.uuid4().hex[:8]}"
    events = [dict(e, board=BOARD) for e in make_events(n, tag, rng)]
    say(f"ids: producing {n} events with distinct ids into one board")
    settings, _ = fresh_topic(
        stack, tag, array_messages(events, ARRAY_SIZE), key_prefix="bi:", worker_group=f"bench-{tag}"
    )
    run = WorkerRun(n, "worker-ids", settings, free_port())
    worker = run.start(group)
    try:
        watch(stack.client, run, worker, CpuMeter({"worker": worker.pid, "bench": os.getpid()}))
    finally:
        group.stop(worker)
    time.sleep(0.5)
    window = f"{settings.key_prefix}{{{BOARD}}}:i"
    keys = [window.encode(), *stack.client.scan_iter(match=f"{window}:*", count=10_000)]
    buckets = len(keys) - 1
    freed = freed_by_deleting(stack.client, keys)
    return {
        "ids": n,
        "buckets": buckets,
        "ids_per_bucket": round(n / max(1, buckets), 1),
        "bytes": freed,
        "bytes_per_event_id": round(freed / n, 2),
    }
