"""Producing the stream at a steady rate, and reading topics back whole."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from chaos.config import soak_member
from chaos.servers import ApiNode
from chaos.stream import Planned


class Pacer(threading.Thread):
    """Produces `plan` at `rate` messages a second in a thread (the Kafka timestamp is the clock's
    when each message is built); librdkafka retries what a broker outage held up."""

    def __init__(self, bootstrap: str, topic: str, plan: Iterator[Planned], rate: float) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.topic, self.plan, self.rate = topic, plan, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 2_097_152,
                                  "message.timeout.ms": 600_000})  # fmt: skip
        self.sent = 0
        self.last_ms = 0  # the Kafka timestamp of the last message produced
        self.failed: list[str] = []
        self.stopping = threading.Event()

    def _report(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))

    def run(self) -> None:
        began = time.monotonic()
        for planned in self.plan:
            if self.stopping.is_set():
                break
            ahead = self.sent / self.rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
            now = self.last_ms = int(time.time() * 1000)
            value = planned.build(now)
            while True:
                try:
                    self.producer.produce(self.topic, value, planned.key.encode(), headers=planned.headers(),
                                          timestamp=now, on_delivery=self._report)  # fmt: skip
                    break
                except BufferError:  # the queue is full while the broker is away
                    self.producer.poll(0.5)
            self.producer.poll(0)
            self.sent += 1
        self.producer.flush(600)

    def finish(self, timeout: float = 900) -> None:
        self.join(timeout)
        if self.is_alive():
            raise TimeoutError("the producer did not finish")
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} messages were not delivered: {self.failed[:3]}")


class Reads(threading.Thread):
    """Reads at `per_s` a second over the API nodes in turn while the stream flows: a board's top
    page, a member, a member's neighbours. Counts the answers by status."""

    def __init__(
        self, nodes: list[ApiNode], boards: list[str], members: int, per_s: float, seed: int
    ) -> None:
        super().__init__(name="chaos-reads", daemon=True)
        self.nodes, self.boards, self.members, self.per_s = nodes, boards, members, per_s
        self.rng = random.Random(seed)
        self.statuses: Counter[int] = Counter()
        self.stopping = threading.Event()

    def path(self) -> str:
        board, member = self.rng.choice(self.boards), soak_member(self.rng.randrange(self.members))
        return self.rng.choice([f"/v1/boards/{board}/top?limit=10", f"/v1/boards/{board}/top?window=day&limit=10",
                                f"/v1/boards/{board}/members/{member}", f"/v1/boards/{board}/members/{member}/around?n=3"])  # fmt: skip

    def run(self) -> None:
        began, done = time.monotonic(), 0
        while not self.stopping.is_set():
            node = self.nodes[done % len(self.nodes)]
            self.statuses[node.get(self.path())[0]] += 1
            done += 1
            self.stopping.wait(max(0.0, done / self.per_s - (time.monotonic() - began)))

    def stop(self) -> Counter[int]:
        self.stopping.set()
        self.join(60)
        return self.statuses


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_topic(bootstrap: str, topic: str, committed_only: bool = True) -> Iterator[Record]:
    """Every record of `topic` up to each partition's end now: one partition after another, each
    in offset order. Yielded as read, so a long stream is never held whole (a soak's stream with
    its megabyte-long bad messages is far larger than this machine's memory)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted",
                         "enable.partition.eof": True, "fetch.message.max.bytes": 4_194_304,
                         "queued.max.messages.kbytes": 32_768})  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        for p in sorted(metadata.partitions):
            end = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            if end > 0:
                yield from _partition(consumer, topic, p, end)
    finally:
        consumer.close()


def _partition(consumer: Consumer, topic: str, partition: int, end: int) -> Iterator[Record]:
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    deadline = time.monotonic() + 300  # without a record
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {topic} [{partition}]")
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(err)
            return
        offset = cast(int, msg.offset())
        pairs = cast(list[tuple[str, bytes | None]], msg.headers() or [])
        headers = {k: v or b"" for k, v in pairs}
        yield Record(partition, offset, msg.timestamp()[1], msg.key(), msg.value(), headers)
        if offset >= end - 1:
            return
        deadline = time.monotonic() + 300
