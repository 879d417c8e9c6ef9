"""`rankstream dlq`'s pure logic, on dead letters written by the worker's own DeadLetters
(worker/dlq.py) into a stub sink: which one event a dead letter stands for, what replay sends or
refuses, the ledger's records, the reports, the fix file and the arguments (the real topics:
tests/integration/test_dlq_tool.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from confluent_kafka import Message

from common.boards import parse_boards
from common.errors import BadEvent
from common.events import parse_message
from rankstream.admin import UsageError
from rankstream.dlq.command import checked_limit, checked_reason
from rankstream.dlq.fix import load_fix
from rankstream.dlq.ledger import Entry, ledger_record, parse_entry, replayed_before
from rankstream.dlq.plan import Leave, Send, encode, plan
from rankstream.dlq.records import DeadLetter, Unreplayable, original_event, printable, value_text
from rankstream.dlq.report import entry, entry_json, hour_of, stats_json, stats_table, tally
from tests.unit.stubs import TIMESTAMP_CREATE_TIME, MessageStub
from worker.dlq import DeadLetters

BOARDS = parse_boards("timezone: UTC\ntypes:\n  gift: {windows: [total]}\n")
WRITTEN_MS = 1_795_989_411_520  # when the worker wrote the dead letter
MAX_TS = WRITTEN_MS + 86_400_000


class Sink:
    """The worker's transactional outputs, as DeadLetters uses them: what it produced."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.records.append(kwargs)

    def flush(self, timeout: float) -> None:
        pass


def dead_letters(value: bytes, *, offset: int = 7, max_bytes: int = 2 * 1024 * 1024) -> list[DeadLetter]:
    """What the worker dead-letters for the message `value` (at update_rank offset `offset`), as
    `rankstream dlq` reads it back: one per rejection, at dead-letter offsets 0, 1, ..."""
    sink = Sink()
    message = MessageStub(value, offset=offset, key=b"gift:r1")
    for bad in parse_message(value, BOARDS, MAX_TS).rejections:
        DeadLetters(sink, "update_rank.dlq", max_bytes).send(message, bad)
    return [
        DeadLetter.of(cast(Message, MessageStub(r["value"], offset=n, key=r["key"], headers=r["headers"],
                                                timestamp=(TIMESTAMP_CREATE_TIME, WRITTEN_MS))))
        for n, r in enumerate(sink.records)
    ]  # fmt: skip


def one(value: bytes | dict[str, Any] | list[Any], **kwargs: Any) -> DeadLetter:
    (letter,) = dead_letters(value if isinstance(value, bytes) else orjson.dumps(value), **kwargs)
    return letter


ARRAY: list[dict[str, Any]] = [
    {"id": "a1", "board": "gift:r1", "member": "bob", "score": 10},
    {"id": "a1", "board": "gift:r2", "member": "bob", "scor": 7},
    {"id": "a1", "board": "gift:r3", "member": "bob", "score": "3"},
]


def test_an_arrays_dead_letter_holds_the_whole_array_and_stands_for_its_element_alone():
    first, second = dead_letters(orjson.dumps(ARRAY))
    assert first.value == second.value == orjson.dumps(ARRAY)  # the worker keeps the whole message
    assert (first.reason, first.index, second.reason, second.index) == ("unknown_field", 1, "wrong_type", 2)
    assert original_event(first) == ARRAY[1]
    assert original_event(second) == ARRAY[2]
    assert first.source == {"topic": "updates", "partition": "0", "offset": "7", "index": "1"}
    assert (first.place, second.place, first.label) == ("0:0", "0:1", "0:0 (unknown_field)")


