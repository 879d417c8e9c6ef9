"""The independent model behind tests/integration/test_apply_properties.py: the contract's
numbers written out, period ids, ends and expiries from `zoneinfo` alone (no common/periods.py),
the expected board state of a stream, and the comparison with Redis."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, cast
from zoneinfo import ZoneInfo

import redis
import yaml
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from common.boards import BoardsConfig, parse_boards
from common.events import UpdateEvent, parse_message, ts_ceiling
from common.idwindow import fingerprint, key_ttl_ms
from common.store.encoding import MemberState, Status
from common.store.keys import index_expiry
from tests.redis_layout import index_keys, read_general
from worker.apply import Applier, Outcome, Position, Source
from worker.boardstate import DEFAULT_MAX_CELLS as DEFAULT_CELLS

# --- the contract's numbers, written out (and checked against the product's constants) ---------

EXACT = 2**53 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_TS = (datetime(2000, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
MAX_ID = 128
MAX_MEMBER = 128
MAX_META = 1024
MAX_ARRAY = 500
SKEW_S = 86_400  # the default allowed future skew
ID_WINDOW_S = 3600
SOURCE = Source("src", 0, "topic-id", -1)  # every case's messages come from one partition
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

ZONES = (
    "UTC",
    "Asia/Shanghai",
    "America/New_York",  # DST: a missing and a repeated hour
    "Australia/Lord_Howe",  # 30-minute DST: a 30-minute hour and a 90-minute hour
    "Asia/Kathmandu",  # +05:45
    "America/Santiago",  # DST at midnight: a day that starts at 01:00, a 25-hour Saturday
)
CALENDAR = ("hour", "day", "week", "month", "year")
WINDOWS = ("total", *CALENDAR)
GRACES = {"0s": 0, "10m": 600_000, "1h": HOUR_MS, "1d": DAY_MS, "40d": 40 * DAY_MS}
RETENTIONS = (1, 2, 3, 7, 100)
SCOPES = ("", ":a", ":Room-42.x_y:z")
TIE_HEX = 12  # the zset member carries a fixed-width hex tie prefix (unless tie_break: none)
# members: no control characters, line separators or bidi overrides (docs/contract.md §2:
# "no control characters")
_NOT_IN_MEMBERS = "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
MEMBER_CHARS = st.characters(exclude_categories=("Cs", "Cc"), exclude_characters=_NOT_IN_MEMBERS)


def _ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def _base_now() -> int:
    """A fixed instant for the whole run, months ahead of the real clock (see the module doc)."""
    return _ms(datetime(datetime.now(UTC).year + 1, 6, 17, 9, 26, 40, 123_000, tzinfo=UTC))


BASE_NOW = _base_now()


def _iso(ts: int) -> str:
    return (EPOCH + timedelta(milliseconds=ts)).isoformat(timespec="milliseconds")


# --- periods, independently of common/periods.py ------------------------------------------------


def local_time(tz: ZoneInfo, ts: int) -> datetime:
    return (EPOCH + timedelta(milliseconds=ts)).astimezone(tz)


def period_id(tz: ZoneInfo, window: str, ts: int) -> str:
    """The id of the `window` period at `ts`: by the local wall clock, so a repeated DST hour is
    one hour id (one period) and a skipped one has none."""
    t = local_time(tz, ts)
    if window == "hour":
        return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}"
    if window == "day":
        return f"{t.year:04d}-{t.month:02d}-{t.day:02d}"
    if window == "week":
        iso = t.isocalendar()
        return f"{iso.year:04d}-W{iso.week:02d}"
    if window == "month":
        return f"{t.year:04d}-{t.month:02d}"
    assert window == "year"
    return f"{t.year:04d}"


# longer than any period of the kind (an hour lasts at most 2 h: a repeated DST hour)
_SPAN = {
    "hour": 3 * HOUR_MS,
    "day": 2 * DAY_MS,
    "week": 8 * DAY_MS,
    "month": 32 * DAY_MS,
    "year": 367 * DAY_MS,
}
_ends: dict[tuple[str, str, str], int] = {}
_expiries: dict[tuple[str, str, str, int], int] = {}


def period_end(tz: ZoneInfo, window: str, ts: int) -> int:
    """The first ms after `ts` whose period id differs: the end of the period containing `ts`."""
    pid = period_id(tz, window, ts)
    key = (tz.key, window, pid)
    end = _ends.get(key)
    if end is None:
        end = _ends[key] = _edge(tz, window, pid, ts, ts + _SPAN[window])
    return end


def period_start(tz: ZoneInfo, window: str, ts: int) -> int:
    """The first ms whose period id is that of `ts` (ids never come back: a binary search)."""
    return _edge(tz, window, period_id(tz, window, ts), ts, ts - _SPAN[window])


def _edge(tz: ZoneInfo, window: str, pid: str, inside: int, outside: int) -> int:
    """The later of the two ms on either side of the edge of period `pid` between `inside` (in
    it) and `outside` (not): its end when `outside` is later, its start when earlier."""
    assert period_id(tz, window, outside) != pid
    while abs(outside - inside) > 1:
        mid = (inside + outside) // 2
        if period_id(tz, window, mid) == pid:
            inside = mid
        else:
            outside = mid
    return max(inside, outside)


def period_expiry(tz: ZoneInfo, window: str, ts: int, retention: int) -> int:
    """The start of the period `retention` periods after the one containing `ts`."""
    key = (tz.key, window, period_id(tz, window, ts), retention)
    expiry = _expiries.get(key)
    if expiry is None:
        expiry = period_end(tz, window, ts)
        for _ in range(retention - 1):
            expiry = period_end(tz, window, expiry)
        _expiries[key] = expiry
    return expiry


_transitions: dict[str, tuple[int, ...]] = {}


def offset_changes(zone: str) -> tuple[int, ...]:
    """Every instant in the accepted range (and a while after) where the zone's UTC offset changes."""
    found = _transitions.get(zone)
    if found is not None:
        return found
    tz = ZoneInfo(zone)
    out: list[int] = []
    t, offset = MIN_TS, local_time(tz, MIN_TS).utcoffset()
    while t < BASE_NOW + 3 * 366 * DAY_MS:
        nxt = t + DAY_MS
        nxt_offset = local_time(tz, nxt).utcoffset()
        if nxt_offset != offset:
            low, high = t, nxt
            while high - low > 1:
                mid = (low + high) // 2
                if local_time(tz, mid).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            out.append(high)
            offset = nxt_offset
        t = nxt
    _transitions[zone] = tuple(out)
    return _transitions[zone]


