"""The independent model: the board states the stream read back from `update_rank` must leave,
worked out from the contract with `zoneinfo` alone (nothing from common/, worker/ or api/).

Fed message by message in each partition's order (a board's events share a key, so one
partition holds them in the order they were produced). Per board it keeps the events applied
(the first of each id; a re-produced id changes nothing), each window instance's members
(score, tie ms), the members' meta, the seq (events applied), league seats, and the dead letters
each message must produce. Rolling windows are summed from the applied events when read, as of
the reading's clock. A period counts an event while its end plus the type's late grace is ahead
of the event's Kafka timestamp (the run's lag is far below every grace)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chaos.config import DIVISION_SIZE, RESULTS_TOP, TIERS, TYPES, TZ, Seasons, TypeSpec, kind

EXACT = 2**53 - 1
HOUR_MS = 3_600_000
ROLLING_BUCKETS = 2  # last_2h
State = dict[str, tuple[float, int]]  # member -> (score, tie: ms, or a seat's order in a division)


def _local(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, TZ)


def _start_of(local: datetime) -> int:
    return int(local.timestamp() * 1000)


def period(window: str, ts: int, seasons: dict[str, tuple[int, int]]) -> tuple[str, int] | None:
    """(period id, end ms) of `window` at `ts`; None outside every season."""
    local = _local(ts)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if window in ("hour", "30min", "1min"):
        length = {"hour": 60, "30min": 30, "1min": 1}[window] * 60_000
        start = ts - (ts - _start_of(midnight)) % length
        label = _local(start).strftime("%Y-%m-%dT%H" if window == "hour" else "%Y-%m-%dT%H:%M")
        return label, start + length
    if window == "day":
        return f"{local:%Y-%m-%d}", _start_of(midnight) + 86_400_000  # no DST in the zone
    if window == "week":
        year, week, weekday = local.isocalendar()
        return f"{year}-W{week:02d}", _start_of(midnight) + (8 - weekday) * 86_400_000
    if window == "month":
        nxt = midnight.replace(day=28).toordinal() + 4
        first = datetime.fromordinal(nxt).replace(day=1, tzinfo=TZ)
        return f"{local:%Y-%m}", _start_of(first)
    if window == "season":
        for name, (low, high) in seasons.items():
            if low <= ts < high:
                return name, high
        return None
    raise ValueError(window)


def bucket(ts: int) -> int:
    """The local hour holding `ts`, numbered (the zone keeps one offset all year)."""
    return (ts + int(_local(ts).utcoffset().total_seconds() * 1000)) // HOUR_MS  # type: ignore[union-attr]


def bucket_label(index: int) -> str:
    start = index * HOUR_MS
    return _local(start - int(_local(start).utcoffset().total_seconds() * 1000)).strftime("%Y-%m-%dT%H")  # type: ignore[union-attr]


def ranking(spec: TypeSpec, members: State, by_seat: bool = False) -> list[tuple[str, float]]:
    """Best first: score in the board's order, then the tie rule (a division: the seat), then
    the member's bytes in the reading direction (descending on a desc board, as Redis reads)."""
    desc = spec.order == "desc"
    names = sorted(members, key=lambda m: m.encode(), reverse=desc)

    def key(member: str) -> tuple[float, int]:
        score, tie = members[member]
        by_tie = tie if by_seat or spec.tie == "first" else -tie if spec.tie == "last" else 0
        return (-score if desc else score, by_tie)

    names.sort(key=key)
    return [(m, members[m][0]) for m in names]


@dataclass
class Applied:
    op: str
    member: str
    score: float
    ts: int


