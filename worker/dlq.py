"""The dead-letter topic: the original bytes of a bad event, with the reason and where it came from."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, Message, Producer

from common.errors import BadEvent, InfrastructureError
from common.kafka_types import MessageLike

_log = logging.getLogger(__name__)

HEADER_REASON = "rankstream.reason"
HEADER_MESSAGE = "rankstream.message"
HEADER_TOPIC = "rankstream.source.topic"
HEADER_PARTITION = "rankstream.source.partition"
HEADER_OFFSET = "rankstream.source.offset"
HEADER_INDEX = "rankstream.source.index"  # position in a JSON array; absent for a whole message


class DeadLetters:
    """Produces to the dead-letter topic; `flush()` raises unless every record was acknowledged,
    so the caller never commits past a bad event that is not safely stored."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self._producer = producer
        self._topic = topic
        self._failed: list[str] = []
        self._pending = 0

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        self._pending -= 1
        if err is not None:
            self._failed.append(err.str())

    def send(self, msg: MessageLike, bad: BadEvent) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            (HEADER_REASON, bad.reason.encode()),
            (HEADER_MESSAGE, bad.message.encode()),
            (HEADER_TOPIC, (msg.topic() or "").encode()),
            (HEADER_PARTITION, str(msg.partition()).encode()),
            (HEADER_OFFSET, str(msg.offset()).encode()),
        ]
        if bad.index is not None:
            headers.append((HEADER_INDEX, str(bad.index).encode()))
        self._pending += 1
        self._producer.produce(
            self._topic, value=msg.value() or b"", key=msg.key(), headers=headers, on_delivery=self._delivered
        )
        _log.info("dead-lettered", extra={"reason": bad.reason, "offset": msg.offset(), "index": bad.index})

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if failed or self._pending:
            # the batch is rewound and retried: a record may reach the topic twice, never zero times
            raise InfrastructureError(
                f"dead-letter topic: {len(failed)} failed, {self._pending} unacknowledged"
            )