def test_a_whole_messages_dead_letter_stands_for_its_value():
    event = {"id": "w1", "board": "gift:r1", "member": "alice", "score": "50"}
    letter = one(event)
    assert (letter.reason, letter.index, letter.key) == ("wrong_type", None, b"gift:r1")
    assert original_event(letter) == event


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"{not json", "its value is not JSON"),
        (b'{"id": "\xff"}', "its value is not JSON"),
        (b"[]", "its value is an array of 0 (one event is replayed at a time)"),
        (orjson.dumps([{"id": "x"}] * 501), "its value is an array of 501 (one event is replayed at a time)"),
        (b'"text"', "its value is not an event but a string"),
        (b"[1]", "its value is not an event but a number"),  # an element that is not an object
    ],
)
def test_what_holds_no_one_event_is_unreplayable(value, why):
    with pytest.raises(Unreplayable, match=f"^{why.replace('(', '[(]').replace(')', '[)]')}$"):
        original_event(one(value))


def test_a_truncated_dead_letter_is_unreplayable_even_when_what_is_left_parses():
    padded: dict[str, Any] = {**ARRAY[0], "meta": {"bio": "b" * 900}}
    big = [padded] * 100 + [ARRAY[1]]  # ~100 KB, the bad one last
    letter = one(big, max_bytes=80_000)
    assert letter.truncated and len(letter.value) < len(orjson.dumps(big))
    with pytest.raises(
        Unreplayable, match=r"^truncated: the dead letter keeps only the first \d+ of its \d+ bytes"
    ):
        original_event(letter)


def test_an_index_header_that_is_not_a_position_is_unreplayable():
    letter = one(ARRAY[:2])
    broken = DeadLetter(
        0, 0, 0, None, letter.value, (*letter.headers[:-1], ("rankstream.source.index", b"x"))
    )
    with pytest.raises(Unreplayable, match="is not a position"):
        original_event(broken)
    beyond = DeadLetter(
        0, 0, 0, None, letter.value, (*letter.headers[:-1], ("rankstream.source.index", b"9"))
    )
    with pytest.raises(Unreplayable, match="has no element 9"):
        original_event(beyond)


# --- plan -----------------------------------------------------------------------------------------


def fix_typos(event: dict[str, Any]) -> dict[str, Any] | None:
    if "scor" in event:
        event["score"] = event.pop("scor")
    if isinstance(event.get("score"), str):
        event["score"] = int(event["score"])
    return event


def planned(letter: DeadLetter, fix: Any = fix_typos, ledger: dict[str, Entry] | None = None,
            force: bool = False) -> Send | Leave:  # fmt: skip
    return plan(letter, ledger=ledger or {}, fix=fix, boards=BOARDS, max_ts_ms=MAX_TS, force=force)


def test_a_fixed_element_is_sent_alone_keyed_by_its_board_with_its_id_and_the_dead_letters_time():
    first, second = dead_letters(orjson.dumps(ARRAY))
    sent = planned(first)
    assert isinstance(sent, Send)
    expected = {"id": "a1", "board": "gift:r2", "member": "bob", "score": 7, "ts": WRITTEN_MS}
    assert (sent.key, orjson.loads(sent.value), sent.before) == (b"gift:r2", expected, None)
    other = planned(second)
    assert isinstance(other, Send) and other.key == b"gift:r3" and orjson.loads(other.value)["score"] == 3


def test_an_event_that_has_a_ts_keeps_it():
    event = {"id": "w1", "board": "gift:r1", "member": "alice", "score": "5", "ts": WRITTEN_MS - 60_000}
    sent = planned(one(event))
    assert isinstance(sent, Send) and orjson.loads(sent.value)["ts"] == WRITTEN_MS - 60_000


