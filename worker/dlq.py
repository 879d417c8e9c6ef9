"""The dead-letter topic: the original bytes of a bad event, with the reason and where it came from.

Records go out through the worker's transactional outputs, so each reaches read_committed
readers once however often the worker dies. A record too large for the topic (or the
producer) as it is goes out truncated, flagged, never retried forever."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from common.errors import BadEvent
from common.kafka_types import MessageLike

_log = logging.getLogger(__name__)

HEADER_REASON = "rankstream.reason"
HEADER_MESSAGE = "rankstream.message"
HEADER_TOPIC = "rankstream.source.topic"
HEADER_PARTITION = "rankstream.source.partition"
HEADER_OFFSET = "rankstream.source.offset"
HEADER_INDEX = "rankstream.source.index"  # position in a JSON array; absent for a whole message
HEADER_ERROR_CLASS = "rankstream.error.class"  # internal_error: what raised
HEADER_ERROR_TEXT = "rankstream.error.text"
HEADER_TRUNCATED = "rankstream.truncated"  # "1": the value is the first TRUNCATED_BYTES of it
HEADER_ORIGINAL_SIZE = "rankstream.original_size"  # the original value's length in bytes
TRUNCATED_BYTES = 64 * 1024
MAX_KEY_BYTES = 1024
MAX_TEXT_BYTES = 1024
# what a record costs beyond key, value and header bytes (batch header, varints): generous
RECORD_OVERHEAD = 4096

Header = tuple[str, bytes]


class Sink(Protocol):
    def produce(self, topic: str, **kwargs: Any) -> None: ...
    def flush(self, timeout: float) -> None: ...


class DeadLetters:
    """Produces to the dead-letter topic through `sink` (the worker's transactional outputs)."""

    def __init__(self, sink: Sink, topic: str, max_record_bytes: int) -> None:
        self._sink = sink
        self._topic = topic
        self._max = max_record_bytes

    def send(self, msg: MessageLike, bad: BadEvent, error: BaseException | None = None) -> None:
        headers: list[Header] = [
            (HEADER_REASON, bad.reason.encode()),
            (HEADER_MESSAGE, _capped(bad.message)),
            (HEADER_TOPIC, (msg.topic() or "").encode()),
            (HEADER_PARTITION, str(msg.partition()).encode()),
            (HEADER_OFFSET, str(msg.offset()).encode()),
        ]
        if bad.index is not None:
            headers.append((HEADER_INDEX, str(bad.index).encode()))
        if error is not None:
            headers += [
                (HEADER_ERROR_CLASS, getattr(error, "original_class", type(error).__name__).encode()),
                (HEADER_ERROR_TEXT, _capped(str(error))),
            ]
        value, key = msg.value() or b"", msg.key()
        size = len(value) + len(key or b"") + _header_bytes(headers) + RECORD_OVERHEAD
        if size > self._max:
            self._produce_truncated(value, key, headers)
        else:
            try:
                self._sink.produce(self._topic, value=value, key=key, headers=headers)
            except KafkaException as exc:  # the producer's own limit is lower than we knew
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                self._produce_truncated(value, key, headers)
        _log.info("dead-lettered", extra={"reason": bad.reason, "offset": msg.offset(), "index": bad.index})

    def _produce_truncated(self, value: bytes, key: bytes | None, headers: list[Header]) -> None:
        headers = [*headers, (HEADER_TRUNCATED, b"1"), (HEADER_ORIGINAL_SIZE, str(len(value)).encode())]
        key = None if key is None else key[:MAX_KEY_BYTES]
        # 64 KiB, or less where even that would not fit (a topic limit below ~70 KB)
        room = self._max - RECORD_OVERHEAD - len(key or b"") - _header_bytes(headers)
        self._sink.produce(
            self._topic, value=value[: max(0, min(TRUNCATED_BYTES, room))], key=key, headers=headers
        )


def _header_bytes(headers: list[Header]) -> int:
    return sum(len(k) + len(v) for k, v in headers)


def _capped(text: str) -> bytes:
    return text.encode(errors="replace")[:MAX_TEXT_BYTES]
