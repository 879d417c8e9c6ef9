"""A dead letter as `rankstream dlq` sees it, and the one event it stands for.

What the worker writes (worker/dlq.py): the original message's key and value, whole, and its
headers. For a bad element of a JSON array the value is still the *whole array's* bytes, with
`rankstream.source.index` naming the element (one dead letter per bad element; the others were
applied), so the event of such a dead letter is that element alone, never the array."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from common.events import decode_value
from worker.dlq import (
    HEADER_INDEX,
    HEADER_OFFSET,
    HEADER_ORIGINAL_SIZE,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
    HEADER_TRUNCATED,
)

_JSON_KINDS = {str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class Unreplayable(Exception):
    """This dead letter holds no event that can be produced again: `why`, in one line."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    partition: int
    offset: int
    timestamp_ms: int  # the dead-letter record's Kafka timestamp: when the worker wrote it
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]

    @classmethod
    def of(cls, msg: Message) -> DeadLetter:
        raw = msg.headers() or []
        pairs = raw.items() if isinstance(raw, dict) else raw
        return cls(
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            timestamp_ms=msg.timestamp()[1],
            key=msg.key(),
            value=msg.value() or b"",
            headers=tuple(
                (name, value.encode() if isinstance(value, str) else value or b"") for name, value in pairs
            ),
        )

    @property
    def place(self) -> str:
        """`<partition>:<offset>` in the dead-letter topic: its name in output and in the ledger."""
        return f"{self.partition}:{self.offset}"

    def header(self, name: str) -> str | None:
        """The header's value as text (bytes that are not UTF-8 escaped); None when absent."""
        for key, value in self.headers:
            if key == name:
                return value.decode("utf-8", "backslashreplace")
        return None

    @property
    def reason(self) -> str:
        return self.header(HEADER_REASON) or "unknown"

    @property
    def label(self) -> str:
        """`<place> (<reason>)`, safe to print."""
        return f"{self.place} ({printable(self.reason)})"

    @property
    def index(self) -> int | None:
        """The element's position in the original array; None for a whole message. A header that
        is not a number is Unreplayable (the element can't be told)."""
        text = self.header(HEADER_INDEX)
        if text is None:
            return None
        if not text.isdigit():
            raise Unreplayable(f"its {HEADER_INDEX} header is not a position: {text!r}")
        return int(text)

    @property
    def truncated(self) -> bool:
        return self.header(HEADER_TRUNCATED) == "1"

    @property
    def source(self) -> dict[str, str | None]:
        """Where the original message was: topic, partition, offset, and the element's index."""
        return {
            "topic": self.header(HEADER_TOPIC),
            "partition": self.header(HEADER_PARTITION),
            "offset": self.header(HEADER_OFFSET),
            "index": self.header(HEADER_INDEX),
        }

    @property
    def written_at(self) -> str:
        return iso_ms(self.timestamp_ms)


def iso_ms(ms: int) -> str:
    """A Kafka timestamp in UTC, to the millisecond; `unknown` for none."""
    if ms <= 0:
        return "unknown"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def original_event(letter: DeadLetter) -> dict[str, Any]:
    """The event the dead letter stands for, decoded as the worker decodes it: the whole value,
    or the element `rankstream.source.index` names. Unreplayable when there is no such one event
    (the value cut short, not JSON, not an object, an array where one event was expected)."""
    if letter.truncated:
        size = letter.header(HEADER_ORIGINAL_SIZE) or "?"
        raise Unreplayable(
            f"truncated: the dead letter keeps only the first {len(letter.value)} of its {size} bytes; "
            "produce the original again from its source"
        )
    try:
        document = decode_value(letter.value)
    except ValueError:
        raise Unreplayable("its value is not JSON") from None
    index = letter.index
    if index is not None:
        if not isinstance(document, list) or index >= len(document):
            raise Unreplayable(f"its value has no element {index}")
        document = document[index]
    if isinstance(document, list):
        raise Unreplayable(f"its value is an array of {len(document)} (one event is replayed at a time)")
    if not isinstance(document, dict):
        raise Unreplayable(f"its value is not an event but {_JSON_KINDS.get(type(document), 'a value')}")
    return document


def printable(text: str) -> str:
    """`text` safe for a terminal: control and direction characters as escapes."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def value_text(value: bytes) -> tuple[str, bool]:
    """The value as text, and whether it is UTF-8 (if not, undecodable bytes are shown `\\xNN`)."""
    try:
        return value.decode("utf-8"), True
    except UnicodeDecodeError:
        return value.decode("utf-8", "backslashreplace"), False
