"""Produce → visible in an API node's memory: with a real worker and the hot API running,
events produced at a steady rate, each a new member that outranks all others; per event, when
update_rank had it, when Redis had it (worker applied), when update_cache had it (worker
published), when the API served it on top."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import orjson
import redis
from confluent_kafka import Producer

from bench.common import BenchError, Result, env_int, say
from bench.harness.cpu import CpuMeter
from bench.harness.kafka import QUIET_KAFKA
from bench.harness.nodes import start_worker, wait_assigned
from bench.harness.processes import Child, Children
from bench.harness.stack import Stack
from bench.harness.stats import percentile
from bench.hot.board import BOARD
from bench.hot.watchers import SeqPoller, TopicWatcher, TopPoller, Watcher, cache_index, event_index
from common.cache_records import partition_for
from common.settings import Settings
from rankstream.stack import free_port
from rankstream.topics import CACHE_PARTITIONS

DEFAULT_VIS_RATE = 500
DEFAULT_VIS_S = 10
VIS_LINGER_MS = 5
VIS_SCORE = 10**12  # above every filled score: each visibility event takes rank 1
VIS_WAIT_S = 10.0  # after the last event, how long the poller may wait for it
WARM_UP_TIMEOUT_S = 30.0


def _warm_up(producer: Producer, settings: Settings, client: redis.Redis, seq_key: str) -> int:
    """A first event (scored low: it never ranks first) opens connections end to end; the
    board's seq before it."""
    seq0 = int(client.get(seq_key) or 0)
    warm = {"id": "vis-warm", "board": BOARD, "member": "w0", "op": "set", "score": 1}
    producer.produce(settings.topic_updates, orjson.dumps(warm), key=BOARD.encode())
    producer.flush(30)
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    while int(client.get(seq_key) or 0) < seq0 + 1:
        if time.monotonic() > deadline:
            raise BenchError(f"visibility: the warm-up event was not applied within {WARM_UP_TIMEOUT_S:.0f}s")
        time.sleep(0.02)
    return seq0


def stage_latencies(produced: Sequence[float], seen_at: dict[int, float]) -> list[float]:
    """ms from produce to first seen, for the events seen (in order, so none is skipped)."""
    return sorted((seen_at[i] - t) * 1000 for i, t in enumerate(produced) if i in seen_at)


def by_second(produced: Sequence[float], seen_at: dict[int, float], start: float) -> list[list[float]]:
    """[p50, max] ms of the events produced in each second of the run: when the slow ones were."""
    buckets: dict[int, list[float]] = {}
    for i, t in enumerate(produced):
        if i in seen_at:
            buckets.setdefault(int(t - start), []).append((seen_at[i] - t) * 1000)
    return [[round(percentile(sorted(v), 0.5), 1), round(max(v), 1)] for _, v in sorted(buckets.items())]


def _stats(values: Sequence[float]) -> Result:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.50), 2),
        "p90_ms": round(percentile(values, 0.90), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(values[-1], 2),
    }


def visibility(group: Children, stack: Stack, settings: Settings, api: Child, base: str) -> Result:
    """Events at a steady rate, each a new member ranked first; per event, when Redis had it
    (worker applied), when update_cache had it (worker published), when the API served it."""
    rate = env_int("VIS_RATE", DEFAULT_VIS_RATE)
    seconds = env_int("VIS_S", DEFAULT_VIS_S)
    n = rate * seconds
    port = free_port()
    worker = start_worker(group, "worker", settings, http_port=port)
    assigned_s = wait_assigned(worker, port)
    say(f"visibility: worker assigned in {assigned_s:.1f} s; {n} events at {rate}/s")
    # the clock starts at produce(): a producer's usual linger (5 ms, as the worker's) counts;
    # linger 0 would cost the broker one request per event on a box it shares with the rest
    conf = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "linger.ms": VIS_LINGER_MS,
        "enable.idempotence": True,
    }
    producer = Producer({**conf, **QUIET_KAFKA})
    key = BOARD.encode()
    seq_key = f"{settings.key_prefix}{{{BOARD}}}:seq"
    seq0 = _warm_up(producer, settings, stack.client, seq_key)
    seq_client = redis.Redis(port=stack.redis_server.port, socket_timeout=5)
    watchers: dict[str, Watcher] = {
        # fetches that wait 10 ms for data (up to 10 ms late) rather than one per event: the
        # broker shares this box with what is measured
        "update_rank": TopicWatcher(
            settings,
            settings.topic_updates,
            event_index,
            conf={"fetch.wait.max.ms": 10, "fetch.min.bytes": 10**7},
        ),
        "redis": SeqPoller(seq_client, seq_key, seq0 + 1),
        "update_cache": TopicWatcher(
            settings, settings.topic_cache, cache_index, [partition_for(BOARD, CACHE_PARTITIONS)]
        ),
        "api": TopPoller(base),
    }
    meter = CpuMeter({"worker": worker.pid, "api": api.pid, "bench": os.getpid(), **stack.pids()})
    produced = [0.0] * n
    for watcher in watchers.values():
        watcher.start()
    try:
        time.sleep(0.3)
        meter.start()
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            event = {"id": f"vis-{i}", "board": BOARD, "member": f"v{i}", "op": "set",
                     "score": VIS_SCORE + i, "ts": int(time.time() * 1000)}  # fmt: skip
            produced[i] = time.monotonic()
            producer.produce(settings.topic_updates, orjson.dumps(event), key=key)
            producer.poll(0)
        produce_s = time.monotonic() - start
        if producer.flush(30):
            raise BenchError("visibility: events not acknowledged by Kafka")
        deadline = time.monotonic() + VIS_WAIT_S
        while watchers["api"].highest < n - 1 and time.monotonic() < deadline:
            worker.check_alive()
            time.sleep(0.05)
        cpu = meter.stop()
    finally:
        for watcher in watchers.values():
            watcher.stop()
        seq_client.close()
    for name, watcher in watchers.items():
        if watcher.errors:
            say(f"visibility: {name}: {len(watcher.errors)} errors, e.g. {watcher.errors[0]}")
    stages = {name: _stats(stage_latencies(produced, w.seen_at)) for name, w in watchers.items()}
    api_stage = stages["api"]
    if api_stage["n"] < 0.99 * n:
        raise BenchError(f"visibility: only {api_stage['n']} of {n} events became visible; {worker.tail()}")
    poller = watchers["api"]
    assert isinstance(poller, TopPoller)
    return {
        "events": n,
        "rate": rate,
        "produce_s": round(produce_s, 3),
        "observed": len(poller.direct),  # seen on top themselves
        "resolved": api_stage["n"],  # visible (themselves, or a later event on top)
        **{k: v for k, v in api_stage.items() if k != "n"},
        "stages": stages,
        "by_second": {name: by_second(produced, watchers[name].seen_at, start) for name in ("redis", "api")},
        "polls": poller.steps,
        "worker_assigned_s": round(assigned_s, 2),
        "cpu_pct": cpu,
    }
