"""The scenarios of tests/integration/test_periods_oracle.py and the stream each one produces:
days of simulated time in steps of the service clock, with on-time events, late ones (within
and beyond late_grace, some in periods already expired), events between seasons, and probes at
the last ms of a late grace and the first ms after it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from tests.period_model import BoardType, Calendar, Model, Seasons, Span, instant
from tests.stream_events import Message, fresh_ts, random_event

MINUTE = 60_000
DAY = 86_400_000
GRACE = 10 * MINUTE
SKEW = DAY  # the default max_future_skew_s
AHEAD = 90 * MINUTE  # the furthest ahead of the clock an event's time lies
WINDOWS = ("total", "30min", "hour", "day", "week", "month", "season")
RETENTION = {"30min": 8, "hour": 6, "day": 3, "week": 2, "month": 2, "season": 2}
HOT = ("arena:hot", "cup:hot")
RANKED = {"arena": ("arena:hot", "arena:cold"), "cup": ("cup:hot", "cup:cold")}
PROMO = "promo:x"
MEMBERS = {
    "arena": [f"a{i:02d}" for i in range(12)],
    "cup": [f"c{i:02d}" for i in range(12)],
    "promo": ["p0", "p1", "p2", "p3"],
}


@dataclass(frozen=True)
class Scenario:
    zone: str
    start: str  # local: the clock's first reading
    hours: int  # of simulated time
    anchor: str  # arena's seasons: every 2 days from this date
    seasons: tuple[tuple[str, str, str], ...]  # cup's named seasons (name, start, end), with gaps
    gaps: tuple[str, ...]  # instants in no season of cup
    ends_at: str  # promo's activity end (local)
    probes: tuple[str, ...]  # period ends whose late grace is probed at its last ms and just after
    crosses: tuple[str, ...] = ("day",)  # the local boundaries its events cross (day, week, month)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    def config(self) -> str:
        ranked = {
            "order": "desc",
            "tie_break": "first",
            "windows": list(WINDOWS),
            "retention": RETENTION,
            "late_grace": "10m",
        }
        named = [{"name": n, "start": a, "end": b} for n, a, b in self.seasons]
        promo = {
            "windows": ["total", "day"],
            "retention": {"day": 3},
            "late_grace": "10m",
            "ends_at": self.ends_at,
        }
        document = {
            "timezone": self.zone,
            "types": {
                "arena": {**ranked, "seasons": {"every_days": 2, "anchor": self.anchor}},
                "cup": {**ranked, "seasons": named},
                "promo": promo,
            },
            "hot": [{"board": board} for board in HOT],
        }
        return yaml.safe_dump(document, sort_keys=False)

    def model(self) -> Model:
        tz = self.tz
        start = instant(self.start, tz)
        named = tuple(Span(n, instant(a, tz), instant(b, tz)) for n, a, b in self.seasons)
        seasons = {
            "arena": Seasons(every_days=2, anchor=date.fromisoformat(self.anchor)),
            "cup": Seasons(named=named),
        }
        low = (start - 70 * DAY) // (30 * MINUTE) * (30 * MINUTE)
        calendar = Calendar(tz, low, start + 100 * DAY, seasons)
        types = {name: BoardType(name, WINDOWS, RETENTION, GRACE) for name in RANKED}
        types["promo"] = BoardType("promo", ("total", "day"), {"day": 3}, GRACE, instant(self.ends_at, tz))
        return Model(calendar, types, SKEW)


SCENARIOS = {
    # an ISO week (Monday 05-31) and a month (06-01) begin; cup's second season is given with
    # an offset; arena's seasons start on 05-30 (events before count in none)
    "shanghai": Scenario(
        zone="Asia/Shanghai",
        start="2027-05-29T18:00",
        hours=72,
        anchor="2027-05-30",
        seasons=(
            ("s1", "2027-05-29T20:00", "2027-05-30T20:00"),
            ("s2", "2027-05-31T06:00+08:00", "2027-06-01T06:00"),
        ),
        gaps=("2027-05-31T01:00", "2027-06-01T12:00"),
        ends_at="2027-06-01T09:30",
        probes=("2027-05-30T20:00", "2027-05-31T00:00", "2027-06-01T00:00"),
        crosses=("day", "week", "month"),
    ),
    # clocks skip 02:00-03:00 on 03-14 (no 02:00/02:30 periods, no hour 02, a 23-hour day), a
    # week begins on 03-15; cup's gap spans the change
    "new_york_spring": Scenario(
        zone="America/New_York",
        start="2027-03-12T18:00",
        hours=66,
        anchor="2027-03-13",
        seasons=(
            ("s1", "2027-03-13T06:00", "2027-03-14T01:30"),
            ("s2", "2027-03-14T03:30", "2027-03-15T04:00"),
        ),
        gaps=("2027-03-14T01:45", "2027-03-14T03:15", "2027-03-13T03:00"),
        ends_at="2027-03-14T20:30",
        probes=("2027-03-14T01:30", "2027-03-14T03:00", "2027-03-14T03:30", "2027-03-15T00:00"),
        crosses=("day", "week"),
    ),
    # clocks repeat 01:00-02:00 on 11-07 (the 01:00 and 01:30 periods and hour 01 each span both
    # occurrences, a 25-hour day); cup's gap lies inside the repeated hour
    "new_york_autumn": Scenario(
        zone="America/New_York",
        start="2027-11-05T18:00",
        hours=66,
        anchor="2027-11-06",
        seasons=(
            ("s1", "2027-11-06T06:00", "2027-11-07T01:15-04:00"),
            ("s2", "2027-11-07T01:45-05:00", "2027-11-08T06:00"),
        ),
        gaps=("2027-11-07T01:15-05:00", "2027-11-07T01:30-04:00", "2027-11-06T03:00"),
        ends_at="2027-11-07T20:30",
        probes=(
            "2027-11-07T01:30-04:00",  # not the end of the 01:00 period: it runs on at 01:00 EST
            "2027-11-07T01:00-05:00",
            "2027-11-07T01:30-05:00",
            "2027-11-07T02:00-05:00",
            "2027-11-08T00:00",
        ),
        crosses=("day", "week"),
    ),
}


@dataclass
class Step:
    now: int  # the service clock while the step's messages are processed
    messages: list[Message] = field(default_factory=list)


class Stream:
    """Steps of the clock, each with the messages produced while it reads that time."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tz = scenario.tz
        self.start = instant(scenario.start, self.tz)
        self.end = self.start + scenario.hours * 3_600_000
        self.ends_at = instant(scenario.ends_at, self.tz)
        self.probes = [instant(p, self.tz) for p in (*scenario.probes, scenario.ends_at)]
        self.after_probes = {probe + GRACE for probe in self.probes}
        self.used: dict[str, set[int]] = {name: set() for name in MEMBERS}
        self.ids = 0

    def instant(self, text: str) -> int:
        return instant(text, self.tz)

    def steps(self) -> Iterator[Step]:
        points = {self.ends_at + MINUTE}
        for probe in self.probes:
            points |= {probe + GRACE - 1, probe + GRACE}
        t = self.start
        while t < self.end:
            points.add(t)
            t += self.rng.randint(15 * MINUTE, 55 * MINUTE)
        previous = self.start - 30 * MINUTE
        for now in sorted(p for p in points if p <= self.end):
            yield self._step(previous, now)
            previous = now

    def _step(self, previous: int, now: int) -> Step:
        step, rng = Step(now), self.rng
        for type_name in RANKED:
            for _ in range(rng.randint(0, 3)):
                self._ranked(step, type_name, rng.randint(previous + 1, now))
            if rng.random() < 0.4:  # late: within or beyond late_grace, maybe expired
                self._ranked(step, type_name, now - rng.randint(MINUTE, 300 * MINUTE))
            if rng.random() < 0.1:  # ahead of the clock (within the allowed skew): a later period
                self._ranked(step, type_name, now + rng.randint(MINUTE, AHEAD))
            for probe in self.probes:  # the last ms of the late grace of the period ending there
                if now == probe + GRACE - 1:
                    self._ranked(step, type_name, probe - 1)
                if now == probe + GRACE:  # and the first ms after it
                    self._ranked(step, type_name, probe - rng.randint(2, 10 * MINUTE))
                    self._ranked(step, type_name, probe)  # the next period's first instant
        end = self.ends_at
        if (now < end and rng.random() < 0.5) or (now > end + GRACE and rng.random() < 0.15):
            self._promo(step, rng.randint(previous + 1, now))
        if now == end + MINUTE:  # the latest event time accepted: the clock plus the allowed skew
            for ts in (now + SKEW, now + SKEW + 1):
                event = self._event("arena:cold", self._fresh("arena", ts), "arena")
                step.messages.append(Message("arena", now, [event], array=False))
            self._promo(step, end)  # at the end: closed
            self._promo(step, end - 1)  # before it, within the grace: counts
        if now == end + GRACE - 1:
            self._promo(step, end - 3)  # the last ms of the grace: counts
        if now == end + GRACE:
            self._promo(step, end - 4)  # before the end but processed after end + grace: closed
        return step

    def _event(self, board: str, ts: int, type_name: str) -> dict[str, Any]:
        self.ids += 1
        member = self.rng.choice(MEMBERS[type_name])
        return random_event(self.rng, f"e{self.ids}", board, member, ts=ts, weights=(60, 14, 16, 10))

    def _fresh(self, type_name: str, ts: int) -> int:
        """Each event of a type gets its own time: ties are decided by time alone."""
        return fresh_ts(self.used[type_name], ts)

    def _ranked(self, step: Step, type_name: str, ts: int) -> None:
        ts = self._fresh(type_name, ts)
        both = RANKED[type_name]
        boards = list(both) if self.rng.random() < 0.7 else [self.rng.choice(both)]
        events = [self._event(board, ts, type_name) for board in boards]
        self._send(step, type_name, ts, events, array=self.rng.random() < 0.5)

    def _promo(self, step: Step, ts: int) -> None:
        ts = self._fresh("promo", ts)
        self._send(step, "promo", ts, [self._event(PROMO, ts, "promo")], array=False)

    def _send(self, step: Step, key: str, ts: int, events: list[dict[str, Any]], array: bool) -> None:
        """Half the messages carry no ts: their Kafka timestamp is the event's time. The others
        are stamped when produced (the clock), which may be later than their ts."""
        if self.rng.random() < 0.5:
            for event in events:
                del event["ts"]
            step.messages.append(Message(key, ts, events, array or len(events) > 1))
        else:
            step.messages.append(Message(key, step.now, events, array or len(events) > 1))
