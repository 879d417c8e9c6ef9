"""The independent model behind tests/integration/test_periods_oracle.py: period ids, spans,
previous periods and expiries worked out from `zoneinfo` alone (nothing from common/ is
imported), and the boards a stream of events leaves when each event is processed at a known
service-clock time.

Spans come from a scan of UTC in 30-minute steps: every step's local wall-clock time names its
period in each window, and a period runs from the first step that names it to 30 minutes after
the last. Both zones modelled have whole-hour offsets, so every local 30-minute boundary is a
UTC one (the scan asserts it), a local time a DST change repeats names the same period in both
occurrences, and a skipped one is never seen: that period does not exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

HALF_HOUR = 1_800_000
SCANNED = ("30min", "hour", "day", "week", "month")


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def instant(text: str, tz: ZoneInfo) -> int:
    """An ISO instant; without an offset, local time in `tz` (its first occurrence)."""
    moment = datetime.fromisoformat(text)
    return ms(moment if moment.tzinfo is not None else moment.replace(tzinfo=tz, fold=0))


def label(window: str, local: datetime) -> str:
    if window == "30min":
        return f"{local:%Y-%m-%dT%H}:{local.minute // 30 * 30:02d}"
    if window == "hour":
        return f"{local:%Y-%m-%dT%H}"
    if window == "day":
        return f"{local:%Y-%m-%d}"
    if window == "week":
        year, week, _ = local.isocalendar()
        return f"{year:04d}-W{week:02d}"
    assert window == "month"
    return f"{local:%Y-%m}"


@dataclass(frozen=True)
class Span:
    id: str
    start: int  # the first instant of the period
    end: int  # after its last instant


@dataclass(frozen=True)
class Seasons:
    """A type's seasons: a rule (every N days from an anchor) or named [start, end) instants."""

    every_days: int = 0
    anchor: date | None = None
    named: tuple[Span, ...] = ()


class Calendar:
    """Every period of every window in [low, high) of one zone, in time order."""

    def __init__(self, tz: ZoneInfo, low: int, high: int, seasons: Mapping[str, Seasons]) -> None:
        self.tz = tz
        found: dict[str, dict[str, list[int]]] = {}
        for t in range(low, high, HALF_HOUR):
            aware = datetime.fromtimestamp(t / 1000, UTC).astimezone(tz)
            offset = aware.utcoffset()
            assert offset is not None and offset % timedelta(hours=1) == timedelta(0), tz.key
            local = aware.replace(tzinfo=None)
            names = {w: label(w, local) for w in SCANNED}
            for type_name, spec in seasons.items():
                if spec.anchor is not None and (k := (local.date() - spec.anchor).days) >= 0:
                    names[f"season@{type_name}"] = f"{spec.anchor.isoformat()}+{k // spec.every_days}"
            for window, pid in names.items():
                first_last = found.setdefault(window, {}).setdefault(pid, [t, t])
                first_last[1] = t
        self.spans: dict[str, list[Span]] = {}
        for window, periods in found.items():
            spans = sorted(
                (Span(p, a, b + HALF_HOUR) for p, (a, b) in periods.items()), key=lambda s: s.start
            )
            # the scan cuts the first and last periods: only a season numbered from 0 truly starts there
            if spans[0].start == low and not spans[0].id.endswith("+0"):
                spans = spans[1:]
            if spans[-1].end >= high:
                spans = spans[:-1]
            self.spans[window] = spans
        self.named = {f"season@{name}" for name, spec in seasons.items() if spec.named}
        for type_name, spec in seasons.items():
            if spec.named:
                self.spans[f"season@{type_name}"] = list(spec.named)
        self.by_id = {w: {s.id: i for i, s in enumerate(spans)} for w, spans in self.spans.items()}

    def key(self, type_name: str, window: str) -> str:
        return f"season@{type_name}" if window == "season" else window

    def at(self, type_name: str, window: str, ts: int) -> Span | None:
        """The period holding `ts`; None between (or before) seasons."""
        key = self.key(type_name, window)
        if key.startswith("season@"):
            return next((s for s in self.spans[key] if s.start <= ts < s.end), None)
        local = datetime.fromtimestamp(ts / 1000, UTC).astimezone(self.tz).replace(tzinfo=None)
        return self.spans[key][self.by_id[key][label(window, local)]]

    def previous(self, type_name: str, window: str, span: Span) -> Span | None:
        key = self.key(type_name, window)
        index = self.by_id[key][span.id]
        if index == 0:
            assert key.startswith("season@"), f"the scan starts too late for the period before {span}"
            return None
        return self.spans[key][index - 1]

    def expiry(self, type_name: str, window: str, span: Span, retention: int) -> int:
        """At the start of the period `retention` after it; a named season `retention` times its
        own length after its start. (Every retention here is at least 2, so no period expires
        before it ends, which a repeated 30-minute period with retention 1 would.)"""
        key = self.key(type_name, window)
        if key in self.named:
            return span.start + retention * (span.end - span.start)
        index = self.by_id[key][span.id] + retention
        assert index < len(self.spans[key]), f"the scan ends too early for the expiry of {span}"
        return self.spans[key][index].start

    def skipped(self, low: int, high: int) -> list[tuple[str, str]]:
        """(window, period id) of the 30min and hour periods between the local dates of `low`
        and `high` that no instant reads: a DST change skips their local times."""
        day = datetime.fromtimestamp(low / 1000, UTC).astimezone(self.tz).date()
        last = datetime.fromtimestamp(high / 1000, UTC).astimezone(self.tz).date()
        local, out = datetime(day.year, day.month, day.day), []
        while local.date() <= last:
            out += [(w, label(w, local)) for w in ("30min", "hour") if label(w, local) not in self.by_id[w]]
            local += timedelta(minutes=30)
        return sorted(set(out))

    def between(self, type_name: str, window: str, low: int, high: int) -> list[Span]:
        """The periods that start in [low, high]."""
        return [s for s in self.spans[self.key(type_name, window)] if low <= s.start <= high]