# --- the generated stream -----------------------------------------------------------------------


@dataclass(frozen=True)
class TypeSpec:
    name: str
    order: str  # desc | asc
    tie: str  # first | last | none
    windows: tuple[str, ...]
    retention: Mapping[str, int]
    max_members: int | None
    grace: str  # a key of GRACES

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "order": self.order,
            "tie_break": self.tie,
            "windows": list(self.windows),
            "retention": dict(self.retention),
            "late_grace": self.grace,
        }
        if self.max_members is not None:
            out["max_members"] = self.max_members
        return out


@dataclass
class Message:
    kafka_ts: int  # stands in for `ts` where an event has none, as the worker does
    events: list[dict[str, Any]]
    array: bool  # sent as a JSON array (a single event too), else as one object

    def value(self) -> bytes:
        document: Any = self.events if self.array else self.events[0]
        return json.dumps(document, ensure_ascii=False).encode()


@dataclass
class Case:
    zone: str
    now: int
    types: list[TypeSpec]
    hot: str | None
    batches: list[list[Message]]  # one apply_isolated call per batch

    def config(self) -> str:
        document: dict[str, Any] = {
            "timezone": self.zone,
            "types": {spec.name: spec.config() for spec in self.types},
        }
        if self.hot is not None:
            document["hot"] = [{"board": self.hot}]
        return yaml.safe_dump(document, allow_unicode=True)

    def __repr__(self) -> str:  # the whole case is in the failure's note; a 500-event repr is too big
        events = sum(len(m.events) for batch in self.batches for m in batch)
        return f"<Case {self.zone} now={_iso(self.now)} {len(self.types)} types {events} events>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis' printer: keep it short
        printer.text(repr(self))

    def describe(self) -> str:
        """Everything needed to replay the case by hand."""
        lines = [f"now = {self.now} ({_iso(self.now)})", self.config().rstrip()]
        for number, batch in enumerate(self.batches):
            lines.append(f"apply_isolated call {number}:")
            lines += [f"  kafka ts {m.kafka_ts} ({_iso(m.kafka_ts)}): {m.value().decode()}" for m in batch]
        return "\n".join(lines)


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    status: Status
    seq: int
    late: int
    states: dict[str, tuple[float, int] | None]  # non-late instance -> member state after the event
    meta: Any  # the member's meta after the event (None: none)


