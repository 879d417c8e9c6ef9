"""The bench's own side of Kafka: quiet clients, a bulk producer of prepared messages (plain,
or held back in one transaction until the caller lets them all out at once), and a paced one."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import Producer

from bench.common import BenchError

# librdkafka's informational lines (e.g. a purged background event when an admin client is
# dropped) would interleave with the tables; warnings and errors still show
QUIET_KAFKA = {"log_level": "4"}
# a producer of the bench's own (fill events, a whole board's backfill) may queue this many
BIG_QUEUE = {"queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000}

Message = tuple[bytes, bytes]  # (key, value)


def _bulk_producer(bootstrap: str, on_delivery: Callable[[Any, Any], None], **extra: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "none",
            **QUIET_KAFKA,
            **BIG_QUEUE,
            "on_delivery": on_delivery,
            **extra,
        }
    )


def _write_all(producer: Producer, topic: str, messages: Sequence[Message], failures: list[str]) -> None:
    """Every message written and acknowledged; BenchError if one was not."""
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:  # local queue full: let librdkafka send some first
                producer.poll(0.1)
    left = producer.flush(120)
    if left or failures:
        raise BenchError(f"producing to {topic}: {left} unsent, {len(failures)} failed {failures[:1]}")


def produce(bootstrap: str, topic: str, messages: Sequence[Message]) -> float:
    """Write every message and wait for all acks; returns messages/s."""
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = _bulk_producer(bootstrap, on_delivery)
    started = time.monotonic()
    _write_all(producer, topic, messages, failures)
    return len(messages) / (time.monotonic() - started)


@contextlib.contextmanager
def produce_held(
    bootstrap: str, topic: str, messages: Sequence[Message], transactional_id: str
) -> Iterator[dict[int, int]]:
    """Every message written inside one Kafka transaction, committed when the block ends
    (aborted if it raises): read_committed consumers (the worker) see all of them at that
    instant and none before, so a drain can be timed from the commit, with the consumers
    already running. Yields per partition the offset a group that consumed them all commits
    (the last message's + 1; the commit marker after it takes an offset of its own)."""
    failures: list[str] = []
    ends: dict[int, int] = {}

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    producer = _bulk_producer(bootstrap, on_delivery, **{"transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    try:
        _write_all(producer, topic, messages, failures)
        yield ends
    except BaseException:
        producer.abort_transaction(30)
        raise
    producer.commit_transaction(60)


@contextlib.contextmanager
def paced(
    bootstrap: str, topic: str, rate: float, make: Callable[[int], Sequence[Message]], step_s: float = 0.05
) -> Iterator[None]:
    """`make(n)`'s n messages produced at `rate` a second, in slices `step_s` apart, while the
    block runs (a thread of its own); BenchError after it if some were not delivered."""
    stop = threading.Event()
    failures: list[str] = []

    def run() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET_KAFKA})
        sent, started = 0, time.monotonic()
        while not stop.is_set():
            due = max(int((time.monotonic() - started) * rate) - sent, 0)
            for key, value in make(due):
                producer.produce(topic, value, key=key)
            sent += due
            producer.poll(0)
            stop.wait(step_s)
        if producer.flush(30):
            failures.append("the paced producer did not deliver everything")

    thread = threading.Thread(target=run, name="paced-producer", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
        if failures:
            raise BenchError(failures[0])
