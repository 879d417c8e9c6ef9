"""Property test: a period's result (common/results.py `read_result`, and the record its
`encode()` gives) is exactly the independent model's standings of the events applied before the
period was sealed (docs/period-results.md, docs/contract.md §6), on real Redis.

Every example draws one board type (order, tie rule, with or without `score_range` so the packed
and the general layout are both read, with or without a small `max_members` so the top and the
member count, which counts it, reach into the overflow set, a late grace, `period_results` on
`hour` or `day` with a small `top`), a page size for reading it (so pages end inside the top, at
its end and inside the overflow set), and a stream of batches through the real apply path
(`parse_message` -> `Applier.apply` -> apply.lua) on a fixed clock: events at the period's first
and last ms and in between, in the periods around it, at scores on the edges of what the layout
accepts (refused when a result leaves it), with and without metas, processed while the period is
open, late within its grace and after it. The period is sealed (`periodmark.seal`) between two
batches: what follows must leave it alone, yet still count in `total` and in the other windows,
which are read and compared as well. The record's metas are the members' metas when it is read
(board-wide, as `GET /top` answers them), so events after the seal may change those.

The model is tests/apply_model.py's, with the two things it does not know added here: a sealed
instance takes no event (neither read nor range-checked, as apply.lua skips it), and a declared
range refuses an event whose new score in an instance it changes is outside it or not an integer.
Times lie in the future of the real clock (Redis expires the keys by it); each example has its own
key prefix and deletes its keys when it passes.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis
import yaml
from hypothesis import event, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from common.boards import BoardType, Order, parse_boards
from common.events import parse_message, ts_ceiling
from common.periods import parse_period, period_at
from common.results import read_result
from common.store import periodmark, reads
from common.store.encoding import Status, tie_mode, window_packing
from common.store.keys import BoardKeys
from tests.apply_model import (
    BASE_NOW,
    EXACT,
    GRACES,
    HOUR_MS,
    SKEW_S,
    Case,
    Expected,
    Model,
    TypeSpec,
    offset_changes,
    period_end,
    period_expiry,
    period_id,
    period_start,
    ranking,
)
from tests.integration.test_apply_properties import BASE  # the same hypothesis settings
from worker.apply import Applier

pytestmark = pytest.mark.integration


BOARD = "t:room-1"
ZONES = ("UTC", "Asia/Shanghai", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu")
# the README's numbers ("score_range"): bits of tie time each window packs beside the score
TIE_BITS = {"hour": 25, "day": 27}
# each keeps a closed period past a late grace of an hour (Lord Howe has 30-minute hours)
RETENTION = {"hour": 4, "day": 2}
MEMBERS = ("a", "b", "B", "m1", "m10", "\u00e9", "\u4e2d\u6587", "Zo\u00eb \U0001f642", "x" * 64, "x" * 65,
           "u7", "u3")  # fmt: skip
GENERAL_EDGES = (EXACT, -EXACT, EXACT - 1, -(EXACT - 1), 2**52 - 0.5, 1e15 + 0.25, 0, -0.0, 1, -1, 0.5, -0.5)
ABSENT = object()
OPS = ("incr", "incr", "set", "best", "delete")
METAS = st.one_of(
    st.just(ABSENT),
    st.just(ABSENT),
    st.none(),
    st.fixed_dictionaries({"name": st.text(max_size=6)}),
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(
            st.integers(-(2**63) + 1, 2**63 - 1),
            st.text(max_size=4),
            st.booleans(),
            st.none(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.lists(st.integers(-3, 3), max_size=2),
        ),
        max_size=3,
    ),
)


# --- the generated scenario ---------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    now: int  # the worker's clock for the call
    events: list[dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    zone: str
    spec: TypeSpec
    window: str  # the window whose periods emit results
    score_range: tuple[int, int] | None
    top: int
    page: int
    start: int  # the period whose result is read: [start, end)
    end: int
    batches: list[Batch]
    seal_at: int  # the period is sealed just before batches[seal_at] (after the last: == len)

    def config(self) -> str:
        declared = self.spec.config()
        declared["period_results"] = {"windows": [self.window], "top": self.top}
        if self.score_range is not None:
            declared["score_range"] = list(self.score_range)
        document = {"timezone": self.zone, "types": {self.spec.name: declared}}
        return yaml.safe_dump(document, allow_unicode=True)

    def __repr__(self) -> str:
        events = sum(len(b.events) for b in self.batches)
        return f"<Scenario {self.zone} {self.window} {events} events, seal before batch {self.seal_at}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def describe(self) -> str:
        lines = [self.config().rstrip(), f"period [{self.start}, {self.end}), read with page={self.page}"]
        for number, batch in enumerate(self.batches):
            if number == self.seal_at:
                lines.append("seal")
            lines.append(f"batch {number}, now {batch.now}: {orjson.dumps(batch.events).decode()}")
        if self.seal_at == len(self.batches):
            lines.append("seal")
        return "\n".join(lines)


def _ranges(bits: int) -> list[tuple[int, int]]:
    """Declared ranges: the widest the layout allows, small ones, ones against either edge."""
    room = 1 << (53 - bits)
    low, high = max(-room, -EXACT), min(room - 1, EXACT)
    return [(low, high), (-100, 100), (0, 1000), (5, 50), (low, low + 20), (high - 20, high)]


def _scores(score_range: tuple[int, int] | None) -> tuple[st.SearchStrategy[float], st.SearchStrategy[float]]:
    """(scores the layout accepts, scores including refused ones)"""
    if score_range is None:
        floats = st.floats(-1000, 1000, allow_nan=False, allow_infinity=False)
        anything = st.one_of(
            st.sampled_from(GENERAL_EDGES), st.integers(-5, 5), floats, st.integers(-EXACT, EXACT)
        )
        return anything, anything  # refused: increments past +-(2**53 - 1)
    low, high = score_range
    edges = sorted({max(-EXACT, min(EXACT, v)) for v in (low, high, low + 1, high - 1, low - 1, high + 1)})
    small = st.integers(max(low, -5), min(high, 5)) if low <= 5 and high >= -5 else st.integers(low, low + 5)
    inside = st.one_of(st.sampled_from((low, high, low + 1, high - 1)), small, st.integers(low, high))
    # refused: outside the range (by the score or by an increment), or not an integer
    return inside, st.one_of(inside, inside, inside, st.sampled_from(edges), st.sampled_from((0.5, -1.5)))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    zone = draw(st.sampled_from(ZONES))
    tz = ZoneInfo(zone)
    window = draw(st.sampled_from(("hour", "day")))
    calendar = ("hour", "day") if draw(st.booleans()) else (window,)
    tie = draw(st.sampled_from(("first", "last", "none")))
    spec = TypeSpec(
        name="t",
        order=draw(st.sampled_from(("desc", "asc"))),
        tie=tie,
        windows=("total", *calendar),
        retention={w: RETENTION[w] for w in calendar},
        max_members=draw(st.one_of(st.none(), st.integers(3, 6), st.integers(3, 6))),
        grace=draw(st.sampled_from(("10m", "1h"))),
    )
    bits = max(TIE_BITS[w] for w in calendar) if tie != "none" else 0
    score_range = draw(st.one_of(st.none(), st.sampled_from(_ranges(bits))))
    anchors = [BASE_NOW, *[t for t in offset_changes(zone) if t > BASE_NOW][:2]]  # DST: a 2 h hour...
    anchor = draw(st.sampled_from(anchors)) + draw(st.sampled_from((0, -1, -HOUR_MS, HOUR_MS)))
    start, end = period_start(tz, window, anchor), period_end(tz, window, anchor)
    grace = GRACES[spec.grace]
    pool = draw(st.permutations(MEMBERS))[: draw(st.integers(2, len(MEMBERS)))]
    accepted, scores = _scores(score_range)
    nows = st.one_of(
        st.sampled_from((start, end - 1)),
        st.integers(start, end - 1),  # the period is open
        st.sampled_from((end, end + grace - 1)),
        st.integers(end, end + grace - 1),  # closed, within its late grace
        st.sampled_from((end + grace, end + grace + 5_000)),  # past it: late for the period
    )
    inside = st.one_of(st.sampled_from((start, start + 1, end - 2, end - 1)), st.integers(start, end - 1))
    times = st.one_of(inside, inside, st.sampled_from((start - 1, end, end + 1)))  # + the periods around it
    ids = itertools.count()

    def new_event(now: int, member: str, op: str, crowd: bool = False) -> dict[str, Any]:
        ts = min(draw(inside if crowd else times), now + SKEW_S * 1000)
        event: dict[str, Any] = {"id": f"e{next(ids)}", "board": BOARD, "member": member, "op": op, "ts": ts}
        if op != "delete" or draw(st.booleans()):
            event["score"] = draw(accepted if crowd else scores)
        meta = draw(METAS)
        if meta is not ABSENT:
            event["meta"] = meta
        return event

    batches: list[Batch] = []
    if draw(st.integers(0, 2)):  # a crowd: every member once while the period is open (the overflow, pages)
        now = draw(st.integers(start, end - 1))
        ops = st.sampled_from(("set", "best", "incr"))
        batches.append(Batch(now, [new_event(now, member, draw(ops), crowd=True) for member in pool]))
    for _ in range(draw(st.integers(1, 6))):
        now = draw(nows)
        events = [
            new_event(now, draw(st.sampled_from(pool)), draw(st.sampled_from(OPS)))
            for _ in range(draw(st.integers(1, 8)))
        ]
        batches.append(Batch(now, events))
    batches.sort(key=lambda b: b.now)  # the worker's clock goes forward
    return Scenario(
        zone=zone,
        spec=spec,
        window=window,
        score_range=score_range,
        top=draw(st.integers(1, 12)),
        page=draw(st.integers(1, 5)),
        start=start,
        end=end,
        batches=batches,
        seal_at=draw(st.one_of(st.integers(0, len(batches)), st.integers(1, len(batches)))),
    )


# --- the model: tests/apply_model.py, plus seals and a declared range --------------------------


class ResultModel(Model):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(Case(scenario.zone, scenario.batches[0].now, [scenario.spec], None, []))
        self.score_range = scenario.score_range
        self.sealed: set[str] = set()

    def instances(self, spec: TypeSpec, ts: int) -> tuple[list[tuple[str, int | None]], int]:
        found, late = super().instances(spec, ts)
        return [(i, expiry) for i, expiry in found if i not in self.sealed], late

    def apply(self, event: Mapping[str, Any], ts: int) -> Expected:
        before = copy.deepcopy(self.boards)
        expected = super().apply(event, ts)
        if expected.status is Status.APPLIED and not self._in_range(before, event):
            self.boards = before
            board = before.get(event["board"])
            return dataclasses.replace(expected, status=Status.OUT_OF_RANGE, seq=board.seq if board else 0)
        return expected

    def _in_range(self, before: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
        """Every score the event changed is an integer in the declared range."""
        if self.score_range is None:
            return True
        low, high = self.score_range
        board, member = event["board"], event["member"]
        old = before[board].members if board in before else {}
        for instance, members in self.boards[board].members.items():
            new = members.get(member)
            if new is None or new == old.get(instance, {}).get(member):
                continue  # absent or unchanged: nothing to check
            if not (low <= new[0] <= high and new[0].is_integer()):
                return False
        return True


# --- running a scenario and comparing -----------------------------------------------------------

_examples = itertools.count()


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _ref(board_type: BoardType, prefix: str, instance: str, tz: ZoneInfo) -> reads.WindowRef:
    """How the product addresses one instance of the board (as read_result does)."""
    name, _, pid = instance.partition(":")
    window = board_type.window(name)
    start = parse_period(window, pid, tz).start_ms if pid else 0
    desc = board_type.order is Order.DESC
    return reads.WindowRef(BoardKeys(prefix, BOARD), instance, desc, tie_mode(board_type),
                           window_packing(board_type, window, start))  # fmt: skip


def _wire_score(score: float) -> bool:
    """Whether the record writes the score as an integer."""
    return score.is_integer() and abs(score) <= 2**53


def run(scenario: Scenario, client: redis.Redis, key_prefix: str) -> None:
    note(scenario.describe())
    prefix = f"{key_prefix}r{next(_examples)}:"
    boards = parse_boards(scenario.config())
    board_type = boards.types["t"]
    tz = boards.timezone
    clock = Clock(scenario.batches[0].now)
    applier = Applier(client, boards, prefix, 3600, now_ms=clock, epoch="E")
    model = ResultModel(scenario)
    instance = f"{scenario.window}:{period_id(tz, scenario.window, scenario.start)}"
    keys = BoardKeys(prefix, BOARD)
    expire = period_expiry(tz, scenario.window, scenario.start, RETENTION[scenario.window])
    for number, batch in enumerate([*scenario.batches, None]):
        if number == scenario.seal_at:
            assert periodmark.seal(client, keys, instance, expire).state == "sealed"
            model.sealed.add(instance)
        if batch is None:
            break
        clock.now = model.now = batch.now
        parsed = parse_message(orjson.dumps(batch.events), boards, ts_ceiling(SKEW_S, batch.now))
        assert parsed.rejections == ()
        pairs = [(update, update.ts if update.ts is not None else batch.now) for update in parsed.events]
        expected = [model.apply(raw, ts) for raw, (_, ts) in zip(batch.events, pairs, strict=True)]
        outcomes = {id(o.event): o for o in applier.apply(pairs)}
        for (update, ts), expect in zip(pairs, expected, strict=True):
            got = outcomes[id(update)]
            assert (got.status, got.seq) == (expect.status, expect.seq), update
            event(f"status {expect.status.name}")
            if scenario.start <= ts < scenario.end and batch.now < scenario.end + GRACES[scenario.spec.grace]:
                event("in the period, after its seal" if instance in model.sealed else "in the period")
                if batch.now >= scenario.end:
                    event("late within grace, " + ("sealed" if instance in model.sealed else "open"))
    state = model.boards.get(BOARD)
    check_result(scenario, client, prefix, model, board_type)
    # total, the other windows and the periods around: every event not refused counts there
    for other in sorted({"total", instance, *(state.members if state else {})}):
        members = state.members.get(other, {}) if state else {}
        page = reads.top_sync(client, _ref(board_type, prefix, other, tz), 0, 100)
        want = [(m, members[m][0]) for m in ranking(scenario.spec, members)]
        assert (page.total, [(e.member, e.score) for e in page.entries]) == (len(want), want), other
    found = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if found:
        client.delete(*found)


def _label(scenario: Scenario, count: int, top: list[tuple[str, float, Any]]) -> None:
    """What the example reached, for --hypothesis-show-statistics."""
    event("packed" if scenario.score_range is not None else "general layout")
    cap = scenario.spec.max_members
    if cap is not None and count > cap:
        event("the overflow set holds members" + (", the top reaches it" if len(top) > cap else ""))
    if len(top) > scenario.page:
        event("the top takes several pages")
    if count > scenario.top:
        event("more members than the top")
    if not count:
        event("an empty period")
    if any(not score.is_integer() for _, score, _ in top):
        event("a non-integer score in the record")
    if any(abs(score) == EXACT for _, score, _ in top):
        event("a score at +-(2**53 - 1) in the record")


def check_result(
    scenario: Scenario, client: redis.Redis, prefix: str, model: ResultModel, board_type: BoardType
) -> None:
    tz = ZoneInfo(scenario.zone)
    window = board_type.window(scenario.window)
    period = period_at(window, scenario.start, tz)
    pid = period_id(tz, scenario.window, scenario.start)
    assert period is not None
    assert (period.id, period.start_ms, period.end_ms) == (pid, scenario.start, scenario.end)
    state = model.boards.get(BOARD)
    instance = f"{scenario.window}:{pid}"
    members = state.members.get(instance, {}) if state else {}
    metas = state.meta if state else {}  # a member's meta is the board's, now (what GET /top answers)
    order = ranking(scenario.spec, members)[: scenario.top]
    result = read_result(client, prefix, board_type, BOARD, window=window, period=period, page=scenario.page)
    want = [(m, members[m][0], metas.get(m)) for m in order]
    _label(scenario, len(members), want)
    got = [(e.member, e.score, None if e.meta is None else orjson.loads(e.meta)) for e in result.top]
    assert got == want, "the period's top"
    assert (result.members, result.seq) == (len(members), state.seq if state else 0)
    assert (result.board, result.window, result.period, result.closed_at) == (BOARD, scenario.window, pid,
                                                                              scenario.end)  # fmt: skip
    if members:  # the layout the range declares: packed keys, or the general ones
        assert client.exists(BoardKeys(prefix, BOARD).rank(instance, scenario.score_range is not None))
    record = orjson.loads(result.encode())
    items = []
    for rank, (member, score, meta) in enumerate(want, 1):
        item: dict[str, Any] = {"rank": rank, "member": member, "score": score}
        if meta is not None:
            item["meta"] = meta
        items.append(item)
    assert record == {
        "board": BOARD, "window": scenario.window, "period": pid, "closed_at": scenario.end,
        "members": len(members), "seq": result.seq, "top": items,
    }  # fmt: skip
    assert [type(i["score"]) is int for i in record["top"]] == [_wire_score(s) for _, s, _ in want]


@pytest.fixture
def client(settings, rclient):
    """Like `rclient` (which removes the test's keys afterwards), with room for a slow shared server."""
    slow_ok = redis.Redis.from_url(settings.redis_url.get_secret_value(), socket_timeout=30)
    yield slow_ok
    slow_ok.close()


@hsettings(BASE, max_examples=200)
@given(scenario=scenarios())
def test_a_period_result_is_the_model_of_what_came_before_its_seal(scenario, settings, client):
    run(scenario, client, settings.key_prefix)