@dataclass
class BoardModel:
    spec: TypeSpec
    seq: int = 0
    ids: set[str] = field(default_factory=set)
    fenced: bool = False  # an event of the board reached apply.lua with a position
    meta: dict[str, Any] = field(default_factory=dict)
    members: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)
    expiry: dict[str, int] = field(default_factory=dict)  # calendar instance -> expire-at ms


class Model:
    def __init__(self, case: Case) -> None:
        self.tz = ZoneInfo(case.zone)
        self.now = case.now
        self.specs = {spec.name: spec for spec in case.types}
        self.boards: dict[str, BoardModel] = {}

    def instances(self, spec: TypeSpec, ts: int) -> tuple[list[tuple[str, int | None]], int]:
        """(instance, expiry) pairs an event at `ts` counts in, and how many windows it missed."""
        out: list[tuple[str, int | None]] = []
        late = 0
        grace = GRACES[spec.grace]
        for window in spec.windows:
            if window == "total":
                out.append(("total", None))
                continue
            end = period_end(self.tz, window, ts)
            if self.now >= end + grace:
                late += 1
                continue
            expiry = period_expiry(self.tz, window, ts, spec.retention[window])
            if self.now >= min(end + grace, expiry):
                late += 1
                continue
            out.append((f"{window}:{period_id(self.tz, window, ts)}", expiry))
        return out, late

    def apply(self, event: Mapping[str, Any], ts: int) -> Expected:
        board, member = event["board"], event["member"]
        spec = self.specs[board.split(":", 1)[0]]
        state = self.boards.setdefault(board, BoardModel(spec))
        state.fenced = True
        op = event.get("op", "incr")
        score = float(event.get("score", 0))
        instances, late = self.instances(spec, ts)
        planned: dict[str, tuple[float, int] | None] = {}
        for instance, _ in instances:
            old = state.members.get(instance, {}).get(member)
            if op == "delete":
                if old is not None:
                    planned[instance] = None
                continue
            if op == "incr":
                new = (old[0] if old is not None else 0.0) + score
            elif op == "set" or old is None:
                new = score
            else:  # best
                better = score < old[0] if spec.order == "asc" else score > old[0]
                new = score if better else old[0]
            if old is not None and new == old[0]:
                continue  # unchanged: keeps the time it got there
            planned[instance] = (new, ts)
        if event["id"] in state.ids:
            status = Status.DUPLICATE
        elif any(p is not None and abs(p[0]) > EXACT for p in planned.values()):
            status = Status.OUT_OF_RANGE
        else:
            status = Status.APPLIED
            state.ids.add(event["id"])
            state.seq += 1
            for instance, expiry in instances:
                if expiry is not None:
                    state.expiry[instance] = expiry
            for instance, new_state in planned.items():
                members = state.members.setdefault(instance, {})
                if new_state is None:
                    del members[member]
                else:
                    members[member] = new_state
            if op == "delete":
                state.meta.pop(member, None)
            elif event.get("meta") is not None:
                state.meta[member] = event["meta"]
        states = {instance: state.members.get(instance, {}).get(member) for instance, _ in instances}
        return Expected(status, state.seq, late, states, state.meta.get(member))


def ranking(spec: TypeSpec, members: Mapping[str, tuple[float, int]]) -> list[str]:
    """Rank order: better score first, then the tie rule, then the member's bytes in the reading
    direction (descending for desc boards, which are read from the top of the zset)."""

    def tie_term(tie: int) -> int:
        return tie if spec.tie == "first" else -tie if spec.tie == "last" else 0

    items = [(score, tie_term(tie), name.encode(), name) for name, (score, tie) in members.items()]
    if spec.order == "asc":
        return [name for *_, name in sorted(items)]
    flipped = sorted((score, -term, raw, name) for score, term, raw, name in items)
    return [name for *_, name in reversed(flipped)]


# --- running a case and comparing -----------------------------------------------------------

_examples = itertools.count()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _check_outcome(outcome: Outcome, expected: Expected, hot: bool) -> None:
    what = f"outcome of {outcome.event}"
    assert outcome.status is expected.status, what
    assert outcome.seq == expected.seq, what
    assert outcome.late_windows == expected.late, what
    if not hot:
        assert outcome.states == {}, what
        assert outcome.meta is None, what
        return
    want = {k: None if v is None else MemberState(v[0], v[1]) for k, v in expected.states.items()}
    assert outcome.states == want, what
    assert (None if outcome.meta is None else json.loads(outcome.meta)) == expected.meta, what


