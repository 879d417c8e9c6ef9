"""The bench's own side of Kafka: quiet clients, and a bulk producer of prepared messages."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Producer

from bench.common import BenchError

# librdkafka's informational lines (e.g. a purged background event when an admin client is
# dropped) would interleave with the tables; warnings and errors still show
QUIET_KAFKA = {"log_level": "4"}
# a producer of the bench's own (fill events, a whole board's backfill) may queue this many
BIG_QUEUE = {"queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000}

Message = tuple[bytes, bytes]  # (key, value)


def produce(bootstrap: str, topic: str, messages: Sequence[Message]) -> float:
    """Write every message and wait for all acks; returns messages/s."""
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "none",
            **QUIET_KAFKA,
            **BIG_QUEUE,
            "on_delivery": on_delivery,
        }
    )
    started = time.monotonic()
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
    return len(messages) / (time.monotonic() - started)