@dataclass(frozen=True)
class BoardType:
    name: str
    windows: tuple[str, ...]
    retention: Mapping[str, int]
    grace_ms: int
    ends_at: int | None = None


@dataclass
class Board:
    spec: BoardType
    seq: int = 0
    # instance ("total", "<window>:<period id>") -> member -> (score, tie ms)
    instances: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    expiry: dict[str, int] = field(default_factory=dict)  # instance -> expire-at ms


class Model:
    def __init__(self, calendar: Calendar, types: Mapping[str, BoardType], skew_ms: int) -> None:
        self.calendar = calendar
        self.skew_ms = skew_ms  # events are accepted up to the clock plus this
        self.types = types
        self.boards: dict[str, Board] = {}
        self.dead: list[tuple[str, bytes]] = []  # (reason, message value) dead-lettered

    def board(self, board: str) -> Board:
        spec = self.types[board.split(":", 1)[0]]
        return self.boards.setdefault(board, Board(spec))

    def expiry(self, spec: BoardType, window: str, span: Span) -> int:
        return self.calendar.expiry(spec.name, window, span, spec.retention[window])

    def apply(self, event: Mapping[str, Any], ts: int, now: int, raw: bytes) -> None:
        """One event with time `ts`, processed when the service clock reads `now`."""
        if ts > now + self.skew_ms:
            self.dead.append(("ts_out_of_range", raw))
            return
        state = self.board(event["board"])
        spec = state.spec
        if spec.ends_at is not None and (ts >= spec.ends_at or now >= spec.ends_at + spec.grace_ms):
            self.dead.append(("board_closed", raw))
            return
        targets: list[str] = []
        for window in spec.windows:
            if window == "total":
                targets.append("total")
                continue
            span = self.calendar.at(spec.name, window, ts)
            if span is None:
                continue  # between seasons
            expiry = self.expiry(spec, window, span)
            if now >= min(span.end + spec.grace_ms, expiry):
                continue  # closed beyond late_grace, or already expired
            instance = f"{window}:{span.id}"
            state.expiry[instance] = expiry
            targets.append(instance)
        state.seq += 1
        member, op, score = event["member"], event.get("op", "incr"), event.get("score", 0)
        for instance in targets:
            members = state.instances.setdefault(instance, {})
            old = members.get(member)
            if op == "delete":
                members.pop(member, None)
                continue
            if op == "incr":
                new = (old[0] if old else 0) + score
            elif op == "set" or old is None:
                new = score
            else:  # best, on a desc board
                new = max(old[0], score)
            if old is None or new != old[0]:
                members[member] = (new, ts)  # an unchanged score keeps the time it got there

    def ranking(self, board: str, instance: str) -> list[tuple[str, int]]:
        """(member, score) best first: desc scores, equal scores by who got there first."""
        members = self.boards[board].instances.get(instance, {}) if board in self.boards else {}
        ordered = sorted(members.items(), key=lambda item: (-item[1][0], item[1][1]))
        return [(member, score) for member, (score, _) in ordered]

    def ranks(self, board: str, instance: str | None) -> dict[str, int]:
        if instance is None:
            return {}
        return {member: rank for rank, (member, _) in enumerate(self.ranking(board, instance), 1)}