def fixed(event: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The typos fixed, then `changes` made."""
    return {**event, **changes, "score": changes.get("score", event.pop("scor", None))}


@pytest.mark.parametrize(
    ("fix", "outcome", "why"),
    [
        (None, "refused", "still invalid: unknown_field: unknown field 'scor'"),
        (lambda e: None, "skipped", "the fix returned None"),
        (lambda e: e["nope"], "refused", "the fix raised KeyError: 'nope'"),
        (lambda e: [e], "refused", "the fix returned list, not an event (a dict) or None"),
        (lambda e: fixed(e, id="a2"), "refused", "the fix changed the id ('a1' -> 'a2'): a replay"),
        (lambda e: fixed(e, score=float("inf")), "refused", "the event is not JSON: Out of range float"),
        (lambda e: fixed(e, score={1, 2}), "refused", "the event is not JSON: Object of type set"),
    ],
)  # fmt: skip
def test_what_is_not_sent_says_why_in_one_line(fix, outcome, why):
    first, _ = dead_letters(orjson.dumps(ARRAY))
    step = planned(first, fix)
    assert isinstance(step, Leave) and step.outcome == outcome
    assert step.why.startswith(why) and "\n" not in step.why


def test_the_fix_may_set_an_id_that_was_not_a_valid_one():
    letter = one({"id": "", "board": "gift:r1", "member": "m", "score": 1})
    assert letter.reason == "bad_id"
    assert isinstance(planned(letter, None), Leave)
    sent = planned(letter, lambda e: {**e, "id": "new-1"})
    assert isinstance(sent, Send) and orjson.loads(sent.value)["id"] == "new-1"


def test_a_number_beyond_a_double_is_shown_and_refused_until_fixed():
    letter = one(b'{"id": "n1", "board": "gift:r1", "member": "m", "score": 1e400}')
    assert letter.reason == "non_finite_score"
    assert entry(letter)["event"]["score"] == float("inf")
    assert orjson.loads(entry_json(letter))["event"]["score"] == "inf"
    refused = planned(letter, None)
    assert isinstance(refused, Leave) and refused.why.startswith("the event is not JSON")
    assert isinstance(planned(letter, lambda e: {**e, "score": 1}), Send)


def test_an_erase_or_reset_is_not_replayed_as_an_event():
    letter = DeadLetter(0, 3, WRITTEN_MS, b"gift:r1", b'{"id":"c","board":"gift:r1","member":"m"}',
                        (("rankstream.reason", b"bad_control"),))  # fmt: skip
    step = planned(letter)
    assert isinstance(step, Leave) and step.why.startswith("an erase or reset, not an event")


def test_the_ledger_says_what_was_replayed_and_force_sends_it_again():
    first, second = dead_letters(orjson.dumps(ARRAY))
    sent = planned(first)
    assert isinstance(sent, Send)
    key, value = ledger_record(
        first, sent.event, dlq_topic="update_rank.dlq", now_ms=5, forced=False, fix="f.py"
    )
    assert key == b"0:0"
    record = orjson.loads(value)
    assert record["source"] == first.source and (record["id"], record["board"]) == ("a1", "gift:r2")
    entry_ = parse_entry(value)
    assert entry_ == Entry(first.source, 5)
    ledger = {key.decode(): entry_}
    again = planned(first, ledger=ledger)
    assert isinstance(again, Leave) and again.outcome == "already"
    assert again.why == "replayed at 1970-01-01T00:00:00.005Z; --force sends it again"
    forced = planned(first, ledger=ledger, force=True)
    assert isinstance(forced, Send) and forced.before == entry_
    assert isinstance(planned(second, ledger=ledger), Send)  # another place


def test_a_ledger_record_of_another_dead_letter_at_that_place_does_not_count():
    """The dead-letter topic made again: its offsets start over, its records' sources differ."""
    first, _ = dead_letters(orjson.dumps(ARRAY))
    stale = Entry({**first.source, "offset": "99"}, 5)
    assert replayed_before({"0:0": stale}, first) is None
    assert isinstance(planned(first, ledger={"0:0": stale}), Send)


def test_an_unreadable_ledger_record_counts_as_replayed_and_a_tombstone_forgets():
    first, _ = dead_letters(orjson.dumps(ARRAY))
    unreadable = parse_entry(b"{garbage")
    assert unreadable == Entry(None, 0)
    step = planned(first, ledger={"0:0": unreadable})
    assert isinstance(step, Leave) and step.outcome == "already" and "unreadable" in step.why
    assert parse_entry(None) is None


def test_encode_is_compact_utf8_json():
    assert encode({"id": "é", "score": 1.5}) == '{"id":"é","score":1.5}'.encode()
    with pytest.raises(Unreplayable):
        encode({"id": "\ud800"})  # a lone surrogate is no UTF-8


# --- reports --------------------------------------------------------------------------------------


def test_stats_count_by_reason_and_utc_hour():
    letters = [*dead_letters(orjson.dumps(ARRAY)), one(b"{not json")]
    later = DeadLetter(0, 9, WRITTEN_MS + 3_600_000, None, b"x", (("rankstream.reason", b"bad_json"),))
    stats = tally([*letters, later])
    assert (stats.total, stats.truncated) == (4, 0)
    assert dict(stats.by_reason) == {"unknown_field": 1, "wrong_type": 1, "bad_json": 2}
    assert dict(stats.by_hour) == {"2026-11-29T21:00Z": 3, "2026-11-29T22:00Z": 1}
    assert json.loads(stats_json(stats, "dlq"))["by_reason"] == {
        "bad_json": 2,
        "unknown_field": 1,
        "wrong_type": 1,
    }
    lines = stats_table(stats, "dlq").splitlines()
    assert lines[0] == "dlq: 4 dead letters"
    assert lines[4] == "    2  bad_json"
    assert hour_of(0) == "unknown" and stats_table(tally([]), "dlq") == "dlq: 0 dead letters"


def test_show_gives_the_bytes_exactly_and_escapes_what_a_terminal_would_run():
    letter = one(b'{"id": "\x1b[31m\xff"}')
    data = entry(letter)
    assert data["value_utf8"] is False and "\\xff" in data["value"]
    assert orjson.loads(entry_json(letter))["value_base64"] == "eyJpZCI6ICIbWzMxbf8ifQ=="
    assert printable("a\x1b[31mb\u202e") == "a\\x1b[31mb\\u202e"
    assert value_text(b"\xc3\xa9") == ("é", True)


# --- the fix file and the arguments -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such file"),
        ("def fix(event)\n    return event\n", "line 1: expected ':'"),
        (
            "import nosuchmodule_xyz\n",
            "loading it raised ModuleNotFoundError: No module named 'nosuchmodule_xyz'",
        ),
        ("fix = 3\n", "defines no function fix(event: dict) -> dict | None"),
    ],
)
def test_a_fix_file_that_cannot_be_used_is_one_line(tmp_path: Path, text, message):
    path = tmp_path / "fix.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError) as raised:
        load_fix(path)
    assert str(raised.value) == f"--fix-with {path}: {message}"


