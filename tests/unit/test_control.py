"""Control messages (common/control.py) as pure logic: the parser, how the worker loop and the
applier carry an erase or reset (its own call, every instance, dead-lettered when bad), and how
hot memory follows a reset.
tests/integration/test_erase_reset.py runs them on real Kafka and Redis."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from api.hotboards import HotBoard
from api.hotwindow import HotWindow
from common.boards import parse_boards
from common.cache_records import Kind, Record, RecordWriter, decode
from common.control import (
    CONTROL_HEADER,
    WHOLE_BOARD,
    control_kind,
    control_message,
    parse_control,
    parse_selector,
)
from common.errors import BadEvent
from common.events import Op, Reason, parse_message
from common.store.encoding import TieMode
from tests.unit import test_worker_loop
from tests.unit.stubs import TIMESTAMP_CREATE_TIME, MessageStub, ScriptStub, install_script, unused_redis
from tests.unit.test_worker_loop import BASE_MS, HOUR_MS, event, msg, update
from worker.apply import MAX_INSTANCES_PER_CALL, Applier

pytestmark = pytest.mark.timeout(30)

BOARDS = parse_boards(
    """
timezone: Asia/Shanghai
types:
  gift: {windows: [total, hour, day], retention: {hour: 60, day: 3}}
  level: {windows: [total]}
  roll: {windows: [total, last_7d]}
