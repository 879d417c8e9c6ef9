"""A demo producer: realistic gift events over a handful of live rooms, one of them hot."""

from __future__ import annotations

import random
import signal
import time
import uuid
from types import FrameType

import orjson
from confluent_kafka import Producer

from common.settings import Settings

DEMO_HOT_BOARD = "gift:room42"
DEMO_BOARDS = (DEMO_HOT_BOARD, "gift:room7", "gift:room1001", "coins:global", "level:season3")
# gift prices as live-streaming apps price them; cheap gifts are sent far more often
_GIFTS = ((1, 60), (5, 20), (10, 10), (52, 5), (99, 3), (520, 1.5), (1314, 0.5))
_NAMES = ("Ann", "Bo", "Chen", "Dana", "Eli", "Fei", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena")


def demo_event(rng: random.Random, now_ms: int) -> dict[str, object]:
    board = rng.choices(DEMO_BOARDS, weights=(50, 20, 10, 15, 5))[0]
    # a few big spenders and a long tail, like a real room
    user = int(rng.paretovariate(1.2)) % 500
    member = f"u{user:04d}"
    event: dict[str, object] = {"id": uuid.uuid4().hex, "board": board, "member": member, "ts": now_ms}
    if board.startswith("level:"):
        event.update(op="best", score=rng.randint(1, 10_000))
    else:
        prices, weights = zip(*_GIFTS, strict=True)
        event["score"] = rng.choices(prices, weights=weights)[0] * rng.randint(1, 3)
    if rng.random() < 0.05:
        event["meta"] = {"name": f"{rng.choice(_NAMES)}{user}", "avatar": f"https://img.example/{user}.png"}
    return event


def run_demo_producer(settings: Settings, events_per_s: float, duration_s: float = 0.0) -> int:
    producer = Producer(settings.librdkafka({"enable.idempotence": True}, defaults={"linger.ms": 20}))
    rng = random.Random()  # noqa: S311 - demo data, not security
    stop = False

    def _stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    started = time.monotonic()
    sent = 0
    while not stop and (duration_s <= 0 or time.monotonic() - started < duration_s):
        event = demo_event(rng, int(time.time() * 1000))
        producer.produce(settings.topic_updates, orjson.dumps(event), key=str(event["board"]).encode())
        sent += 1
        producer.poll(0)
        # pace to the target rate without drifting
        ahead = sent / events_per_s - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    producer.flush(10)
    return 0
