"""What the simulated event streams of the period and rolling oracles share (tests/period_stream.py,
tests/rolling_stream.py): their messages, a random event of one member, a time of its own per board type."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

OPS = ("incr", "set", "best", "delete")


@dataclass
class Message:
    """One Kafka message of a stream: one event, or an array of them."""

    key: str
    kafka_ts: int
    events: list[dict[str, Any]]
    array: bool

    def value(self) -> bytes:
        return json.dumps(self.events if self.array else self.events[0]).encode()


def event_times(messages: Iterable[Message]) -> list[int]:
    """Each event's time: its own `ts`, or its message's Kafka timestamp."""
    return [int(event.get("ts", message.kafka_ts)) for message in messages for event in message.events]


def random_event(
    rng: random.Random, event_id: str, board: str, member: str, *, ts: int, weights: tuple[int, int, int, int]
) -> dict[str, Any]:
    """incr, set, best or delete by `weights` (half the incrs leave `op` out: the default)."""
    event: dict[str, Any] = {"id": event_id, "board": board, "member": member}
    op = rng.choices(OPS, weights)[0]
    if op != "incr" or rng.random() < 0.5:
        event["op"] = op
    if op != "delete":
        event["score"] = rng.randint(-3, 9) if op == "incr" else rng.randint(0, 14)
    event["ts"] = ts
    return event


def fresh_ts(used: set[int], ts: int) -> int:
    """`ts`, or the latest earlier ms not used yet: ties are decided by time alone."""
    while ts in used:
        ts -= 1
    used.add(ts)
    return ts
