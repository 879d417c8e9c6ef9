"""The replay ledger (RANKSTREAM_TOPIC_DLQ_REPLAYED, compacted): one record per dead letter that
`rankstream dlq replay` produced again, written in the same Kafka transaction as the event itself,
so neither is ever visible without the other.

Key: the dead letter's `<partition>:<offset>` in the dead-letter topic. Value (JSON): the
dead-letter topic, the reason, the dead letter's source (topic, partition, offset, index), the
event's id and board, when it was replayed, whether by --force, and the fix file's name. A record
whose source is not the dead letter's does not count: the dead-letter topic was made again and
its offsets started over. A record that cannot be read counts: in doubt, nothing is sent twice.
A tombstone (no value) forgets the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from common.settings import Settings, env_name
from rankstream.dlq.reader import read_topic
from rankstream.dlq.records import DeadLetter


@dataclass(frozen=True, slots=True)
class Entry:
    source: dict[str, Any] | None  # None: the record could not be read
    replayed_at_ms: int


Ledger = dict[str, Entry]


def ledger_record(
    letter: DeadLetter, event: dict[str, Any], *, dlq_topic: str, now_ms: int, forced: bool, fix: str | None
) -> tuple[bytes, bytes]:
    """The key and value that record `letter` as replayed, sent as `event`."""
    value = {
        "dlq": dlq_topic,
        "reason": letter.reason,
        "source": letter.source,
        "id": event.get("id"),
        "board": event.get("board"),
        "replayed_at": now_ms,
        "forced": forced,
        "fix": fix,
    }
    return letter.place.encode(), orjson.dumps(value)


def parse_entry(value: bytes | None) -> Entry | None:
    """The entry a ledger record holds; None for a tombstone."""
    if value is None:
        return None
    try:
        body = orjson.loads(value)
        source, at = body["source"], body["replayed_at"]
        if isinstance(source, dict) and isinstance(at, int):
            return Entry(source, at)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return Entry(None, 0)


def replayed_before(ledger: Ledger, letter: DeadLetter) -> Entry | None:
    """The ledger's entry for this very dead letter, if it was replayed."""
    entry = ledger.get(letter.place)
    if entry is None or (entry.source is not None and entry.source != letter.source):
        return None
    return entry


def read_ledger(settings: Settings) -> Ledger:
    """The whole ledger, as it stands (read_committed, to its end): the latest record per key."""
    ledger: Ledger = {}
    for msg in read_topic(settings, settings.topic_dlq_replayed, env_name("topic_dlq_replayed")):
        key = (msg.key() or b"").decode("utf-8", "replace")
        entry = parse_entry(msg.value())
        if entry is None:
            ledger.pop(key, None)
        else:
            ledger[key] = entry
    return ledger
