"""rankstream end to end: one real `rankstream worker` process drains N pre-produced events;
progress is the sum of the boards' `seq` keys in Redis."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis

from bench.common import BenchError, Result, say
from bench.harness.cpu import CpuMeter, cpu_us_per_unit
from bench.harness.kafka import Message
from bench.harness.nodes import partitions_assigned, start_worker
from bench.harness.probes import HOST, http_get
from bench.harness.processes import Child, Children
from bench.harness.stack import Stack
from bench.worker.workload import (
    ARRAY_SIZE,
    BOARDS,
    array_messages,
    fresh_topic,
    make_events,
    single_messages,
)
from common.settings import Settings
from rankstream.stack import free_port

POLL_S = 0.05
STALL_S = 60.0  # no progress for this long = the run failed, not a slow run


@dataclass(frozen=True)
class Progress:
    """Seconds are counted from the worker's spawn."""

    assigned_s: float | None  # its partitions were assigned: from here on it only works
    first_s: float  # the first applied event showed up in Redis: the clock starts
    start_count: int  # applied when the clock started
    done_s: float  # N applied: the clock stops
    cpu_pct: dict[str, float]

    @property
    def elapsed_s(self) -> float:
        return self.done_s - self.first_s

    @property
    def drain_s(self) -> float | None:
        return None if self.assigned_s is None else self.done_s - self.assigned_s


def applied_count(client: redis.Redis, seq_keys: Sequence[str]) -> int:
    values = cast("list[bytes | None]", client.mget(seq_keys))
    return sum(int(v) for v in values if v is not None)


@dataclass(frozen=True)
class WorkerRun:
    """One worker process and what it is measured on. Its settings carry a fresh key prefix
    (so no dedupe record is shared between runs) and a group of its own."""

    n: int
    name: str  # of the process, and of its log
    settings: Settings
    http_port: int
    env: Mapping[str, str] | None = None  # more RANKSTREAM_* settings for the worker

    @property
    def seq_keys(self) -> list[str]:
        return [f"{self.settings.key_prefix}{{gift:room{k}}}:seq" for k in range(BOARDS)]

    def start(self, group: Children) -> Child:
        return start_worker(group, self.name, self.settings, http_port=self.http_port, env=self.env)


def watch(client: redis.Redis, run: WorkerRun, worker: Child, meter: CpuMeter) -> Progress:
    """Poll the applied count every POLL_S. The clock starts at the first poll that sees an
    applied event (start-up and the group join are not throughput) and stops at N. Until
    then /readyz is polled too, to know when the worker got its partitions."""
    seq_keys, n = run.seq_keys, run.n
    spawned = time.monotonic()
    assigned: float | None = None
    first: tuple[float, int] | None = None
    last_count, last_change = 0, spawned
    next_tick = spawned
    while True:
        count, now = applied_count(client, seq_keys), time.monotonic()
        if assigned is None and first is None and partitions_assigned(run.http_port):
            assigned = now
        if first is None and count > 0:
            first = (now, count)
            meter.start()
        if count >= n:
            cpu = meter.stop()
            break
        if count != last_count:
            last_count, last_change = count, now
        elif now - last_change > STALL_S:
            raise BenchError(f"no progress for {STALL_S:.0f}s at {count}/{n}; log: {worker.tail()}")
        if worker.proc.poll() is not None:
            raise BenchError(
                f"the worker exited with {worker.proc.returncode} at {count}/{n}: {worker.tail()}"
            )
        next_tick += POLL_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
    assert first is not None
    if count == first[1]:
        raise BenchError(f"all {n} events were applied before the first poll: too few to measure")
    since = None if assigned is None else assigned - spawned
    return Progress(since, first[0] - spawned, first[1], now - spawned, cpu)