"""
)


rig = test_worker_loop.rig  # the worker loop over stubs, as a fixture of this module too


def make_applier(script: ScriptStub) -> Applier:
    applier = Applier(unused_redis(), BOARDS, "t:", 60_000, now_ms=lambda: BASE_MS)
    install_script(applier, script)
    return applier


def control(kind: bytes, **fields: Any) -> tuple[bytes, bytes]:
    return kind, orjson.dumps(fields)


def parsed(kind: bytes, **fields: Any) -> tuple[Op, str, str]:
    result = parse_control(*control(kind, **fields), BOARDS)
    assert (result.id, result.score, result.ts, result.meta) == (fields["id"], 0.0, None, None)
    return result.op, result.board, result.member


def test_only_the_control_header_makes_a_control_message():
    assert control_kind(None) is None
    assert control_kind([]) is None
    assert control_kind([("trace-id", b"1")]) is None
    assert control_kind([("trace-id", b"1"), (CONTROL_HEADER, b"erase")]) == b"erase"
    assert control_kind([(CONTROL_HEADER, None)]) == b""  # bad_control when parsed, not an event


def test_erase_names_its_member():
    assert parsed(b"erase", id="erase:1", board="gift:r1", member="m 1 🎁") == (Op.ERASE, "gift:r1", "m 1 🎁")


@pytest.mark.parametrize(
    ("window", "period", "selector"),
    [
        (None, None, WHOLE_BOARD),
        ("total", None, "total"),
        ("day", None, "day"),
        ("day", "2026-11-22", "day:2026-11-22"),
        ("hour", "2026-11-22T07", "hour:2026-11-22T07"),
    ],
)
def test_reset_carries_its_selector_in_member(window, period, selector):
    fields = {"id": "reset:1", "board": "gift:r1", "window": window, "period": period}
    assert parsed(b"reset", **fields) == (Op.RESET, "gift:r1", selector)
    assert parse_selector(selector) == (window, period)


def test_a_rolling_window_is_reset_whole():
    fields = {"id": "reset:1", "board": "roll:r1", "window": "last_7d", "period": None}
    assert parsed(b"reset", **fields) == (Op.RESET, "roll:r1", "last_7d")


def test_reset_without_window_and_period_fields_is_the_whole_board():
    assert parsed(b"reset", id="reset:1", board="level") == (Op.RESET, "level", WHOLE_BOARD)


def test_what_the_cli_produces_is_what_the_worker_parses():
    value, headers = control_message(Op.RESET, "gift:r1", window="day", period="2026-11-22")
    kind = control_kind(headers)
    assert kind == b"reset"
    result = parse_control(kind, value, BOARDS)
    assert result.id.startswith("reset:") and len(result.id) == len("reset:") + 32
    assert (result.op, result.member) == (Op.RESET, "day:2026-11-22")
    value, headers = control_message(Op.ERASE, "gift:r1", member="m1")
    assert parse_control(b"erase", value, BOARDS).member == "m1"
    assert control_message(Op.ERASE, "gift:r1", member="m1")[0] != value  # a fresh id each time


RESET = {"id": "reset:1", "board": "gift:r1"}
ERASE = {"id": "erase:1", "board": "gift:r1", "member": "m1"}
BAD = [
    ("unknown kind", b"delete", orjson.dumps(ERASE), "header must be erase or reset"),
    ("empty value", b"erase", b"", "not valid JSON"),
    ("not JSON", b"erase", b"{", "not valid JSON"),
    ("an array", b"erase", orjson.dumps([ERASE]), "must be a JSON object"),
    ("unknown field", b"erase", orjson.dumps({**ERASE, "score": 1}), "unknown field 'score'"),
    ("reset field on erase", b"erase", orjson.dumps({**ERASE, "window": "day"}), "unknown field 'window'"),
    ("missing id", b"erase", orjson.dumps({**ERASE, "id": None}), "id must be"),
    ("id too long", b"erase", orjson.dumps({**ERASE, "id": "e" * 129}), "id must be"),
    ("bad board", b"erase", orjson.dumps({**ERASE, "board": "Gift Room"}), "board must be"),
    ("unknown type", b"erase", orjson.dumps({**ERASE, "board": "shop:1"}), "'shop' is not configured"),
    ("missing member", b"erase", orjson.dumps({"id": "e", "board": "gift:r1"}), "member must be a string"),
    ("empty member", b"erase", orjson.dumps({**ERASE, "member": ""}), "member must be 1-128"),
    ("control character", b"erase", orjson.dumps({**ERASE, "member": "a\nb"}), "U+000A"),
    ("unknown window", b"reset", orjson.dumps({**RESET, "window": "week"}), "not one of"),
    (
        "rolling period",
        b"reset",
        orjson.dumps({**RESET, "board": "roll:r1", "window": "last_7d", "period": "2026-11-22"}),
        "reset it whole",
    ),
    ("period alone", b"reset", orjson.dumps({**RESET, "period": "2026-11-22"}), "needs its window"),
    ("period of total", b"reset", orjson.dumps({**RESET, "window": "total", "period": "all"}), "no periods"),
    ("bad period", b"reset", orjson.dumps({**RESET, "window": "day", "period": "2026-13-01"}), "2026-13-01"),
    ("numeric period", b"reset", orjson.dumps({**RESET, "window": "day", "period": 20261122}), "a string"),
]


@pytest.mark.parametrize(("kind", "value", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_control_message_is_bad_control_and_says_why(kind, value, words):
    with pytest.raises(BadEvent) as raised:
        parse_control(kind, value, BOARDS)
    assert raised.value.reason == Reason.BAD_CONTROL
    assert words in raised.value.message and "\n" not in raised.value.message


@pytest.mark.parametrize("op", ["x", "erase", "reset"])
def test_an_event_can_not_carry_an_internal_op(op):
    value = orjson.dumps({"id": "e", "board": "gift:r1", "member": "m", "op": op, "score": 1})
    (bad,) = parse_message(value, BOARDS, BASE_MS).rejections
    assert bad.reason == Reason.UNKNOWN_OP


# --- the applier and the loop (tests/unit/test_worker_loop.py's stubs) ------------------------------


def test_a_control_op_gets_a_call_of_its_own_holding_every_instance_it_touches():
    script = ScriptStub()
    erase = update("erase:1", "gift:a", member="m1")[0]._replace(op=Op.ERASE)
    reset = update("reset:1", "gift:a", member="hour")[0]._replace(op=Op.RESET)
    pairs = [update("e1", "gift:a"), (erase, BASE_MS), update("e2", "gift:a"), (reset, BASE_MS)]

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    assert failures == []
    assert [[c.ids for c in trip] for trip in script.round_trips] == [
        [["e1"]],
        [["erase:1"]],
        [["e2"]],
        [["reset:1"]],
    ]  # in stream order, one board chunk per round trip
    erased, reset_call = script.calls[1], script.calls[3]
    # total and every period kept up to the latest accepted time (now + 1 day of skew)
    hours = [name for name in erased.instances if name.startswith("hour:")]
    days = [name for name in erased.instances if name.startswith("day:")]
    assert erased.instances[0] == "total" and len(hours) == 60 + 24 and len(days) == 3 + 1
    assert len(erased.instances) > MAX_INSTANCES_PER_CALL
    # sent with mask 0: apply.lua (and the stub) take every instance of a control op's call
    # (thousands of mask bits would only slow the call down, and hiredis crashed packing them)
    assert erased.events[0].instances == erased.instances
    assert reset_call.instances == tuple(hours)  # --window hour: its periods only
    assert [o.event.id for o in outcomes] == ["e1", "erase:1", "e2", "reset:1"]


def test_a_period_reset_touches_that_period_only():
    script = ScriptStub()
    reset = update("reset:1", "gift:a", member="hour:2023-12-31T20")[0]._replace(op=Op.RESET)

    make_applier(script).apply_isolated([(reset, BASE_MS + 400 * HOUR_MS)])  # its time picks nothing

    (call,) = script.calls
    assert call.instances == ("hour:2023-12-31T20",)


def test_the_loop_applies_control_messages_in_order_and_dead_letters_a_bad_one(rig):
    stamp = (TIMESTAMP_CREATE_TIME, BASE_MS - 30 * 86_400_000)  # its time bounds nothing
    erase, _ = control_message(Op.ERASE, "level:a", member="m")
    bad, _ = control_message(Op.RESET, "level:a", window="hour")
    batch = [
        msg(event("e1", "level:a"), offset=1),
        MessageStub(erase, offset=2, timestamp=stamp, headers=[("trace", b"1"), (CONTROL_HEADER, b"erase")]),
        MessageStub(bad, offset=3, timestamp=stamp, headers=[(CONTROL_HEADER, b"reset")]),
        msg(event("e2", "level:a"), offset=4),
    ]
    r = rig([batch])

    r.loop.run()

    assert [c.events[0].op for c in r.script.calls] == ["incr", "erase", "incr"]
    (dead,) = r.dead_letters
    assert dead.value == bad
    assert r.metric("rankstream_worker_dead_lettered_total", reason="bad_control") == 1
    assert r.metric("rankstream_worker_admin_ops_total", op="erase") == 1
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 2  # the events alone


# --- hot memory (api/hotwindow.py, api/hotboards.py) ----------------------------------------------


@pytest.mark.parametrize("loading", [True, False])
def test_a_reset_in_memory_voids_what_came_up_to_it_in_any_order(loading):
    window = HotWindow(desc=True, mode=TieMode.INV)
    window.loading = loading
    window.put("a", 1.0, 10, seq=5)
    window.put("b", 2.0, 11, seq=12)  # after the reset: a replay may meet it first
    window.delete("c", seq=3)
    assert window.reset(10)
    window.finish_loading()
    assert window.items() == {"b": (2.0, 11, 12)}
    assert not window.put("a", 9.0, 1, seq=8)  # older than the reset, arriving late
    assert not window.delete("b", seq=10)
    assert not window.reset(9) and not window.reset(10)  # an older (or the same) reset changes nothing
    assert window.put("c", 3.0, 1, seq=11)
    assert window.page(0, 5, reverse=False) == [("c", 3.0), ("b", 2.0)]


def test_a_hot_board_keeps_a_members_meta_while_another_instance_holds_it():
    hot = HotBoard("gift:r0", ("total", "day"), desc=True, mode=TieMode.INV)
    meta = b'{"name":"A"}'
    hot.apply(Record(Kind.STATE, "gift:r0", "total", "a", 1.0, 10, 5, meta))
    hot.apply(Record(Kind.STATE, "gift:r0", "day:2026-11-22", "a", 1.0, 10, 5, meta))
    hot.apply(Record(Kind.RESET, "gift:r0", "day:2026-11-22", "", 0.0, 0, 6, None))
    assert dict(hot.meta.items()) == {"a": meta}  # still in total
    # an absence carries the board's meta (a redelivered event reports today's state)
    hot.apply(Record(Kind.DELETED, "gift:r0", "day:2026-11-22", "a", 0.0, 0, 7, meta))
    assert dict(hot.meta.items()) == {"a": meta}
    hot.apply(Record(Kind.RESET, "gift:r0", "total", "", 0.0, 0, 8, None))
    assert not dict(hot.meta.items()) and hot.seq == 8
    hot.apply(Record(Kind.STATE, "gift:r0", "total", "a", 2.0, 10, 9, meta))
    hot.apply(Record(Kind.DELETED, "gift:r0", "day:2026-11-22", "a", 0.0, 0, 10, None))  # a delete op
    assert not dict(hot.meta.items())  # as Redis: a delete drops the member's meta


@pytest.mark.parametrize("version", [1, 2])
def test_a_reset_record_round_trips(version):
    key, value = RecordWriter(version).reset("gift:r0", "day:2026-11-22", 42)
    expected = Record(Kind.RESET, "gift:r0", "day:2026-11-22", "", 0.0, 0, 42, None, version)
    assert decode(key, value) == expected


HOT_AND_CLOSING = parse_boards(
    "types:\n"
    "  gift: {windows: [total, hour]}\n"
    "  promo: {windows: [total], ends_at: '2020-01-01T00:00:00Z'}\n"
    "hot:\n  - {board: 'gift:a'}\n"
)


def test_a_hot_board_gets_a_state_or_a_reset_seq_for_every_instance_of_a_control_op():
    applier = Applier(unused_redis(), HOT_AND_CLOSING, "t:", 60_000, now_ms=lambda: BASE_MS)
    install_script(applier, ScriptStub())
    erase = update("erase:1", "gift:a", member="m1")[0]._replace(op=Op.ERASE)
    reset = update("reset:1", "gift:a", member="*")[0]._replace(op=Op.RESET)
    outcomes = applier.apply([update("e1", "gift:a", member="m1"), (erase, BASE_MS), (reset, BASE_MS)])
    erased, reset_done = outcomes[1], outcomes[2]
    assert len(erased.states) > MAX_INSTANCES_PER_CALL and set(erased.states.values()) == {None}
    assert reset_done.resets is not None and set(reset_done.resets) == set(reset_done.states)
    assert set(reset_done.resets.values()) == {reset_done.seq}


def test_an_event_of_an_ended_activity_is_refused_board_closed():
    applier = Applier(unused_redis(), HOT_AND_CLOSING, "t:", 60_000, now_ms=lambda: BASE_MS)
    script = ScriptStub()
    install_script(applier, script)
    (outcome,) = applier.apply([update("p1", "promo:x")])
    assert (outcome.status.name, outcome.failed_as) == ("FAILED", "board_closed")
    assert script.calls[0].events[0].op == "closed" and script.applied == []
