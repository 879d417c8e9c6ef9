"""The scenario of tests/integration/test_rolling_oracle.py and the stream it produces: about six
weeks of simulated time in America/New_York, stepped at least once inside every local hour (the
worker prepares rolling period q+1 while bucket q is current, so the clock never skips a
bucket), crossing hour, day, ISO-week and month boundaries and the 2027-11-07 fall-back change
(the repeated 01:00 hour is one bucket). Events are mostly incr, with set, best and delete; some
are late (within and beyond late_grace), some ahead of the clock by up to six hours (future
buckets). Probe steps sit at the last ms before and the first ms after every day, week and month
boundary, a few hour boundaries (those of the repeated hour among them), the last ms of some late
graces and the first ms after, and a few instants in between.

The dates lie in 2027: Redis expires a period's keys at its simulated expiry, so every simulated
instant must lie ahead of the real clock."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from tests.period_model import instant
from tests.rolling_model import DAY, HOUR, MINUTE, UNITS, BoardType, Model
from tests.stream_events import Message, fresh_ts, random_event

ZONE = "America/New_York"
START = "2027-10-24T20:30"  # a Sunday evening: a week, then a month (and a week) begin
END = "2027-12-03T06:00"  # after the month of December began (a Wednesday)
GRACE = 10 * MINUTE
SKEW = DAY  # the default max_future_skew_s
AHEAD = 6 * HOUR  # the furthest ahead of the clock an event's time lies
LATE = 5 * HOUR  # the furthest behind
REPEATED = ("2027-11-07T01:00-04:00", "2027-11-07T01:00-05:00", "2027-11-07T02:00-05:00")
TYPES = {
    "arena": BoardType(
        "arena", ("total", "day", "last_72h", "last_3d", "last_2w", "last_2m"), "desc", "first", GRACE
    ),
    "ladder": BoardType(
        "ladder", ("total", "last_6h", "last_1d", "last_1w", "last_1m"), "asc", "last", GRACE
    ),
}
BOARDS = {"arena": ("arena:hot", "arena:cold"), "ladder": ("ladder:hot", "ladder:cold")}
HOT = ("arena:hot", "ladder:hot")
MEMBERS = {"arena": [f"a{i:02d}" for i in range(20)], "ladder": [f"l{i:02d}" for i in range(14)]}


def config() -> str:
    types: dict[str, Any] = {}
    for name, spec in TYPES.items():
        types[name] = {
            "order": spec.order,
            "tie_break": spec.tie,
            "windows": list(spec.windows),
            "late_grace": "10m",
        }
    types["arena"]["retention"] = {"day": 3}
    document = {"timezone": ZONE, "types": types, "hot": [{"board": board} for board in HOT]}
    return yaml.safe_dump(document, sort_keys=False)


def model() -> Model:
    tz = ZoneInfo(ZONE)
    start, end = instant(START, tz), instant(END, tz)
    return Model(tz, start - 120 * DAY, end + 200 * DAY, TYPES, SKEW)


@dataclass
class Step:
    now: int  # the service clock while the step's messages are processed
    probe: str = ""  # why the state is compared with the model after this step ("": it is not)
    messages: list[Message] = field(default_factory=list)


class Stream:
    """Steps of the clock, each with the messages produced while it reads that time."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tz = ZoneInfo(ZONE)
        self.start = instant(START, self.tz)
        self.end = instant(END, self.tz)
        self.calendar = model()
        self.used: dict[str, set[int]] = {name: set() for name in MEMBERS}
        self.ids = 0
        self.late_probes: dict[int, int] = {}  # step instant -> the boundary whose grace it probes

    def boundaries(self, unit: str) -> list[int]:
        """The starts of the unit's buckets in (start, end)."""
        return [b.start for b in self.calendar.buckets[unit].list if self.start < b.start < self.end]

    def points(self) -> dict[int, str]:
        """Every step's instant -> its probe label ('' for none)."""
        rng = self.rng
        hours = [self.start, *self.boundaries("h"), self.end]
        points: dict[int, str] = {self.start: ""}
        for low, high in itertools.pairwise(hours):
            # once in every hour bucket (twice in the repeated one: once in each occurrence)
            for part in range(low, high, HOUR):
                points.setdefault(rng.randint(part + 1, min(part + HOUR, high) - 2), "")
        probed: dict[int, str] = {}
        for unit in ("m", "w", "d"):
            for boundary in self.boundaries(unit):
                probed.setdefault(boundary, f"{unit} {self.calendar.buckets[unit].bucket_at(boundary).id}")
        repeated = [instant(text, self.tz) for text in REPEATED]
        hour_boundaries = [b for b in self.boundaries("h") if b not in probed]
        for boundary in [*repeated, *rng.sample(hour_boundaries, 5)]:
            probed.setdefault(boundary, f"h {self.calendar.buckets['h'].bucket_at(boundary).id}")
        graced = {*self.boundaries("w"), *self.boundaries("m"), *repeated[::2]}
        graced |= set(rng.sample(sorted(set(probed) - graced), 8))
        for boundary, name in probed.items():
            if boundary != repeated[1]:  # 01:00 EST is no boundary: inside the repeated hour
                points[boundary - 1] = f"before {name}"
            points[boundary] = f"at {name}"
            if boundary in graced:
                points[boundary + GRACE - 1] = f"grace end of {name}"
                points[boundary + GRACE] = f"after the grace of {name}"
                self.late_probes[boundary + GRACE - 1] = boundary
                self.late_probes[boundary + GRACE] = boundary
        for _ in range(15):
            points[rng.randint(self.start, self.end)] = "between"
        return points

    def steps(self) -> Iterator[Step]:
        points = self.points()
        previous = self.start - 30 * MINUTE
        for now in sorted(p for p in points if p <= self.end):
            for unit in UNITS:  # the clock never skips a bucket
                units = self.calendar.buckets[unit]
                assert units.at(now) - units.at(max(previous, self.start)) <= 1, (unit, now)
            yield self._step(previous, now, points[now])
            previous = now

    def _step(self, previous: int, now: int, probe: str) -> Step:
        step, rng = Step(now, probe), self.rng
        for type_name in BOARDS:
            for _ in range(rng.choice((0, 1, 1, 2))):
                self._send(step, type_name, rng.randint(previous + 1, now))
            if rng.random() < 0.2:  # late: within or beyond late_grace, in this bucket or older ones
                self._send(step, type_name, now - rng.randint(MINUTE, LATE))
            if rng.random() < 0.06:  # ahead of the clock: this bucket or later ones
                self._send(step, type_name, now + rng.randint(MINUTE, AHEAD))
            boundary = self.late_probes.get(now)
            if probe.startswith("at "):  # late by 1 ms: the closed period's last instant
                self._send(step, type_name, now - 1)
            elif boundary is not None and now == boundary + GRACE - 1:  # the grace's last ms
                self._send(step, type_name, boundary - 1)
            elif boundary is not None:  # the first ms after it: only later periods take it
                self._send(step, type_name, boundary - rng.randint(2, 10 * MINUTE))
                self._send(step, type_name, boundary)
        return step

    def _event(self, board: str, ts: int, type_name: str) -> dict[str, Any]:
        self.ids += 1
        member = self.rng.choice(MEMBERS[type_name])
        return random_event(self.rng, f"e{self.ids}", board, member, ts=ts, weights=(70, 10, 13, 7))

    def _fresh(self, type_name: str, ts: int) -> int:
        """Each event of a type gets its own time: ties are decided by time alone."""
        return fresh_ts(self.used[type_name], ts)

    def _send(self, step: Step, type_name: str, ts: int) -> None:
        """To both boards of the type or one. Half the messages carry no ts: their Kafka
        timestamp is the events' time; the others are stamped with the clock when produced."""
        rng = self.rng
        ts = self._fresh(type_name, ts)
        both = BOARDS[type_name]
        boards = list(both) if rng.random() < 0.7 else [rng.choice(both)]
        events = [self._event(board, ts, type_name) for board in boards]
        array = rng.random() < 0.5 or len(events) > 1
        if rng.random() < 0.5:
            for event in events:
                del event["ts"]
            step.messages.append(Message(type_name, ts, events, array))
        else:
            step.messages.append(Message(type_name, step.now, events, array))