def scrape_metrics(port: int) -> dict[str, float]:
    """The worker's own account of where its time went (from its /metrics)."""
    wanted = {
        "rankstream_worker_apply_seconds_sum": "apply_seconds",
        "rankstream_worker_apply_seconds_count": "batches",
        "rankstream_worker_batch_messages_sum": "messages",
        'rankstream_worker_events_total{outcome="applied"}': "applied_events",
        'rankstream_worker_events_total{outcome="duplicate"}': "duplicate_events",
        "rankstream_worker_batch_retries_total": "retries",
    }
    status, body = http_get(f"http://{HOST}:{port}/metrics", timeout=5)
    if status != 200:
        say(f"worker metrics unavailable: status {status}")
        return {}
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            out[wanted[name]] = float(value)
    return out


def _messages(variant: str, n: int, tag: str, rng: random.Random) -> list[Message]:
    events = make_events(n, tag, rng)
    return single_messages(events) if variant == "single" else array_messages(events, ARRAY_SIZE)


def measure_worker(
    stack: Stack,
    group: Children,
    n: int,
    variant: str,
    rng: random.Random,
    *,
    env: Mapping[str, str] | None = None,
    label: str = "",
) -> Result:
    """One worker process over N fresh events in a fresh topic, group and key prefix; `env`:
    more settings for the worker, `label`: the run's name (default: the variant)."""
    label = label or variant
    tag = f"{label}-{uuid.uuid4().hex[:8]}"
    messages = _messages(variant, n, tag, rng)
    say(f"{label}: producing {n} events in {len(messages)} messages")
    prefix = {"single": "b:", "arrays": "ba:"}.get(label, f"b{label}:")
    settings, produce_rate = fresh_topic(stack, tag, messages, key_prefix=prefix, worker_group=f"bench-{tag}")
    run = WorkerRun(n, f"worker-{label}", settings, free_port(), env)
    worker = run.start(group)
    say(f"{label}: worker pid {worker.pid} draining")
    try:
        meter = CpuMeter({"worker": worker.pid, **stack.pids(), "bench": os.getpid()})
        progress = watch(stack.client, run, worker, meter)
        time.sleep(0.5)  # anything applied twice would show up now
        final = applied_count(stack.client, run.seq_keys)
        metrics = scrape_metrics(run.http_port)
    finally:
        stop_s = group.stop(worker)
    report = _worker_report(n, progress, final, metrics)
    report.update(
        messages=len(messages),
        produce_messages_per_s=round(produce_rate, 1),
        worker_exit_code=worker.proc.returncode,
        worker_stop_s=round(stop_s, 2),
    )
    return report


def _worker_report(n: int, progress: Progress, final: int, metrics: Mapping[str, float]) -> Result:
    measured = n - progress.start_count
    rate = measured / progress.elapsed_s
    worker_metrics: dict[str, float] = dict(metrics)
    if metrics.get("batches"):
        worker_metrics["mean_batch_messages"] = round(metrics.get("messages", 0) / metrics["batches"], 1)
    drain = progress.drain_s
    if "apply_seconds" in metrics and drain:
        # the share of the worker's working time spent inside Applier.apply (building the
        # calls, the Redis round trip, Lua); the rest is consuming, parsing and committing
        worker_metrics["apply_share"] = round(metrics["apply_seconds"] / drain, 3)
    return {
        "events_per_s": round(rate, 1),
        # N / (N applied - partitions assigned): counts the first batch's fetch and parse,
        # which the clock above cannot see (it starts when Redis shows the first event)
        "events_per_s_from_assign": round(n / drain, 1) if drain else None,
        "applied": final,
        "applied_exact": final == n,
        "time_to_assign_s": None if progress.assigned_s is None else round(progress.assigned_s, 2),
        "time_to_first_event_s": round(progress.first_s, 2),
        "measured_events": measured,
        "measured_s": round(progress.elapsed_s, 3),
        "cpu_pct": progress.cpu_pct,
        "cpu_us_per_event": cpu_us_per_unit(progress.cpu_pct, rate),
        "worker_metrics": worker_metrics,
    }
