"""The scenario of tests/integration/test_period_results.py and the stream it produces: two days
of events in Asia/Shanghai, from 21:00 local (two midnights). Board type `gift` declares
`period_results: {windows: [hour, day, last_3h], top: 5}` (its 30min and total windows emit
nothing), type `plain` declares none. Events are mostly small incrs over 8 members (ties, decided
by who got there first), with set, best and delete; some are late within the late grace (in the
period that just closed, large: they change its result) or beyond it (they count in total and open
periods only), some ahead of the clock; at a few boundaries one lands at the last ms of the grace
and one at the first ms after it. Each board's events stay in one partition (the models apply them
in the order produced).

The dates lie 100 days ahead of the real clock: Redis expires keys by its own."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from tests.rolling_model import DAY, HOUR, MINUTE
from tests.stream_events import Message, fresh_ts

ZONE = "Asia/Shanghai"
GRACE = 10 * MINUTE
SETTLE_MS = 5_000  # a result is due at its period's end + late grace + this (common/results.py)
SKEW = DAY  # the default max_future_skew_s
TOP = 5
DECLARED = ("hour", "day", "last_3h")
GIFT_WINDOWS = ("total", "30min", "hour", "day", "last_3h")
RETENTION = {"30min": 8, "hour": 6, "day": 3}  # last_3h: the default 2 (kept 1 h after it ends)
PLAIN_WINDOWS = ("total", "hour")
GIFT = ("gift:r1", "gift:r2", "gift:r3")
META_BOARD = "gift:r1"  # its events all carry their member's meta, and none is a delete
# the message key of each board's events: one board's events must stay in order (one partition),
# as the model applies them in the order produced; an array holds the two boards of a key
KEYS = {"gift:r1": "pair", "gift:r2": "pair", "gift:r3": "gift:r3", "plain:x": "plain:x"}
PAIR = ["gift:r1", "gift:r2"]
PLAIN = "plain:x"
MEMBERS = tuple(f"m{i}" for i in range(8))
HOURS = 50  # of events, from 21:00 local: two midnights
EDGES = (3, 17, 27, 41)  # hours whose start's late grace is probed at its last ms and just after


def config() -> str:
    document = {
        "timezone": ZONE,
        "types": {
            "gift": {
                "windows": list(GIFT_WINDOWS),
                "retention": RETENTION,
                "late_grace": "10m",
                "period_results": {"windows": list(DECLARED), "top": TOP},
            },
            "plain": {"windows": list(PLAIN_WINDOWS), "late_grace": "10m"},
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


def first_instant(tz: ZoneInfo) -> int:
    """21:00 local, 100 days from now."""
    day = (datetime.now(tz) + timedelta(days=100)).date()
    return int(datetime(day.year, day.month, day.day, 21, tzinfo=tz).timestamp() * 1000)


class Stream:
    """The clock's steps and the events produced at each."""

    def __init__(self, start: int, seed: int) -> None:
        self.start = start
        self.rng = random.Random(seed)
        self.used: dict[str, set[int]] = {}
        self.ids = 0

    def steps(self) -> Iterator[tuple[int, int, str]]:
        """(hour index, clock, kind) in time order."""
        rng = self.rng
        for hour in range(HOURS):
            at = self.start + hour * HOUR
            points = [(at + 5 * MINUTE, "late")]
            if hour in EDGES:
                points += [(at + GRACE - 1, "edge-in"), (at + GRACE, "edge-out")]
            points += [
                (at + rng.randint(11, 25) * MINUTE, "first"),  # ACTIONS happen here
                (at + rng.randint(28, 44) * MINUTE, "mid"),
                (at + rng.randint(46, 58) * MINUTE, "last"),  # the preparer's quarter
            ]
            for now, kind in sorted(points):
                yield hour, now, kind

    def messages(self, previous: int, now: int, kind: str) -> list[Message]:
        rng = self.rng
        hour_start = now - (now - self.start) % HOUR
        out: list[Message] = []
        for board in GIFT:
            out += [
                self._message(now, [board], rng.randint(previous + 1, now)) for _ in range(rng.randint(1, 3))
            ]
            if kind == "late":  # within the grace, in the hour that closed: large, it moves the top
                for _ in range(rng.randint(1, 2)):
                    late = hour_start - rng.randint(1, 30 * MINUTE)
                    out.append(self._message(now, [board], late, big=True))
            elif kind == "edge-in":  # the grace's last ms: counts
                out.append(self._message(now, [board], hour_start - 1, big=True))
            elif kind == "edge-out":  # its first ms after: counts in later periods only
                out.append(self._message(now, [board], hour_start - rng.randint(1, 9 * MINUTE), big=True))
            elif rng.random() < 0.4:  # beyond the grace of its hour
                late = hour_start - rng.randint(1, 50 * MINUTE)
                out.append(self._message(now, [board], late, big=rng.random() < 0.5))
            if rng.random() < 0.1:  # hours late
                out.append(self._message(now, [board], now - rng.randint(2 * HOUR, 5 * HOUR)))
            if rng.random() < 0.1:  # ahead of the clock
                out.append(self._message(now, [board], now + rng.randint(MINUTE, 50 * MINUTE)))
        if rng.random() < 0.3:  # one message for two boards
            out.append(self._message(now, rng.sample(PAIR, 2), rng.randint(previous + 1, now)))
        out += [
            self._message(now, [PLAIN], now - rng.randint(0, 40 * MINUTE)) for _ in range(rng.randint(0, 2))
        ]
        return out

    def _message(self, now: int, boards: list[str], ts: int, big: bool = False) -> Message:
        events = [self._event(b, fresh_ts(self.used.setdefault(b, set()), ts), big) for b in boards]
        assert len({KEYS[board] for board in boards}) == 1
        return Message(KEYS[boards[0]], now, events, array=len(events) > 1 or self.rng.random() < 0.3)

    def _event(self, board: str, ts: int, big: bool) -> dict[str, Any]:
        rng = self.rng
        self.ids += 1
        member = rng.choice(MEMBERS)
        event: dict[str, Any] = {"id": f"e{self.ids}", "board": board, "member": member, "ts": ts}
        weights = (80, 8, 12, 0) if board == META_BOARD else (74, 8, 10, 8)
        op = "incr" if big else rng.choices(("incr", "set", "best", "delete"), weights)[0]
        if op != "incr" or rng.random() < 0.5:
            event["op"] = op
        if op == "incr":
            event["score"] = rng.randint(6, 12) if big else rng.choice((-1, 1, 1, 2, 2, 3, 5))
        elif op != "delete":
            event["score"] = rng.randint(0, 15)
        if board == META_BOARD:
            event["meta"] = {"name": f"Member {member}"}
        return event
