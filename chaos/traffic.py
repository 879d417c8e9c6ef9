"""Producing the stream at a steady rate, and reading topics back whole."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from chaos.stream import Planned


class Pacer(threading.Thread):
    """Produces `plan` at `rate` events a second in a thread (the Kafka timestamp is the clock's
    when each message is built); librdkafka retries what a broker outage held up."""

    def __init__(self, bootstrap: str, topic: str, plan: Iterator[Planned], rate: float) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.topic, self.plan, self.rate = topic, plan, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 2_097_152,
                                  "message.timeout.ms": 600_000})  # fmt: skip
        self.sent = 0
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
            now = int(time.time() * 1000)
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


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_topic(bootstrap: str, topic: str, committed_only: bool = True) -> list[Record]:
    """Every record of `topic` up to each partition's end now, in partition order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted",
                         "enable.partition.eof": True, "fetch.message.max.bytes": 4_194_304})  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = sorted(metadata.partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
        wanted = [p for p in partitions if ends[p] > 0]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted])
        records: list[Record] = []
        done: set[int] = set()
        deadline = time.monotonic() + 300
        while len(done) < len(wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                done.add(cast(int, msg.partition()))
                continue
            partition, offset = cast(int, msg.partition()), cast(int, msg.offset())
            pairs = cast(list[tuple[str, bytes | None]], msg.headers() or [])
            headers = {k: v or b"" for k, v in pairs}
            records.append(Record(partition, offset, msg.timestamp()[1], msg.key(), msg.value(), headers))
            if offset >= ends[partition] - 1:
                done.add(partition)
        return records
    finally:
        consumer.close()