def test_a_fix_file_is_loaded_and_its_fix_gets_a_copy(tmp_path: Path):
    path = tmp_path / "fix.py"
    path.write_text("def fix(event):\n    event.pop('scor')\n    event['score'] = 1\n    return event\n")
    first, _ = dead_letters(orjson.dumps(ARRAY))
    sent = planned(first, load_fix(path))
    assert isinstance(sent, Send) and orjson.loads(sent.value)["score"] == 1
    assert original_event(first) == ARRAY[1]


def test_the_arguments_are_checked_before_anything_is_read():
    assert checked_reason(None) is None and checked_reason("wrong_type") == "wrong_type"
    with pytest.raises(UsageError, match="no dead-letter reason 'wrong'"):
        checked_reason("wrong")
    assert checked_limit(None) is None and checked_limit("3") == 3
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(UsageError, match="--limit must be a whole number"):
            checked_limit(bad)


def test_bad_event_index_is_what_the_header_carries():
    """The worker writes the index of BadEvent; the tool reads the same header back."""
    sink = Sink()
    DeadLetters(sink, "dlq", 1 << 20).send(MessageStub(b"[]", offset=1), BadEvent("wrong_type", "m", 4))
    letter = DeadLetter(0, 0, 0, None, b"[]", tuple(sink.records[0]["headers"]))
    assert letter.index == 4