@dataclass
class Board:
    name: str
    spec: TypeSpec
    seq: int = 0
    seen: dict[str, int] = field(default_factory=dict)  # id -> the Kafka timestamp it was applied at
    instances: dict[str, State] = field(
        default_factory=dict
    )  # "total", "day:2026-11-30", "season:s1@bronze.1"
    meta: dict[str, Any] = field(default_factory=dict)
    log: list[Applied] = field(default_factory=list)  # what a rolling window sums (rolling types only)
    seats: dict[str, int] = field(default_factory=dict)  # league: member -> order in bronze
    registered: set[str] = field(default_factory=set)  # result periods a scoring event reached
    period_ends: dict[str, int] = field(default_factory=dict)


def _remember_meta(b: Board, ev: Applied, meta: Any) -> None:
    """The latest meta wins; a delete forgets it."""
    if ev.op == "delete":
        b.meta.pop(ev.member, None)
    elif meta is not None:
        b.meta[ev.member] = meta


@dataclass(frozen=True)
class DeadLetter:
    partition: int
    offset: int
    index: int | None
    reason: str


class Model:
    def __init__(self, start_ms: int) -> None:
        self.seasons = Seasons(start_ms).spans()
        self.boards: dict[str, Board] = {}
        self.dead: list[DeadLetter] = []
        self.events = 0  # valid events fed (duplicates included)

    def board(self, name: str) -> Board:
        if name not in self.boards:
            self.boards[name] = Board(name, TYPES[kind(name)])
        return self.boards[name]

    def dead_letter(self, partition: int, offset: int, index: int | None, reason: str) -> None:
        self.dead.append(DeadLetter(partition, offset, index, reason))

    def _instances(self, b: Board, ts: int, now: int) -> list[str]:
        out = []
        for window in b.spec.windows:
            if window == "total":
                out.append("total")
            elif not window.startswith("last_"):
                found = period(window, ts, self.seasons)
                if found is not None and found[1] + b.spec.grace_ms > now:
                    out.append(f"{window}:{found[0]}")
                    b.period_ends[f"{window}:{found[0]}"] = found[1]
        return out

    @staticmethod
    def _plan(b: Board, inst: str, ev: Applied) -> tuple[float, int] | str | None:
        """The member's new state in the instance: None (gone), or "same" (unchanged)."""
        old = b.instances.get(inst, {}).get(ev.member)
        if ev.op == "delete":
            return "same" if old is None else None
        if ev.op == "incr":
            new = (old[0] if old else 0.0) + ev.score
        elif ev.op == "set" or old is None:
            new = ev.score
        else:
            new = min(ev.score, old[0]) if b.spec.order == "asc" else max(ev.score, old[0])
        return "same" if old is not None and new == old[0] else (new, ev.ts)

    def _division(self, b: Board, ev: Applied) -> str | None:
        """The league division the event counts in: its member's, or the next seat's."""
        found = period("season", ev.ts, self.seasons)
        if found is None or (ev.member not in b.seats and ev.op == "delete"):
            return None
        order = b.seats.get(ev.member, len(b.seats))
        return f"season:{found[0]}@{TIERS[0]}.{order // DIVISION_SIZE + 1}"

    def apply(
        self, event: dict[str, Any], kafka_ts: int, partition: int, offset: int, index: int | None
    ) -> None:
        self.events += 1
        b = self.board(str(event["board"]))
        ts = int(event["ts"]) if event.get("ts") is not None else kafka_ts
        ev = Applied(str(event.get("op") or "incr"), str(event["member"]), float(event.get("score") or 0), ts)
        instances = self._instances(b, ts, kafka_ts)
        division = self._division(b, ev) if kind(b.name) == "arena" else None
        if kind(b.name) == "arena":  # the season is played in divisions
            instances = [i for i in instances if not i.startswith("season:")] + (
                [division] if division else []
            )
        if ev.op != "delete":  # registered before it is applied: a duplicate's period too (period-results.md)
            b.registered.update(inst for inst in instances if inst.startswith("1min:"))
        planned = {inst: self._plan(b, inst, ev) for inst in instances}
        planned = {inst: p for inst, p in planned.items() if p != "same"}
        if any(isinstance(p, tuple) and abs(p[0]) > EXACT for p in planned.values()):
            if str(event["id"]) not in b.seen:
                self.dead_letter(partition, offset, index, "score_out_of_range")
            return
        if str(event["id"]) in b.seen:
            return
        b.seen[str(event["id"])] = kafka_ts
        b.seq += 1
        if division is not None and ev.op != "delete":
            b.seats.setdefault(ev.member, len(b.seats))
        for inst, new_state in planned.items():
            members = b.instances.setdefault(inst, {})
            if not isinstance(new_state, tuple):
                del members[ev.member]
            else:
                members[ev.member] = (new_state[0], b.seats[ev.member]) if "@" in inst else new_state
        if any(w.startswith("last_") for w in b.spec.windows):
            b.log.append(ev)
        _remember_meta(b, ev, event.get("meta"))

    # --- reading --------------------------------------------------------------------------
    def rolling(self, b: Board, now: int) -> tuple[str, State]:
        """The current last_2h period at `now`: its id and members (module docstring)."""
        q = bucket(now)
        values: dict[str, dict[int, float]] = {}
        ties: dict[str, int] = {}
        for ev in b.log:
            at = bucket(ev.ts)
            if ev.op == "delete":
                values.pop(ev.member, None)
                ties.pop(ev.member, None)
                continue
            if not q - ROLLING_BUCKETS < at <= q:
                continue
            held = values.setdefault(ev.member, {})
            old = held.get(at)
            if ev.op == "incr":
                held[at] = (old or 0.0) + ev.score
            elif ev.op == "set" or old is None:
                held[at] = ev.score
            else:
                held[at] = min(old, ev.score) if b.spec.order == "asc" else max(old, ev.score)
            ties[ev.member] = max(ties.get(ev.member, ev.ts), ev.ts)
        return bucket_label(q), {m: (sum(h.values()), ties[m]) for m, h in values.items()}

    def member_windows(self) -> int:
        """Members summed over every window instance of every board (rolling windows aside)."""
        return sum(len(members) for b in self.boards.values() for members in b.instances.values())

    def ids_applied_since(self, since_ms: int) -> int:
        """Ids first applied (by their message's Kafka timestamp) at `since_ms` or later: what the
        id window remembers."""
        return sum(1 for b in self.boards.values() for at in b.seen.values() if at >= since_ms)

    def ranked(self, board: str, inst: str) -> list[tuple[str, float]]:
        b = self.boards[board]
        return ranking(b.spec, b.instances.get(inst, {}), by_seat="@" in inst)

    def result_keys(self) -> set[str]:
        """Every period result an event registered (due or not)."""
        return {
            f"{b.name}|{inst.replace(':', '|', 1)}" for b in self.boards.values() for inst in b.registered
        }

    def first_result_due(self, settle_ms: int) -> int | None:
        """When the earliest period result is due (ms), if any is."""
        dues = [
            b.period_ends[i] + b.spec.grace_ms + settle_ms for b in self.boards.values() for i in b.registered
        ]
        return min(dues, default=None)

    def results(self, now: int, settle_ms: int) -> dict[str, dict[str, Any]]:
        """The period results due by `now` (and `settle_ms` for the emitter): key -> body."""
        out = {}
        for b in self.boards.values():
            for inst in sorted(b.registered):
                end = b.period_ends[inst]
                if end + b.spec.grace_ms + settle_ms > now:
                    continue
                window, pid = inst.split(":", 1)
                ranked = self.ranked(b.name, inst)
                top = [
                    {"rank": r, "member": m, "score": s} for r, (m, s) in enumerate(ranked[:RESULTS_TOP], 1)
                ]
                out[f"{b.name}|{window}|{pid}"] = {"board": b.name, "window": window, "period": pid,
                                                    "closed_at": end, "members": len(ranked), "top": top}  # fmt: skip
        return out