def _event(label: str) -> None:
    if currently_in_test_context():
        event(label)


def run_case(case: Case, client: redis.Redis, key_prefix: str, turns: Sequence[str] = ("default",)) -> None:
    """`turns`: the appliers that take the batches in turn (the first also applies the
    redeliveries), each one way: "default" (the worker as configured by default), "native" (it
    decides, and writes every board's chunk as a transaction of commands), "script" (it
    decides, and writes through guarded.lua), "lua" (it keeps no board state: apply.lua
    decides)."""
    if not currently_in_test_context():  # a hand-written case: the description goes with a failure
        try:
            _run_case(case, client, key_prefix, turns)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{case.describe()}") from None
        return
    note(case.describe())
    _run_case(case, client, key_prefix, turns)


def _applier(client: redis.Redis, boards: BoardsConfig, prefix: str, now: int, way: str) -> Applier:
    cells = 0 if way == "lua" else DEFAULT_CELLS
    applier = Applier(client, boards, prefix, ID_WINDOW_S, now_ms=lambda: now, epoch="E", state_cells=cells)
    if applier.states is not None and way != "default":
        applier.states.native = way == "native"
        applier.states.native_min_events = 1
    return applier


def _run_case(case: Case, client: redis.Redis, key_prefix: str, turns: Sequence[str]) -> None:
    prefix = f"{key_prefix}p{next(_examples)}:"
    boards = parse_boards(case.config())
    appliers = [_applier(client, boards, prefix, case.now, way) for way in turns]
    applier = appliers[0]
    max_ts = ts_ceiling(SKEW_S, case.now)
    model = Model(case)
    firsts: list[Status] = []
    calls: list[tuple[list[tuple[UpdateEvent, int]], list[Position | None]]] = []
    offset = 0
    for number, batch in enumerate(case.batches):
        pairs: list[tuple[UpdateEvent, int]] = []
        positions: list[Position | None] = []
        expected: dict[int, Expected] = {}
        for message in batch:
            parsed = parse_message(message.value(), boards, max_ts)
            assert parsed.rejections == (), message
            assert len(parsed.events) == len(message.events)
            for update, raw, index in zip(parsed.events, message.events, parsed.indexes, strict=True):
                ts = update.ts if update.ts is not None else message.kafka_ts
                pairs.append((update, ts))
                positions.append(Position(SOURCE, offset, index))
                expected[id(update)] = model.apply(raw, ts)
                firsts.append(expected[id(update)].status)
            offset += 1
        calls.append((pairs, positions))
        outcomes, failures = appliers[number % len(appliers)].apply_isolated(pairs, positions)
        assert failures == []
        for expect in expected.values():
            _event(f"status {expect.status.name}")
            if expect.late:
                _event("some windows late")
        assert sorted(id(o.event) for o in outcomes) == sorted(expected)
        for outcome in outcomes:
            _check_outcome(outcome, expected[id(outcome.event)], outcome.event.board == case.hot)
    # every batch delivered again: nothing changes, and each event reports what it did the first time
    again = [o.status for pairs, where in calls for o in _in_order(applier.apply(pairs, where), pairs)]
    redelivered = [s if s is Status.OUT_OF_RANGE else Status.REDELIVERED for s in firsts]
    _eq(again, redelivered, "redelivered statuses")
    _event(f"zone {case.zone}")
    found = compare_redis(client, prefix, model)
    for start in range(0, len(found), 500):
        client.delete(*found[start : start + 500])


