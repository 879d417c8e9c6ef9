"""The independent model behind tests/integration/test_rolling_oracle.py: rolling windows
`last_<N>h|d|w|m` (issue 12's SPEC) worked out by brute force from `zoneinfo` alone (nothing
from common/ or worker/ is imported; period ids are tests/period_model.py's).

Buckets. A unit's buckets (local hours, local days, ISO weeks from Monday, months) come from a
scan of UTC hour by hour: each hour's local wall-clock time names its bucket, and a bucket runs
from the first hour that names it to the end of the last. The zones modelled have whole-hour
offsets (the scan asserts it), so every local hour boundary is a UTC one: the local hour a DST
change repeats is ONE bucket spanning both occurrences (`2026-11-01T01`, two hours long), and a
skipped one is never seen, so it names no bucket. Bucket k-1 is the bucket before bucket k.

Periods. Rolling period q (named by bucket q) sums buckets q-N+1 .. q. The model keeps every
applied event with the service clock at its apply time, and computes a period from scratch:

  * a period q *accepts* events while the clock is before min(end(q) + late_grace, expiry(q)),
    expiry(q) = the start of bucket q + retention (the previous period stays readable while q
    is current with the default retention 2); an event applied while q is still ahead of the
    next period (q > cur + 1) is stored in its bucket and counts once q comes, so it is simply
    counted;
  * a scoring event (incr, set, best) with its ts in bucket b counts in q iff q accepted it
    and q-N+1 <= b <= q;
  * a delete counts in q iff q accepted it, whatever its ts: it clears the member out of every
    bucket, so out of the current period, the next one and every later one, and out of closed
    periods still in their late grace; closed periods beyond it keep the member;
  * the counted events of q are replayed in apply order: a delete forgets the member, incr adds
    to the member's value in the event's bucket (absent = 0), set overwrites that bucket's
    value, best keeps the better of it and the score by the board's order (absent: the score);
  * a member is in q iff it has a bucket value after its last counted delete; its score is the
    sum of its bucket values, its tie time the latest ts among its counted events after that
    delete (every such event, also a `best` that did not improve or a `set` overwritten since).

Order: the score in the board's order (desc: higher first), then the tie rule (first: the
earlier tie time ranks higher; last: the later; none: no time), then the member id bytewise in
the board's reading direction: ascending on asc boards, descending on desc boards, which Redis
reads from the top of the zset (ZREVRANGE), as tests/apply_model.py orders calendar windows.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from tests.period_model import label as period_label

HOUR = 3_600_000
DAY = 24 * HOUR
MINUTE = 60_000
UNITS = ("h", "d", "w", "m")
EARLIEST_MS = 946_684_800_000  # 2000-01-01T00:00Z: an older ts is dead-lettered
DEFAULT_RETENTION = 2
_ROLLING = re.compile(r"last_([1-9][0-9]*)([hdwm])")
_KINDS = {"h": "hour", "d": "day", "w": "week", "m": "month"}  # a unit's buckets: these periods


def label(unit: str, local: datetime) -> str:
    """The id of the bucket of `unit` holding the local wall-clock time `local`: the calendar
    period's id of the unit's kind, as the period model names it."""
    return period_label(_KINDS[unit], local)


@dataclass(frozen=True)
class Bucket:
    id: str
    start: int  # its first instant
    end: int  # after its last instant


class Buckets:
    """Every whole bucket of one unit inside [low, high), in time order."""

    def __init__(self, tz: ZoneInfo, unit: str, low: int, high: int) -> None:
        self.unit = unit
        spans: list[list[Any]] = []  # [id, start, end]
        for t in range(low // HOUR * HOUR, high, HOUR):
            aware = datetime.fromtimestamp(t / 1000, UTC).astimezone(tz)
            offset = aware.utcoffset()
            assert offset is not None and offset % timedelta(hours=1) == timedelta(0), tz.key
            name = label(unit, aware.replace(tzinfo=None))
            if spans and spans[-1][0] == name:
                spans[-1][2] = t + HOUR
            else:
                spans.append([name, t, t + HOUR])
        whole = spans[1:-1]  # the scan cuts the first and the last
        self.list = [Bucket(name, start, end) for name, start, end in whole]
        self.starts = [b.start for b in self.list]
        self.index = {b.id: i for i, b in enumerate(self.list)}
        assert len(self.index) == len(self.list), f"a {unit} bucket id comes back after another"

    def at(self, ts: int) -> int:
        """The index of the bucket holding the instant `ts`."""
        i = bisect.bisect_right(self.starts, ts) - 1
        assert 0 <= i < len(self.list) and ts < self.list[i].end, f"{ts} is outside the scanned {self.unit}"
        return i

    def find(self, bucket_id: str) -> int:
        return self.index[bucket_id]

    def __getitem__(self, i: int) -> Bucket:
        assert 0 <= i < len(self.list), f"bucket {i} of {self.unit} is outside the scan"
        return self.list[i]

    def bucket_at(self, ts: int) -> Bucket:
        return self.list[self.at(ts)]


@dataclass(frozen=True)
class Rolling:
    name: str
    count: int  # N
    unit: str  # h | d | w | m

    @classmethod
    def parse(cls, name: str) -> Rolling:
        found = _ROLLING.fullmatch(name)
        assert found is not None, f"{name!r} is not a rolling window"
        return cls(name, int(found[1]), found[2])


def is_rolling(window: str) -> bool:
    return _ROLLING.fullmatch(window) is not None


@dataclass(frozen=True)
class BoardType:
    name: str
    windows: tuple[str, ...]  # every window of the type; the model answers for its rolling ones
    order: str = "desc"  # desc | asc
    tie: str = "first"  # first | last | none
    grace_ms: int = 10 * MINUTE
    retention: Mapping[str, int] = field(default_factory=dict)  # rolling window -> periods kept

    @property
    def rolling(self) -> tuple[str, ...]:
        return tuple(w for w in self.windows if is_rolling(w))

    def kept(self, window: str) -> int:
        return self.retention.get(window, DEFAULT_RETENTION)

    def better(self, a: float, b: float) -> float:
        return max(a, b) if self.order == "desc" else min(a, b)


@dataclass(frozen=True)
class Applied:
    seq: int  # its place in its board's apply order, from 1
    op: str  # incr | set | best | delete
    member: str
    score: float
    ts: int
    now: int  # the service clock when it was applied
    bucket: Mapping[str, int]  # unit -> the index of the bucket holding ts


@dataclass(frozen=True)
class Item:
    rank: int
    member: str
    score: float
    tie: int


class Model:
    """Boards of rolling windows fed with events, each applied when the service clock read a known
    time; a period is computed from every event applied so far."""

    def __init__(
        self, tz: ZoneInfo, low: int, high: int, types: Mapping[str, BoardType], skew_ms: int = DAY
    ) -> None:
        self.tz = tz
        self.buckets = {unit: Buckets(tz, unit, low, high) for unit in UNITS}
        self.types = types
        self.skew_ms = skew_ms  # events are accepted up to the clock plus this
        self.events: dict[str, list[Applied]] = {}
        self.dead: list[tuple[str, str]] = []  # (reason, event id)
        # (board, window, period, events applied on the board) -> members: a period only changes
        # with the board's events
        self._members: dict[tuple[str, str, str, int], dict[str, tuple[float, int]]] = {}

    # --- time ---------------------------------------------------------------------------------
    def spec(self, board: str) -> BoardType:
        return self.types[board.split(":", 1)[0]]

    def units(self, window: str) -> Buckets:
        return self.buckets[Rolling.parse(window).unit]

    def current(self, window: str, now: int) -> str:
        """The id of the window's current period at the clock instant `now`."""
        return self.units(window).bucket_at(now).id

    def shift(self, window: str, period: str, steps: int) -> str:
        """The period `steps` after (before, if negative) `period`."""
        units = self.units(window)
        return units[units.find(period) + steps].id

    def previous(self, window: str, period: str) -> str:
        return self.shift(window, period, -1)

    def span(self, window: str, period: str) -> Bucket:
        units = self.units(window)
        return units[units.find(period)]

    def expiry(self, board: str, window: str, period: str) -> int:
        """When the period stops being readable: at the start of the period `retention` after it."""
        return self.units(window)[self.units(window).find(period) + self.spec(board).kept(window)].start

    def limit(self, board: str, window: str, period: str) -> int:
        """Events applied from this clock reading on no longer count in the period."""
        spec = self.spec(board)
        return min(self.span(window, period).end + spec.grace_ms, self.expiry(board, window, period))

    def window_buckets(self, window: str, period: str) -> list[Bucket]:
        """The buckets the period sums, oldest first."""
        rolling, units = Rolling.parse(window), self.units(window)
        q = units.find(period)
        return [units[i] for i in range(q - rolling.count + 1, q + 1)]

    # --- events -------------------------------------------------------------------------------
    def apply(self, event: Mapping[str, Any], ts: int, now: int) -> bool:
        """One event with time `ts` (its own or its Kafka timestamp), applied when the service
        clock reads `now`; False: dead-lettered (ts out of range)."""
        if ts > now + self.skew_ms or ts < EARLIEST_MS:
            self.dead.append(("ts_out_of_range", str(event["id"])))
            return False
        board = str(event["board"])
        self.spec(board)  # a known type
        applied = self.events.setdefault(board, [])
        op = str(event.get("op", "incr"))
        assert op in ("incr", "set", "best", "delete"), op
        applied.append(
            Applied(
                seq=len(applied) + 1,
                op=op,
                member=str(event["member"]),
                score=event.get("score", 0),
                ts=ts,
                now=now,
                bucket={unit: units.at(ts) for unit, units in self.buckets.items()},
            )
        )
        return True

    def clear(self) -> None:
        """Forget every event (and the periods computed from them): the calendar is kept."""
        self.events, self.dead = {}, []
        self._members.clear()

    def seq(self, board: str) -> int:
        """Events applied on the board."""
        return len(self.events.get(board, []))

    @property
    def boards(self) -> list[str]:
        return sorted(self.events)

    def counted(self, board: str, window: str, period: str) -> list[Applied]:
        """The events period `period` of the window counts, in apply order."""
        rolling = Rolling.parse(window)
        q = self.units(window).find(period)
        low, limit = q - rolling.count + 1, self.limit(board, window, period)
        out: list[Applied] = []
        for event in self.events.get(board, []):
            if event.now >= limit:
                continue
            if event.op == "delete" or low <= event.bucket[rolling.unit] <= q:
                out.append(event)
        return out

    def members(self, board: str, window: str, period: str) -> dict[str, tuple[float, int]]:
        """member -> (score, tie ms) in the period, as of every event applied so far."""
        key = (board, window, period, self.seq(board))
        if key not in self._members:
            if len(self._members) > 50_000:
                self._members.clear()
            self._members[key] = self._compute(board, window, period)
        return dict(self._members[key])

    def _compute(self, board: str, window: str, period: str) -> dict[str, tuple[float, int]]:
        spec, unit = self.spec(board), Rolling.parse(window).unit
        values: dict[str, dict[int, float]] = {}  # member -> bucket -> value
        ties: dict[str, int] = {}
        for event in self.counted(board, window, period):
            member = event.member
            if event.op == "delete":
                values.pop(member, None)
                ties.pop(member, None)
                continue
            held = values.setdefault(member, {})
            b, old = event.bucket[unit], held.get(event.bucket[unit])
            if event.op == "incr":
                held[b] = (0 if old is None else old) + event.score
            elif event.op == "set" or old is None:
                held[b] = event.score
            else:
                held[b] = spec.better(old, event.score)
            ties[member] = max(ties.get(member, event.ts), event.ts)
        return {member: (sum(held.values()), ties[member]) for member, held in values.items()}

    # --- reading ------------------------------------------------------------------------------
    def ranking(self, board: str, window: str, period: str) -> list[Item]:
        """The period's members best first (SPEC order, see the module's docstring)."""
        spec = self.spec(board)
        members = self.members(board, window, period)
        # the last key first: member ids in the reading direction, then stable sorts on top
        names = sorted(members, key=lambda m: m.encode(), reverse=spec.order == "desc")

        def key(member: str) -> tuple[float, int]:
            score, tie = members[member]
            by_score = -score if spec.order == "desc" else score
            by_tie = tie if spec.tie == "first" else -tie if spec.tie == "last" else 0
            return (by_score, by_tie)

        names.sort(key=key)
        return [Item(rank, m, members[m][0], members[m][1]) for rank, m in enumerate(names, 1)]

    def ranks(self, board: str, window: str, period: str | None) -> dict[str, int]:
        if period is None:
            return {}
        return {item.member: item.rank for item in self.ranking(board, window, period)}

    def readable(self, board: str, window: str, period: str, now: int) -> bool:
        """Not past its retention at `now` (also true of periods not begun yet)."""
        return now < self.expiry(board, window, period)

    def trend(self, board: str, window: str, period: str, now: int) -> dict[str, int]:
        """member -> its rank in the previous period (trend=1's prev_rank); empty (every
        prev_rank null) when that period is past its retention at `now`."""
        before = self.previous(window, period)
        if not self.readable(board, window, before, now):
            return {}
        return self.ranks(board, window, before)

    def top(self, board: str, window: str, period: str, now: int, trend: bool) -> list[dict[str, Any]]:
        """The items of a `top` answer with limit 500 (and trend=1's prev_rank)."""
        before = self.trend(board, window, period, now) if trend else {}
        items: list[dict[str, Any]] = []
        for item in self.ranking(board, window, period)[:500]:
            items.append({"rank": item.rank, "member": item.member, "score": item.score})
            if trend:
                items[-1]["prev_rank"] = before.get(item.member)
        return items
