"""One case of the scale benchmark: `workers` real `rankstream worker` processes in a fresh group,
on a fresh topic and key prefix of one Redis target, timed draining N events.

The workers start on the empty topic and the clock waits until they hold every partition between
them (so neither the group join nor a rebalance between two workers is timed); the events are
then written in one Kafka transaction and the clock starts as it commits: the workers read
read_committed, so all N appear to them at that instant. The clock stops when the group's
committed offsets reach the end of every partition (lag 0): the worker commits a batch's offsets
only after its Redis writes, so by then every event is applied (checked after: the boards' seq
keys sum to N). CPU over exactly that stretch: each process' from /proc (workers, Kafka, the
bench itself, the rest of the box), each Redis node's from its INFO cpu, and
where it went inside Redis (bench/scale/profile.py)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.common import BenchError, Result, say
from bench.harness.cpu import CpuMeter, cpu_us_per_unit
from bench.harness.kafka import QUIET_KAFKA, Message, produce_held
from bench.harness.nodes import WORKER_READY_S, assigned_partitions, start_worker
from bench.harness.processes import Child, Children
from bench.harness.stack import Stack
from bench.scale.profile import profile
from bench.scale.targets import RedisTarget
from bench.worker.drain import STALL_S, scrape_metrics
from common.settings import Settings
from common.store.keys import BoardKeys
from rankstream.stack import free_port
from rankstream.topics import UPDATE_PARTITIONS, ensure_topics

POLL_S = 0.05
SETTLE_S = 1.0  # after the last assignment: the workers' first empty polls are not timed


@dataclass(frozen=True)
class Case:
    name: str  # e.g. "2w_cluster": the suffix of its keys in the report
    workers: int
    target: RedisTarget
    env: Mapping[str, str] = field(default_factory=dict)  # more worker settings (RANKSTREAM_*)


@dataclass
class Workers:
    children: list[Child]
    ports: list[int]  # each one's /readyz and /metrics

    def check_alive(self) -> None:
        for child in self.children:
            child.check_alive()

    def tails(self) -> str:
        return " || ".join(f"{c.name}: {c.tail()}" for c in self.children)


def _start(group: Children, case: Case, settings: Settings) -> Workers:
    ports = [free_port() for _ in range(case.workers)]
    children = [
        start_worker(group, f"{case.name}-w{i}", settings, http_port=port, worker_id=f"w{i}", env=case.env)
        for i, port in enumerate(ports)
    ]
    return Workers(children, ports)


def _wait_spread(workers: Workers) -> float:
    """Until the workers hold every update_rank partition between them, each some; seconds."""
    started = time.monotonic()
    while time.monotonic() - started < WORKER_READY_S:
        workers.check_alive()
        counts = [assigned_partitions(port, timeout=2) for port in workers.ports]
        if sum(counts) == UPDATE_PARTITIONS and all(counts):
            return time.monotonic() - started
        time.sleep(0.1)
    raise BenchError(f"the workers got no partitions within {WORKER_READY_S:.0f}s: {workers.tails()}")


def _wait_drained(settings: Settings, ends: Mapping[int, int], workers: Workers) -> float:
    """Until the group's committed offsets reach `ends` (lag 0); the monotonic time it did."""
    # read_uncommitted: the committed offsets as they stand, without waiting for the workers'
    # open transactions to settle (read_committed would ask the broker for stable offsets)
    watcher = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.worker_group,  # never subscribes: only reads what the group committed
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            **QUIET_KAFKA,
        }
    )
    partitions = [TopicPartition(settings.topic_updates, p) for p in sorted(ends)]
    try:
        last_lag, last_change = -1, time.monotonic()
        while True:
            committed = watcher.committed(partitions, timeout=10)
            now = time.monotonic()
            lag = sum(max(0, ends[tp.partition] - max(tp.offset, 0)) for tp in committed)
            if lag == 0:
                return now
            if lag != last_lag:
                last_lag, last_change = lag, now
            elif now - last_change > STALL_S:
                raise BenchError(f"lag stuck at {lag} for {STALL_S:.0f}s: {workers.tails()}")
            workers.check_alive()
            time.sleep(POLL_S)
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            watcher.close()


def _metrics(workers: Workers, elapsed_s: float) -> dict[str, float]:
    """The workers' own accounts (their /metrics), summed."""
    total: dict[str, float] = {}
    for port in workers.ports:
        for name, value in scrape_metrics(port).items():
            total[name] = total.get(name, 0.0) + value
    if total.get("batches"):
        total["mean_batch_messages"] = round(total.get("messages", 0) / total["batches"], 1)
    if "apply_seconds" in total:
        # the share of the workers' drain time inside Applier.apply (building the calls, the
        # Redis round trips, Lua); the rest is consuming, parsing and committing
        total["apply_share"] = round(total["apply_seconds"] / (elapsed_s * len(workers.ports)), 3)
    return total


def prefix_of(index: int) -> str:
    """The key prefix of the case run with `index`."""
    return f"s{index}:"