def compare_redis(client: redis.Redis, prefix: str, model: Model) -> list[str]:
    """Assert Redis holds exactly the model's keys and values; returns the keys found."""
    found = sorted({_text(k) for k in client.scan_iter(match=f"{prefix}*", count=5000)})  # SCAN may repeat
    wanted: set[str] = set()
    reads: list[tuple[str, str, Callable[[Any], None]]] = []
    for board, state in model.boards.items():
        tag = f"{prefix}{{{board}}}"
        spec = state.spec
        if state.seq:
            wanted.add(f"{tag}:seq")
            reads.append(("get", f"{tag}:seq", partial(_check_seq, want=state.seq)))
        if state.meta:
            wanted.add(f"{tag}:meta")
            reads.append(("hgetall", f"{tag}:meta", partial(_check_meta, want=state.meta)))
        buckets = [k for k in found if k.startswith(f"{tag}:i:")]  # common/lua/idwindow.lua
        wanted.update(buckets, [f"{tag}:i"] if len(buckets) > 1 else [])
        _check_ids(client, buckets, state.ids)
        if state.fenced:
            wanted.add(f"{tag}:fence")
            reads.append(("hgetall", f"{tag}:fence", _check_fence))
        for instance, members in state.members.items():
            if not members:
                continue
            order = ranking(spec, members)
            cap = spec.max_members or len(order)
            keys = {"z": f"{tag}:z:{instance}"}
            if len(order) > cap:
                keys["o"] = f"{tag}:o:{instance}"
                _event("overflow zset")
            index = index_keys(client, tag, instance)  # tests/redis_layout.py
            if len(index) > 1:
                _event("tie index split")
            wanted.update(keys.values(), index)
            states = read_general(client, tag, instance, spec.order == "asc", spec.tie)
            _eq(states, dict(members), f"member states of {tag} {instance}")
            read = "zrange" if spec.order == "asc" else "zrevrange"
            for name, part in (("z", order[:cap]), ("o", order[cap:])):
                if part:
                    want = [(member, members[member][0]) for member in part]
                    reads.append((read, keys[name], partial(_check_zset, want=want, tie=spec.tie)))
            # total never expires (-1); a period at the start of the period `retention` later
            expiry = state.expiry.get(instance, -1)
            reads += [("pexpiretime", key, partial(_eq, want=expiry, what="expiry")) for key in keys.values()]
            reads += [  # an index key: up to a minute after its period (common/store/keys.py)
                (
                    "pexpiretime",
                    key,
                    partial(_eq, want=index_expiry(expiry, key) if expiry > 0 else -1, what="expiry"),
                )
                for key in index
            ]
    assert sorted(found) == sorted(wanted), "the keys in Redis"
    pipe = client.pipeline(transaction=False)
    for command, key, _ in reads:
        if command in ("zrange", "zrevrange"):
            getattr(pipe, command)(key, 0, -1, withscores=True)
        else:
            getattr(pipe, command)(key)
    for (_, key, check), got in zip(reads, pipe.execute(), strict=True):
        try:
            check(got)
        except AssertionError as exc:
            raise AssertionError(f"{key}: {exc}") from None
    return found


def _check_seq(got: bytes, want: int) -> None:
    _eq(int(got), want, "seq")


def _check_id_ttl(got: int) -> None:
    assert 0 < got <= key_ttl_ms(ID_WINDOW_S), f"the id window is kept for {got} ms"


def _check_ids(client: redis.Redis, buckets: list[str], want: set[str]) -> None:
    got: set[bytes] = set()
    for bucket in buckets:
        got.update(cast("list[bytes]", client.zrange(bucket, 0, -1)))
        _check_id_ttl(client.pttl(bucket))
    _eq(got, {fingerprint(i) for i in want}, "remembered id fingerprints")


def _check_fence(got: Mapping[bytes, bytes]) -> None:
    _eq(got[b"e"], b"E", "fence epoch")
    assert _text(got[SOURCE.field.encode()]).startswith(f"{SOURCE.topic_id}|"), got


def _in_order(outcomes: Sequence[Outcome], pairs: Sequence[tuple[UpdateEvent, int]]) -> list[Outcome]:
    """Outcomes come back per board; this puts them back in stream order."""
    by_event = {id(o.event): o for o in outcomes}
    return [by_event[id(event)] for event, _ in pairs]


def _eq(got: object, want: object, what: str) -> None:
    assert got == want, f"{what}: Redis has {got!r}, the model {want!r}"


def _check_meta(got: Mapping[bytes, bytes], want: Mapping[str, Any]) -> None:
    decoded = {_text(k): json.loads(v) for k, v in got.items()}
    _eq(decoded, dict(want), "meta")
    for raw in got.values():
        assert len(raw) <= MAX_META


def _check_zset(got: Sequence[tuple[bytes, float]], want: Sequence[tuple[str, float]], tie: str) -> None:
    decoded: list[tuple[str, float]] = []
    for encoded, score in got:
        member = encoded
        if tie != "none":
            prefix, member = encoded[:TIE_HEX], encoded[TIE_HEX:]
            assert len(prefix) == TIE_HEX and all(c in b"0123456789abcdef" for c in prefix), encoded
        decoded.append((_text(member), score))
    _eq(decoded, list(want), "ranking")
