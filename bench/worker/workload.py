"""What the worker benchmark feeds the worker: Zipf-distributed gift events over many boards,
as single-event messages or as JSON arrays, written to a fresh topic per measurement."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from bench.common import REPO, zipf_cum_weights
from bench.harness.kafka import Message, produce
from bench.harness.stack import Stack
from common.settings import Settings
from rankstream.topics import ensure_topics

FOLDER = REPO / ".stack" / "bench"
BOARDS = 200
MEMBERS = 20_000
# Classic Zipf (s=1): a few big spenders and a long tail, as in a live room.
ZIPF_S = 1.0
WINDOWS = ("total", "day", "week")
BOARDS_YAML = f"timezone: UTC\ntypes:\n  gift: {{windows: [{', '.join(WINDOWS)}]}}\n"
ARRAY_SIZE = 100


def make_events(
    n: int, id_prefix: str, rng: random.Random, boards: int | Sequence[str] = BOARDS
) -> list[dict[str, Any]]:
    """n update events over `boards` boards (uniform: `gift:room<i>`, or these names) and
    MEMBERS members (Zipf)."""
    members = rng.choices(range(MEMBERS), cum_weights=zipf_cum_weights(MEMBERS, ZIPF_S), k=n)
    now_ms = int(time.time() * 1000)
    names = None if isinstance(boards, int) else list(boards)

    def board() -> str:
        if names is None:
            assert isinstance(boards, int)
            return f"gift:room{rng.randrange(boards)}"
        return names[rng.randrange(len(names))]

    return [
        {
            "id": f"{id_prefix}-{i}",
            "board": board(),
            "member": f"u{member}",
            "score": rng.randint(1, 100),
            "ts": now_ms - rng.randrange(5000),
        }
        for i, member in enumerate(members)
    ]


def single_messages(events: Sequence[Mapping[str, Any]]) -> list[Message]:
    return [(str(e["board"]).encode(), orjson.dumps(e)) for e in events]


def array_messages(events: Sequence[Mapping[str, Any]], size: int) -> list[Message]:
    """Arrays of up to `size` events of one board, keyed by it (as a batching producer would)."""
    by_board: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        by_board.setdefault(str(event["board"]), []).append(event)
    out: list[Message] = []
    for board, group in by_board.items():
        out += [(board.encode(), orjson.dumps(group[i : i + size])) for i in range(0, len(group), size)]
    # interleave boards, as many producers writing at once would
    random.Random(7).shuffle(out)
    return out


def fresh_topic(
    stack: Stack, tag: str, messages: Sequence[Message], **overrides: Any
) -> tuple[Settings, float]:
    """An empty Redis (every measurement starts from the same) and `messages` written to topics
    of their own named for `tag`; (the settings naming them, messages/s produced)."""
    stack.client.flushall()
    settings = stack.settings(tag, **overrides)
    ensure_topics(settings)
    return settings, produce(settings.kafka_bootstrap, settings.topic_updates, messages)


def live_stream(
    name: str, *, boards: int | Sequence[str] = BOARDS, board: str | None = None
) -> Callable[[int], list[Message]]:
    """n fresh events at a time (each counts: an id of its own), over `boards` boards (a number,
    or their names) or all on `board`: what a paced producer sends (bench/harness/kafka.py paced)."""
    rng = random.Random(name)

    def make(n: int) -> list[Message]:
        events = make_events(n, f"{name}-{uuid.uuid4().hex[:6]}", rng, boards=boards)
        if board is not None:
            for event in events:
                event["board"] = board
        return single_messages(events)

    return make