def run_case(
    stack: Stack,
    group: Children,
    case: Case,
    messages: Sequence[Message],
    boards: Sequence[str],
    *,
    index: int,
) -> Result:
    """One case over `messages` (single-event, over `boards`), from an empty Redis."""
    n = len(messages)
    tag = f"scale-{case.name}-{uuid.uuid4().hex[:8]}"
    prefix = prefix_of(index)
    target = case.target
    settings = stack.settings(
        tag,
        key_prefix=prefix,
        worker_group=f"bench-{tag}",
        redis_url=target.url,
        redis_cluster=target.cluster,
    )
    ensure_topics(settings)
    target.flush()
    workers = _start(group, case, settings)
    try:
        spread_s = _wait_spread(workers)
        time.sleep(SETTLE_S)
        pids = {f"worker{i}": c.pid for i, c in enumerate(workers.children)}
        meter = CpuMeter({**pids, "kafka": stack.pids()["kafka"], "bench": os.getpid(), **target.pids()})
        say(f"{case.name}: {case.workers} worker(s) hold the partitions; releasing {n} events")
        with produce_held(settings.kafka_bootstrap, settings.topic_updates, messages, f"bench-{tag}") as ends:
            before = target.snapshots()
            meter.start()
            started = time.monotonic()
        done = _wait_drained(settings, ends, workers)
        cpu = meter.stop()
        after = target.snapshots()
        elapsed = done - started
        metrics = _metrics(workers, elapsed)
        target.check_roles()
        applied = target.applied([BoardKeys(prefix, board).seq for board in boards])
    finally:
        stop_s = [group.stop(child) for child in workers.children]
    if applied != n:
        say(f"WARNING: {case.name}: {applied} events applied, expected exactly {n}")
    redis_s = {port: after[port].cpu_s - before[port].cpu_s for port in after}
    report = _report(case, n, elapsed, cpu, redis_s)
    report.update(
        applied=applied,
        applied_exact=applied == n,
        time_to_partitions_s=round(spread_s, 2),
        worker_metrics=metrics,
        worker_exit_codes=[c.proc.returncode for c in workers.children],
        worker_stop_s=[round(s, 2) for s in stop_s],
        redis_profile=profile(before, after, target.roles, n),
    )
    return report


def _report(
    case: Case, n: int, elapsed: float, cpu_pct: Mapping[str, float], redis_s: Mapping[int, float]
) -> Result:
    target = case.target
    rate = n / elapsed
    per_event = cpu_us_per_unit(cpu_pct, rate)  # the processes' view, from /proc
    by_node = {node.label: round(1e6 * redis_s[node.port] / n, 2) for node in target.nodes}
    masters_us = round(sum(by_node[node.label] for node in target.masters), 2)
    replicas_us = round(sum(by_node[node.label] for node in target.replicas), 2) if target.replicas else None
    worker_us = round(sum(v for k, v in per_event.items() if k.startswith("worker")), 2)
    kafka_us = per_event.get("kafka", 0.0)
    ours_us = worker_us + masters_us + (replicas_us or 0.0)
    split = _split(cpu_pct, target)
    return {
        "events_per_s": round(rate, 1),
        "events": n,
        "elapsed_s": round(elapsed, 3),
        "workers": case.workers,
        "redis": target.name,
        "worker_env": dict(case.env),
        "redis_us_per_event": masters_us,
        "redis_replica_us_per_event": replicas_us,
        "redis_us_per_event_by_node": by_node,
        "worker_us_per_event": worker_us,
        "kafka_us_per_event": kafka_us,
        "bench_us_per_event": per_event.get("bench", 0.0),
        # events per second of one core spent by the workers and Redis (replicas too), and
        # with the broker's CPU as well
        "events_per_cpu_s": round(1e6 / ours_us, 1) if ours_us > 0 else None,
        "events_per_cpu_s_with_kafka": round(1e6 / (ours_us + kafka_us), 1) if ours_us > 0 else None,
        **split,
        # events/s for each core the box was busy with (everything on it, the bench included)
        "events_per_s_per_busy_core": round(rate / split["cores_busy"], 1) if split["cores_busy"] else None,
        "cpu_pct": dict(cpu_pct),
    }


def _split(cpu_pct: Mapping[str, float], target: RedisTarget) -> Result:
    """Where the box's CPU went while the case ran: shares of everything busy, by part."""
    parts = {
        "worker": sum(v for k, v in cpu_pct.items() if k.startswith("worker")),
        "redis_masters": sum(cpu_pct.get(node.label, 0.0) for node in target.masters),
        "redis_replicas": sum(cpu_pct.get(node.label, 0.0) for node in target.replicas),
        "kafka": cpu_pct.get("kafka", 0.0),
        "bench": cpu_pct.get("bench", 0.0),
        "others": cpu_pct.get("others", 0.0),
    }
    busy = sum(parts.values())
    shares = {k: round(100 * v / busy, 1) if busy > 0 else 0.0 for k, v in parts.items()}
    cores = os.cpu_count() or 1
    machine = cpu_pct.get("machine")
    replicas = f" (+ replicas {shares['redis_replicas']:.0f}%)" if target.replicas else ""
    return {
        "cpu_split_pct": shares,
        "cores_busy": None if machine is None else round(machine / 100 * cores, 2),
        "where_cpu_goes": (
            f"workers {shares['worker']:.0f}%, redis {shares['redis_masters']:.0f}%{replicas}, "
            f"kafka {shares['kafka']:.0f}%, bench {shares['bench']:.0f}%, others {shares['others']:.0f}%"
            + ("" if machine is None else f"; box {machine:.0f}% busy")
        ),
    }
