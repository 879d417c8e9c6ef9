"""`rankstream dlq stats` and `rankstream dlq show`: what the dead-letter topic holds, as tables
for people or JSON for programs."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from common.settings import Settings, env_name
from rankstream.dlq.reader import read_topic
from rankstream.dlq.records import DeadLetter, Unreplayable, original_event, printable, value_text
from rankstream.show import table
from worker.dlq import HEADER_INDEX

SHOWN_CHARS = 4096  # of a value, for people (--json: all of it)


def dead_letters(settings: Settings, reason: str | None = None) -> Generator[DeadLetter, None, None]:
    """The dead letters (of `reason`, if given), committed, up to the topic's end at the start."""
    for msg in read_topic(settings, settings.topic_dlq, env_name("topic_dlq")):
        letter = DeadLetter.of(msg)
        if reason is None or letter.reason == reason:
            yield letter


@dataclass
class Stats:
    total: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_hour: Counter[str] = field(default_factory=Counter)  # "YYYY-MM-DDTHH:00Z", UTC
    truncated: int = 0


def hour_of(ms: int) -> str:
    """The UTC hour a Kafka timestamp falls in; `unknown` for none."""
    if ms <= 0:
        return "unknown"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:00Z")


def tally(letters: Iterable[DeadLetter]) -> Stats:
    stats = Stats()
    for letter in letters:
        stats.total += 1
        stats.by_reason[letter.reason] += 1
        stats.by_hour[hour_of(letter.timestamp_ms)] += 1
        stats.truncated += letter.truncated
    return stats


def stats_json(stats: Stats, topic: str) -> str:
    return _json(
        {
            "topic": topic,
            "total": stats.total,
            "truncated": stats.truncated,
            "by_reason": dict(_most_first(stats.by_reason)),
            "by_hour": dict(sorted(stats.by_hour.items())),
        }
    )


def stats_table(stats: Stats, topic: str) -> str:
    head = f"{topic}: {stats.total} dead letter{'' if stats.total == 1 else 's'}"
    if stats.truncated:
        head += f" ({stats.truncated} truncated)"
    if not stats.total:
        return head
    reasons = [[str(n), printable(reason)] for reason, n in _most_first(stats.by_reason)]
    hours = [[str(n), hour] for hour, n in sorted(stats.by_hour.items())]
    return "\n\n".join([head, table(reasons, ["count", "reason"]), table(hours, ["count", "hour (UTC)"])])


def _most_first(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def entry(letter: DeadLetter) -> dict[str, Any]:
    """One dead letter, for --json: every field as text, the value also exactly (base64)."""
    text, utf8 = value_text(letter.value)
    try:
        event: dict[str, Any] | None = original_event(letter)
        problem = None
    except Unreplayable as exc:
        event, problem = None, str(exc)
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "written_at": letter.written_at,
        "timestamp_ms": letter.timestamp_ms,
        "reason": letter.reason,
        "key": None if letter.key is None else value_text(letter.key)[0],
        "value": text,
        "value_utf8": utf8,
        "value_base64": base64.b64encode(letter.value).decode(),
        "value_bytes": len(letter.value),
        "event": event,
        "event_problem": problem,
        "headers": {name: letter.header(name) for name, _ in letter.headers},
    }


def entry_json(letter: DeadLetter) -> str:
    return _json(entry(letter))


def _json(data: object) -> str:
    return orjson.dumps(data, default=_beyond_double).decode()


def _beyond_double(value: object) -> object:
    """A number beyond a double (the worker decodes it as infinity, common/events.py) as text."""
    if isinstance(value, float):
        return str(float(value))  # "inf", "-inf"
    raise TypeError(type(value).__name__)


def entry_text(letter: DeadLetter) -> str:
    """One dead letter for people: control characters escaped, a long value cut."""
    data = entry(letter)
    lines = [f"{letter.place}  {data['written_at']}  {printable(letter.reason)}"]
    if data["key"] is not None:
        lines.append(f"  key: {printable(data['key'])}")
    text: str = data["value"]
    note = "" if data["value_utf8"] else ", not UTF-8: shown escaped"
    cut = f", the first {SHOWN_CHARS} characters (--json: all)" if len(text) > SHOWN_CHARS else ""
    lines.append(f"  value ({len(letter.value)} bytes{note}{cut}): {printable(text[:SHOWN_CHARS])}")
    index = letter.header(HEADER_INDEX)
    what = "event" if index is None else f"event (element {index} of the array)"
    if data["event"] is not None:
        lines.append(f"  {what}: {printable(_json(data['event']))}")
    else:
        lines.append(f"  event: none ({data['event_problem']})")
    lines.append("  headers:")
    lines += [f"    {printable(name)}: {printable(value or '')}" for name, value in data["headers"].items()]
    return "\n".join(lines)
