"""The dead-letter topic: the original bytes of a bad event, with the reason and where it came from."""

from __future__ import annotations

import logging

from confluent_kafka import Producer

from common.errors import BadEvent
from common.kafka_types import MessageLike
from worker.delivery import Deliveries

_log = logging.getLogger(__name__)

HEADER_REASON = "rankstream.reason"
HEADER_MESSAGE = "rankstream.message"
HEADER_TOPIC = "rankstream.source.topic"
HEADER_PARTITION = "rankstream.source.partition"
HEADER_OFFSET = "rankstream.source.offset"
HEADER_INDEX = "rankstream.source.index"  # position in a JSON array; absent for a whole message


class DeadLetters:
    """Produces to the dead-letter topic; `flush()` raises unless every record was acknowledged."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self._deliveries = Deliveries(producer, "dead-letter topic")
        self._topic = topic

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
        self._deliveries.produce(self._topic, value=msg.value() or b"", key=msg.key(), headers=headers)
        _log.info("dead-lettered", extra={"reason": bad.reason, "offset": msg.offset(), "index": bad.index})

    def flush(self, timeout: float) -> None:
        self._deliveries.flush(timeout)
