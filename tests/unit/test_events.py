"""The update-event parser: every malformed input maps to one stable reason, valid ones survive."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from common.boards import parse_boards
from common.events import (
    MAX_BATCH,
    MAX_EXACT_SCORE,
    MIN_TS_MS,
    Op,
    ParseResult,
    Reason,
    UpdateEvent,
    parse_message,
    ts_ceiling,
)

NOW = 1_763_780_000_000  # 2025-11-22
MAX_TS = ts_ceiling(86_400, NOW)  # what the worker passes: now plus a day of skew
BOARDS = parse_boards("types: {gift: {}, shop: {order: asc}}")
BOARDS_WITH_DEFAULT = parse_boards("types: {gift: {}, default: {windows: [total, day]}}")

_DROP = object()


def event(**changes: Any) -> dict[str, Any]:
    """A valid event with some fields changed; `field=_DROP` leaves the field out."""
    fields: dict[str, Any] = {"id": "msg-1", "board": "gift:room42", "member": "alice", "score": 10}
    fields.update(changes)
    return {name: value for name, value in fields.items() if value is not _DROP}


def encode(**changes: Any) -> bytes:
    return orjson.dumps(event(**changes))


def with_score(literal: str) -> bytes:
    """An event whose score is written verbatim: orjson cannot produce NaN, 1e400 or 2**70 itself."""
    return b'{"id": "msg-1", "board": "gift:room42", "member": "alice", "score": ' + literal.encode() + b"}"


def only_rejection(result: ParseResult) -> tuple[str, int | None]:
    assert result.events == ()
    assert len(result.rejections) == 1
    return result.rejections[0].reason, result.rejections[0].index


NESTED_META = b'{"id": "a", "board": "gift", "member": "m", "score": 1, "meta": {"x": ' + b"[" * 300
NESTED_META += b"]" * 300 + b"}}"

MALFORMED: list[tuple[str, bytes | None, str, int | None]] = [
    # whole-message problems
    ("null value", None, "empty_value", None),
    ("empty bytes", b"", "empty_value", None),
    ("not json", b"{id: 1}", "bad_json", None),
    ("truncated json", encode()[:-5], "bad_json", None),
    ("invalid utf-8", b'{"id": "a\xff", "board": "gift", "member": "m", "score": 1}', "bad_json", None),
    ("overlong utf-8", b'{"id": "a\xc0\xaf", "board": "gift", "member": "m", "score": 1}', "bad_json", None),
    ("utf-8 bom", b"\xef\xbb\xbf" + encode(), "bad_json", None),
    (
        "lone surrogate escape",
        b'{"id": "\\ud800", "board": "gift", "member": "m", "score": 1}',
        "bad_json",
        None,
    ),
    ("NaN score", with_score("NaN"), "bad_json", None),
    ("Infinity score", with_score("Infinity"), "bad_json", None),
    ("-Infinity score", with_score("-Infinity"), "bad_json", None),
    ("json null", b"null", "bad_shape", None),
    ("json number", b"42", "bad_shape", None),
    ("json string", b'"hello"', "bad_shape", None),
    ("empty array", b"[]", "empty_batch", None),
    (
        "array of 501",
        orjson.dumps([event(id=f"m{i}") for i in range(MAX_BATCH + 1)]),
        "batch_too_large",
        None,
    ),
    ("array holding a number", b"[1]", "bad_shape", 0),
    ("array holding an array", b"[[]]", "bad_shape", 0),
    # unknown and missing fields
    ("unknown field", encode(colour="red"), "unknown_field", None),
    ("unknown field beats missing", encode(colour="red", id=_DROP), "unknown_field", None),
    ("missing id", encode(id=_DROP), "missing_field", None),
    ("missing board", encode(board=_DROP), "missing_field", None),
    ("missing member", encode(member=_DROP), "missing_field", None),
    ("missing score", encode(score=_DROP), "missing_field", None),
    ("missing score with op set", encode(score=_DROP, op="set"), "missing_field", None),
    ("missing beats wrong type", encode(id=5, member=_DROP), "missing_field", None),
    # JSON types
    ("score true", encode(score=True), "wrong_type", None),
    ("score false", encode(score=False), "wrong_type", None),
    ("score string", encode(score="10"), "wrong_type", None),
    ("score null", encode(score=None), "wrong_type", None),
    ("score object", encode(score={"v": 1}), "wrong_type", None),
    ("id number", encode(id=7), "wrong_type", None),
    ("board null", encode(board=None), "wrong_type", None),
    ("member array", encode(member=["alice"]), "wrong_type", None),
    ("op number", encode(op=1), "wrong_type", None),
    ("ts float", encode(ts=1763780000000.5), "bad_ts", None),
    ("ts integral float", encode(ts=1763780000000.0), "bad_ts", None),
    ("ts string", encode(ts="1763780000000"), "bad_ts", None),
    ("ts boolean", encode(ts=True), "bad_ts", None),
    ("ts array", encode(ts=[1]), "bad_ts", None),
    ("meta string", encode(meta="alice"), "wrong_type", None),
    ("meta array", encode(meta=[1, 2]), "wrong_type", None),
    ("wrong type beats bad value", encode(id="", score="1"), "wrong_type", None),
    # values
    ("empty id", encode(id=""), "bad_id", None),
    ("129-char id", encode(id="x" * 129), "bad_id", None),
    ("board with braces", encode(board="gift:{room42}"), "bad_board", None),
    ("board with space", encode(board="gift:room 42"), "bad_board", None),
    ("board with control char", encode(board="gift:room\x0142"), "bad_board", None),
    ("board with newline at the end", encode(board="gift:room42\n"), "bad_board", None),
    ("uppercase type", encode(board="Gift:room42"), "bad_board", None),
    ("33-char type", encode(board="g" * 33 + ":room42"), "bad_board", None),
    ("161-char scope", encode(board="gift:" + "r" * 161), "bad_board", None),
    ("empty scope", encode(board="gift:"), "bad_board", None),
    ("empty board", encode(board=""), "bad_board", None),
    ("non-ascii scope", encode(board="gift:raum-ä"), "bad_board", None),
    ("unknown type without default", encode(board="quest:room42"), "unknown_board_type", None),
    ("empty member", encode(member=""), "bad_member", None),
    ("129-char member", encode(member="m" * 129), "bad_member", None),
    ("member with newline", encode(member="ali\nce"), "bad_member", None),
    ("member with NUL", encode(member="ali\x00ce"), "bad_member", None),
    ("member with DEL", encode(member="ali\x7fce"), "bad_member", None),
    ("member with C1 control", encode(member="ali\x85ce"), "bad_member", None),
    ("member with bidi override", encode(member="ali\u202ece"), "bad_member", None),
    ("unknown op", encode(op="add"), "unknown_op", None),
    ("op in capitals", encode(op="INCR"), "unknown_op", None),
    ("1e400", with_score("1e400"), "non_finite_score", None),
    ("-1e400", with_score("-1e400"), "non_finite_score", None),
    ("400-digit integer", with_score("9" * 400), "non_finite_score", None),
    ("2**70", with_score(str(2**70)), "score_out_of_range", None),
    ("2**64-1, still an int in orjson", with_score(str(2**64 - 1)), "score_out_of_range", None),
    ("2**53", with_score(str(2**53)), "score_out_of_range", None),
    ("2**53+2", with_score(str(2**53 + 2)), "score_out_of_range", None),
    ("-(2**53+2)", with_score(str(-(2**53 + 2))), "score_out_of_range", None),
    ("1e300", with_score("1e300"), "score_out_of_range", None),
    ("ts negative", encode(ts=-1), "ts_out_of_range", None),
    ("ts zero", encode(ts=0), "ts_out_of_range", None),
    ("ts 1 ms before 2000", encode(ts=MIN_TS_MS - 1), "ts_out_of_range", None),
    ("ts 1 ms beyond now + skew", encode(ts=MAX_TS + 1), "ts_out_of_range", None),
    ("ts year 9999", encode(ts=253402300799999), "ts_out_of_range", None),
    (
        "ts beyond 64 bits",
        encode(ts=_DROP)[:-1] + b',"ts":' + str(2**70).encode() + b"}",
        "ts_out_of_range",
        None,
    ),
    ("ts 1e400", encode(ts=_DROP)[:-1] + b',"ts":1e400}', "bad_ts", None),
    ("meta over 1 KiB", encode(meta={"bio": "x" * 1020}), "meta_too_large", None),
    ("meta nested 300 deep", NESTED_META, "meta_too_large", None),
    ("meta holding 1e400", encode(meta=_DROP)[:-1] + b',"meta":{"x":1e400}}', "bad_json", None),
    # inside arrays the index points at the element
    ("array: second element bad", orjson.dumps([event(), event(id="")]), "bad_id", 1),
    (
        "array: 1e400 in third element",
        b"[%b,%b,%b]" % (encode(), encode(), with_score("1e400")),
        "non_finite_score",
        2,
    ),
    ("array: null element", orjson.dumps([event(), None]), "bad_shape", 1),
]


@pytest.mark.parametrize(
    ("value", "reason", "index"), [row[1:] for row in MALFORMED], ids=[row[0] for row in MALFORMED]
)
def test_malformed_event_is_rejected_with_its_reason(
    value: bytes | None, reason: str, index: int | None
) -> None:
    result = parse_message(value, BOARDS, MAX_TS)

    assert result.rejections, "expected a rejection"
    assert [(r.reason, r.index) for r in result.rejections] == [(reason, index)]
    assert result.rejections[0].message
    assert "\n" not in result.rejections[0].message


def test_the_table_covers_every_reason() -> None:
    # internal_error is the worker's, for whatever raises while a message is processed
    assert {row[2] for row in MALFORMED} == {reason.value for reason in Reason} - {
        "internal_error",
        "board_closed",
        "bad_control",  # control messages' (tests/unit/test_control.py)
    }  # the worker's


def test_reason_codes_are_the_documented_strings() -> None:
    assert [reason.value for reason in Reason] == [
        "empty_value",
        "bad_json",
        "bad_shape",
        "empty_batch",
        "batch_too_large",
        "missing_field",
        "wrong_type",
        "unknown_field",
        "bad_id",
        "bad_board",
        "unknown_board_type",
        "bad_member",
        "unknown_op",
        "non_finite_score",
        "score_out_of_range",
        "bad_ts",
        "ts_out_of_range",
        "meta_too_large",
        "board_closed",
        "bad_control",
        "internal_error",
    ]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (encode(board=_DROP), "'board'"),
        (encode(colour="red"), "'colour'"),
        (encode(score="10"), "score must be a number"),
        (encode(ts=1.5), "ts must be an integer"),
        (encode(meta=[1]), "meta must be an object"),
    ],
)
def test_messages_name_the_field(value: bytes, words: str) -> None:
    assert words in parse_message(value, BOARDS, MAX_TS).rejections[0].message


def test_valid_single_event() -> None:
    value = encode(op="best", ts=1763780000000, meta={"name": "Alice"})

    result = parse_message(value, BOARDS, MAX_TS)

    assert result.rejections == ()
    assert result.events == (
        UpdateEvent(
            id="msg-1",
            board="gift:room42",
            board_type="gift",
            member="alice",
            op=Op.BEST,
            score=10.0,
            ts=1763780000000,
            meta=b'{"name":"Alice"}',
        ),
    )
    assert type(result.events[0].score) is float


def test_valid_array_gets_the_defaults() -> None:
    value = orjson.dumps([event(id="a", score=1), event(id="b", board="shop", score=-2.5)])

    result = parse_message(value, BOARDS, MAX_TS)

    assert result.rejections == ()
    assert [(e.id, e.board, e.board_type, e.op, e.score, e.ts, e.meta) for e in result.events] == [
        ("a", "gift:room42", "gift", Op.INCR, 1.0, None, None),
        ("b", "shop", "shop", Op.INCR, -2.5, None, None),
    ]


@pytest.mark.parametrize("score", [_DROP, None])
def test_delete_needs_no_score(score: object) -> None:
    (deleted,) = parse_message(encode(op="delete", score=score), BOARDS, MAX_TS).events

    assert deleted.op is Op.DELETE
    assert deleted.score == 0.0


def test_delete_with_a_bad_score_is_still_rejected() -> None:
    assert only_rejection(parse_message(encode(op="delete", score="x"), BOARDS, MAX_TS)) == (
        "wrong_type",
        None,
    )


def test_null_optional_fields_count_as_absent() -> None:
    (parsed,) = parse_message(encode(op=None, ts=None, meta=None), BOARDS, MAX_TS).events

    assert (parsed.op, parsed.ts, parsed.meta) == (Op.INCR, None, None)


def test_meta_is_reserialized_compactly() -> None:
    value = (
        b'{"id": "a", "board": "gift", "member": "m", "score": 1,\n'
        b' "meta": { "name" : "Zo\\u00eb", "lvl": 3, "tags": [ ] } }'
    )

    (parsed,) = parse_message(value, BOARDS, MAX_TS).events

    assert parsed.meta == '{"name":"Zoë","lvl":3,"tags":[]}'.encode()
    assert orjson.loads(parsed.meta) == {"name": "Zoë", "lvl": 3, "tags": []}


def test_meta_of_exactly_1_kib_is_kept() -> None:
    meta = {"bio": "x" * (1024 - len(b'{"bio":""}'))}

    (parsed,) = parse_message(encode(meta=meta), BOARDS, MAX_TS).events

    assert parsed.meta is not None
    assert len(parsed.meta) == 1024


def test_mixed_array_keeps_the_valid_elements() -> None:
    value = orjson.dumps(
        [
            event(id="ok-0"),
            event(id="bad-1", board="nope:x"),
            7,
            event(id="ok-3", member="bob", score=-3),
            event(id="bad-4", score=True),
            event(id="ok-5", op="set", score=2**53 - 1),
        ]
    )

    result = parse_message(value, BOARDS, MAX_TS)

    assert [(e.id, e.score) for e in result.events] == [("ok-0", 10.0), ("ok-3", -3.0), ("ok-5", 2.0**53 - 1)]
    assert [(r.reason, r.index) for r in result.rejections] == [
        ("unknown_board_type", 1),
        ("bad_shape", 2),
        ("wrong_type", 4),
    ]


def test_unknown_type_falls_back_to_default() -> None:
    (parsed,) = parse_message(encode(board="quest:weekly-7"), BOARDS_WITH_DEFAULT, MAX_TS).events

    assert (parsed.board, parsed.board_type) == ("quest:weekly-7", "default")


def test_configured_type_wins_over_default() -> None:
    (parsed,) = parse_message(encode(board="gift:r1"), BOARDS_WITH_DEFAULT, MAX_TS).events

    assert parsed.board_type == "gift"


def test_scope_may_contain_colons() -> None:
    (parsed,) = parse_message(encode(board="gift:eu:room:42"), BOARDS, MAX_TS).events

    assert (parsed.board, parsed.board_type) == ("gift:eu:room:42", "gift")


@pytest.mark.parametrize(
    "literal", ["9007199254740991", "-9007199254740991", "4503599627370495.5", "1e-400", "-0"]
)
def test_scores_at_the_edge_of_the_range_are_kept(literal: str) -> None:
    (parsed,) = parse_message(with_score(literal), BOARDS, MAX_TS).events

    assert parsed.score == float(literal)
    assert abs(parsed.score) <= MAX_EXACT_SCORE


def test_boundary_lengths_and_timestamps_are_kept() -> None:
    value = encode(id="i" * 128, member="m" * 128, board="g" * 32 + ":" + "s" * 160, ts=MAX_TS)
    boards = parse_boards("types: {" + "g" * 32 + ": {}}")

    (parsed,) = parse_message(value, boards, MAX_TS).events

    assert parsed.ts == MAX_TS


def test_member_may_hold_emoji_and_joiners() -> None:
    (parsed,) = parse_message(encode(member="👩\u200d💻 Zoë"), BOARDS, MAX_TS).events

    assert parsed.member == "👩\u200d💻 Zoë"


def test_array_of_exactly_500_is_accepted() -> None:
    value = orjson.dumps([event(id=f"m{i}") for i in range(MAX_BATCH)])

    assert len(parse_message(value, BOARDS, MAX_TS).events) == MAX_BATCH


def test_never_raises_on_mangled_bytes() -> None:
    rng = random.Random(20261122)
    seeds = [
        orjson.dumps([event(meta={"n": "Zoë", "l": [1, 2.5, None]}), event(op="delete", score=_DROP)]),
        with_score("1e400"),
        encode(ts=1763780000000),
    ]
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(data))
            action = rng.randrange(3)
            if action == 0:
                data[position] = rng.randrange(256)
            elif action == 1:
                del data[position]
            else:
                data.insert(position, rng.choice(b'{}[]",:\\0e-.9 \x00\xff'))

        result = parse_message(bytes(data), BOARDS, MAX_TS)

        assert len(result.events) + len(result.rejections) >= 1
        assert all(rejection.reason in set(Reason) for rejection in result.rejections)
