"""How a hot board gets into an API node's memory: the worker's backfill of its state into
update_cache, then an API node's replay of it up to /readyz."""

from __future__ import annotations

import math
import time
from typing import Any

from confluent_kafka import Producer

from bench.common import BenchError, Result, say
from bench.harness.kafka import BIG_QUEUE
from bench.harness.nodes import check_top, start_api
from bench.harness.probes import get_json, wait_ready
from bench.harness.processes import Child, Children
from bench.harness.stack import Stack
from bench.hot.board import BOARD
from common.boards import BoardsConfig
from common.clients import kafka_producer
from common.settings import Settings
from rankstream.topics import ensure_topics
from worker.main import cache_publisher

BACKFILL_TIMEOUT_S = 300.0


def worker_producer(settings: Settings, **extra: Any) -> Producer:
    """The producer `rankstream worker` publishes update_cache with (worker/main.py build_loop)."""
    return kafka_producer(
        settings, {"enable.idempotence": True, "acks": "all", **extra}, defaults={"linger.ms": 5}
    )


def backfill(stack: Stack, settings: Settings, boards: BoardsConfig) -> tuple[Settings, Result]:
    """cache_publisher() as a starting worker calls it, then flush. If the worker's own producer
    cannot take the board (a BufferError: its local queue is full), that is reported and the
    backfill is redone into a fresh update_cache topic with a producer whose queue holds it all,
    so the rest of the benchmark still runs; the settings returned name the topic used."""
    result: Result = {}
    producer = worker_producer(settings)
    started = time.monotonic()
    try:
        publisher = cache_publisher(settings, boards, producer, stack.client)
    except BufferError as exc:
        queued = len(producer)
        result["worker_producer_error"] = f"BufferError: {exc} (after {time.monotonic() - started:.1f} s)"
        say(f"backfill with the worker's producer FAILED: {exc}; {queued} records were queued")
        producer.purge()
        producer.flush(10)
        settings = settings.model_copy(update={"topic_cache": settings.topic_cache + ".retry"})
        ensure_topics(settings)
        producer = worker_producer(settings, **BIG_QUEUE)
        result["workaround"] = "a fresh update_cache topic and queue.buffering.max.messages=2000000"
        started = time.monotonic()
        publisher = cache_publisher(settings, boards, producer, stack.client)
    left = producer.flush(BACKFILL_TIMEOUT_S)
    elapsed = time.monotonic() - started
    if left:
        raise BenchError(f"backfill: {left} records not acknowledged")
    flag = stack.client.get(f"{settings.key_prefix}{{{BOARD}}}:hot")
    if flag is None:
        raise BenchError("backfill: the board's hot flag was not set")
    result.update(
        records=publisher.published,
        backfill_s=round(elapsed, 2),
        records_per_s=round(publisher.published / elapsed, 1),
        topic=settings.topic_cache,
    )
    return settings, result


def replay(group: Children, settings: Settings, members: int) -> tuple[Child, str, Result]:
    """A real `rankstream api` process with the hot board, from spawn to /readyz 200 (polled
    every 20 ms); its top 10 must come from memory."""
    started = time.monotonic()
    api, base = start_api(group, "api-hot", settings)
    _, status = wait_ready(api, f"{base}/readyz", poll_s=0.02)
    ready_s = time.monotonic() - started
    board = status["boards"][BOARD]
    replayed, after = int(board["records_replayed"]), float(status["ready_after_s"])
    check_top(get_json(f"{base}/v1/boards/{BOARD}/top?limit=10"), "memory", members)
    say(f"hot API ready in {ready_s:.2f} s ({replayed:,} records, ready_after_s {after:.2f})")
    return (
        api,
        base,
        {
            "ready_s": round(ready_s, 3),
            "ready_after_s": round(after, 3),
            "records_replayed": replayed,
            "replay_records_per_s": round(replayed / after, 1) if after > 0 else math.nan,
            "replay_records_per_s_from_spawn": round(replayed / ready_s, 1),
            "readyz": status,
        },
    )
