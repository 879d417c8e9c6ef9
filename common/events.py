"""The update event (docs/contract.md §2): a Kafka message value in, valid events and rejections out.

This is the worker's hot path (100k+ events/s), so it checks the decoded dicts by hand instead of
building a pydantic model per event. It never raises on input: every problem is a `BadEvent` with a
stable `Reason`, and a bad element of an array does not cost the valid ones beside it.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from common.boards import BoardsConfig, split_board
from common.errors import BadEvent

MAX_BATCH = 500
MAX_ID_LEN = 128
MAX_MEMBER_LEN = 128
MAX_META_BYTES = 1024
# 2**53 - 1: with both operands within it, a sum within it is computed exactly and a sum
# beyond it lands at >= 2**53, so apply.lua can refuse it instead of rounding silently
MAX_EXACT_SCORE = 2**53 - 1
# The accepted event times (docs/contract.md §2): from 2000-01-01T00:00Z to now plus the allowed future
# skew. Bounding both ends keeps every period, expiry and tie computation far from the calendar's
# limits (year 9999 overflowed the period math and killed the worker on every restart).
MIN_TS_MS = 946_684_800_000


def ts_ceiling(max_future_skew_s: int, now_ms: int | None = None) -> int:
    """The latest accepted event time right now (inclusive)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now + max_future_skew_s * 1000


def ts_out_of_range(ts: int, max_ts_ms: int, index: int | None, source: str = "ts") -> BadEvent | None:
    """The one check of the accepted range, for `ts` and for a Kafka timestamp standing in for it."""
    if MIN_TS_MS <= ts <= max_ts_ms:
        return None
    message = (
        f"{source} must be ms since the epoch in {MIN_TS_MS}..{max_ts_ms} (2000-01-01..now+skew), got {ts}"
    )
    return BadEvent(Reason.TS_OUT_OF_RANGE, message, index)


class Reason(StrEnum):
    """Stable machine-readable codes: they go to the dead-letter topic and to metrics labels."""

    EMPTY_VALUE = "empty_value"
    BAD_JSON = "bad_json"
    BAD_SHAPE = "bad_shape"
    EMPTY_BATCH = "empty_batch"
    BATCH_TOO_LARGE = "batch_too_large"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_FIELD = "unknown_field"
    BAD_ID = "bad_id"
    BAD_BOARD = "bad_board"
    UNKNOWN_BOARD_TYPE = "unknown_board_type"
    BAD_MEMBER = "bad_member"
    UNKNOWN_OP = "unknown_op"
    NON_FINITE_SCORE = "non_finite_score"
    SCORE_OUT_OF_RANGE = "score_out_of_range"
    BAD_TS = "bad_ts"
    TS_OUT_OF_RANGE = "ts_out_of_range"
    META_TOO_LARGE = "meta_too_large"
    BOARD_CLOSED = "board_closed"  # its board type's activity ended (ts at or after the end, or late)
    BAD_CONTROL = "bad_control"  # an erase or reset message (common/control.py) that can't be applied
    INTERNAL_ERROR = "internal_error"  # processing raised: the message is dead-lettered, never retried


class Op(StrEnum):
    INCR = "incr"
    SET = "set"
    BEST = "best"
    DELETE = "delete"
    # not an event op: the worker's note to apply.lua that an event's processing raised
    # (worker/apply.py); never parsed from a message
    FAILED_MARKER = "x"
    # control ops: `rankstream erase` and `rankstream reset` (common/control.py), parsed from a
    # message with the control header only, never from an event
    ERASE = "erase"
    RESET = "reset"


CONTROL_OPS = frozenset({Op.ERASE, Op.RESET})


class UpdateEvent(NamedTuple):
    """One valid event (a tuple: the worker builds one per event, and a frozen dataclass costs
    several times as much to construct)."""

    id: str
    board: str
    board_type: str
    member: str
    op: Op
    score: float
    ts: int | None
    meta: bytes | None


@dataclass(frozen=True, slots=True)
class ParseResult:
    events: tuple[UpdateEvent, ...]
    rejections: tuple[BadEvent, ...]
    # position of each valid event in its JSON array (None for a single-object message),
    # so an event rejected later (score_out_of_range) is dead-lettered with its index
    indexes: tuple[int | None, ...] = ()


def parse_message(value: bytes | None, boards: BoardsConfig, max_ts_ms: int) -> ParseResult:
    """Valid events and rejections of one message; `max_ts_ms` is the latest accepted `ts`."""
    if not value:
        return _rejected(Reason.EMPTY_VALUE, "the message value is empty")
    try:
        document = _decode(value)
    except ValueError as exc:
        return _rejected(Reason.BAD_JSON, f"not valid JSON: {exc}")
    if isinstance(document, dict):
        try:
            return ParseResult((_parse_event(document, None, boards, max_ts_ms),), (), (None,))
        except BadEvent as exc:
            return ParseResult((), (exc,))
    if isinstance(document, list):
        return _parse_batch(document, boards, max_ts_ms)
    return _rejected(Reason.BAD_SHAPE, f"expected an object or an array of objects, got {_kind(document)}")


def _parse_batch(document: list[object], boards: BoardsConfig, max_ts_ms: int) -> ParseResult:
    if not document:
        return _rejected(Reason.EMPTY_BATCH, "the array holds no events")
    if len(document) > MAX_BATCH:
        return _rejected(Reason.BATCH_TOO_LARGE, f"{len(document)} events in one array, at most {MAX_BATCH}")
    events: list[UpdateEvent] = []
    indexes: list[int] = []
    rejections: list[BadEvent] = []
    for index, element in enumerate(document):
        if type(element) is not dict:
            message = f"array element must be an object, got {_kind(element)}"
            rejections.append(BadEvent(Reason.BAD_SHAPE, message, index))
            continue
        try:
            events.append(_parse_event(element, index, boards, max_ts_ms))
            indexes.append(index)
        except BadEvent as exc:
            rejections.append(exc)
    return ParseResult(tuple(events), tuple(rejections), tuple(indexes))


def _rejected(reason: Reason, message: str) -> ParseResult:
    return ParseResult((), (BadEvent(reason, message),))


# --- one element ------------------------------------------------------------------------------

_FIELDS = frozenset({"id", "board", "member", "op", "score", "ts", "meta"})
_REQUIRED = ("id", "board", "member")
_OPS = {op.value: op for op in (Op.INCR, Op.SET, Op.BEST, Op.DELETE)}  # an event's; internal ones never
_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1
# C0, DEL and C1 controls, plus the line separators and bidi overrides that break or reorder the
# lines a leaderboard UI prints; other format characters (the emoji joiner U+200D) stay allowed.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_BOARD_SYNTAX = "<type> or <type>:<scope> (type [a-z0-9_]{1,32}, scope [A-Za-z0-9_.:-]{1,160})"


def _parse_event(
    fields: dict[str, Any], index: int | None, boards: BoardsConfig, max_ts_ms: int
) -> UpdateEvent:
    """Checks in the order unknown fields, required fields, types, values; the first problem wins."""
    _check_shape(fields, index)
    event_id: str = fields["id"]
    board: str = fields["board"]
    member: str = fields["member"]
    op_value: str | None = fields.get("op")
    if not 1 <= len(event_id) <= MAX_ID_LEN:
        raise BadEvent(Reason.BAD_ID, f"id must be 1-{MAX_ID_LEN} characters, got {len(event_id)}", index)
    parts = split_board(board)
    if parts is None:
        raise BadEvent(Reason.BAD_BOARD, f"board must be {_BOARD_SYNTAX}, got {_show(board)}", index)
    board_type = boards.type_for(parts[0])
    if board_type is None:
        message = f"board type {parts[0]!r} is not configured and there is no 'default' type"
        raise BadEvent(Reason.UNKNOWN_BOARD_TYPE, message, index)
    if not 1 <= len(member) <= MAX_MEMBER_LEN:
        message = f"member must be 1-{MAX_MEMBER_LEN} characters, got {len(member)}"
        raise BadEvent(Reason.BAD_MEMBER, message, index)
    control = _CONTROL_RE.search(member)
    if control is not None:
        message = f"member contains the control character U+{ord(control[0]):04X}"
        raise BadEvent(Reason.BAD_MEMBER, message, index)
    op = Op.INCR if op_value is None else _OPS.get(op_value)
    if op is None:
        message = f"op must be incr, set, best or delete, got {_show(op_value)}"
        raise BadEvent(Reason.UNKNOWN_OP, message, index)
    score, meta = fields.get("score"), fields.get("meta")
    return UpdateEvent(
        id=event_id,
        board=board,
        board_type=board_type.name,
        member=member,
        op=op,
        score=0.0 if score is None else _checked_score(score, index),
        ts=_checked_ts(fields.get("ts"), index, max_ts_ms),
        meta=None if meta is None else _serialized_meta(meta, index),
    )


def member_problem(member: str) -> str | None:
    """What makes `member` invalid (None: nothing), as `_parse_event` checks it inline."""
    if not 1 <= len(member) <= MAX_MEMBER_LEN:
        return f"member must be 1-{MAX_MEMBER_LEN} characters, got {len(member)}"
    control = _CONTROL_RE.search(member)
    if control is not None:
        return f"member contains the control character U+{ord(control[0]):04X}"
    return None


def _check_shape(fields: dict[str, Any], index: int | None) -> None:
    """Unknown fields, then missing ones, then JSON types; values are `_parse_event`'s business."""
    if not fields.keys() <= _FIELDS:
        unknown = next(name for name in fields if name not in _FIELDS)
        raise BadEvent(Reason.UNKNOWN_FIELD, f"unknown field {_show(unknown)}", index)
    for name in _REQUIRED:
        if name not in fields:
            raise BadEvent(Reason.MISSING_FIELD, f"field {name!r} is required", index)
    op_value = fields.get("op")
    if "score" not in fields and op_value != Op.DELETE:
        raise BadEvent(Reason.MISSING_FIELD, "field 'score' is required unless op is 'delete'", index)
    for name in _REQUIRED:
        if type(fields[name]) is not str:
            raise _wrong_type(name, "a string", fields[name], index)
    if op_value is not None and type(op_value) is not str:
        raise _wrong_type("op", "a string", op_value, index)
    # null counts as absent for the optional fields; score is optional only for delete.
    score = fields.get("score")
    if (score is not None or op_value != Op.DELETE) and not _is_number(score):
        raise _wrong_type("score", "a number", score, index)
    ts = fields.get("ts")
    if ts is not None and type(ts) is not int and not (isinstance(ts, float) and _is_overflowed_int(ts)):
        # the contract's own code for a ts that is not an integer at all (string, fraction, bool)
        message = f"ts must be an integer (ms since the epoch), got {_kind(ts)} {_show(ts)}"
        raise BadEvent(Reason.BAD_TS, message, index)
    meta = fields.get("meta")
    if meta is not None and type(meta) is not dict:
        raise _wrong_type("meta", "an object", meta, index)


def _is_number(value: object) -> bool:
    # bool is an int subclass, so exact type checks; _Overflow is the one float subclass allowed.
    return type(value) is int or isinstance(value, float)


def _is_overflowed_int(value: float) -> bool:
    # orjson turns integers beyond 64 bits into floats, so such a float may have been written as an
    # integer: it is out of range (bad_ts) rather than of the wrong type.
    return not math.isfinite(value) or (value.is_integer() and not _I64_MIN <= value <= _U64_MAX)


def _checked_score(score: float, index: int | None) -> float:
    if not math.isfinite(score):
        message = "score does not fit a 64-bit float (it parses as infinity)"
        raise BadEvent(Reason.NON_FINITE_SCORE, message, index)
    if abs(score) > MAX_EXACT_SCORE:
        message = f"score must be within ±(2**53 - 1) to stay exact, got {score:.17g}"
        raise BadEvent(Reason.SCORE_OUT_OF_RANGE, message, index)
    return float(score)


def _checked_ts(ts: float | None, index: int | None, max_ts_ms: int) -> int | None:
    if ts is None:
        return None
    if type(ts) is not int:
        # orjson hands integers beyond 64 bits over as floats; 1e400 parses as infinity
        if not math.isfinite(ts):
            raise BadEvent(Reason.BAD_TS, "ts must be an integer (ms since the epoch), got infinity", index)
        message = f"ts must be ms since the epoch in {MIN_TS_MS}..{max_ts_ms}, got {ts:.17g}"
        raise BadEvent(Reason.TS_OUT_OF_RANGE, message, index)
    bad = ts_out_of_range(ts, max_ts_ms, index)
    if bad is not None:
        raise bad
    return ts


def _serialized_meta(meta: dict[str, Any], index: int | None) -> bytes:
    try:
        data = orjson.dumps(meta, default=_refuse_overflow)
    except orjson.JSONEncodeError as exc:
        if isinstance(exc.__cause__, _MetaOverflowError):
            raise BadEvent(
                Reason.BAD_JSON, "meta holds a number beyond the 64-bit float range", index
            ) from None
        # orjson writes at most 255 levels; anything deeper is too large to keep as a profile.
        raise BadEvent(Reason.META_TOO_LARGE, "meta is nested too deeply", index) from None
    if len(data) > MAX_META_BYTES:
        message = f"meta is {len(data)} bytes as compact JSON, at most {MAX_META_BYTES}"
        raise BadEvent(Reason.META_TOO_LARGE, message, index)
    return data


def _wrong_type(name: str, expected: str, value: object, index: int | None) -> BadEvent:
    return BadEvent(Reason.WRONG_TYPE, f"{name} must be {expected}, got {_kind(value)}", index)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


# --- decoding ---------------------------------------------------------------------------------


class _Overflow(float):
    """A JSON number too large for a double (1e400, a 400-digit integer). orjson refuses the
    whole document for one of them; this marker lets only the element that holds it be rejected."""

    __slots__ = ()


class _MetaOverflowError(TypeError):
    pass


def _refuse_overflow(value: object) -> object:
    raise _MetaOverflowError(type(value).__name__)


def decode_value(value: bytes) -> object:
    """A message value decoded as the worker decodes it (numbers beyond a double as infinity, so
    only the element that holds one is refused); ValueError if it is not JSON. `rankstream dlq`
    reads dead letters with it."""
    return _decode(value)


def _decode(value: bytes) -> object:
    """orjson, strict and fast; on its rare failures, a second look for numbers beyond the double
    range, the one thing orjson rejects per document that the contract rejects per element."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        document = _decode_with_overflow(value)
        if document is None:
            raise ValueError(str(exc)) from None
        return document


def _decode_with_overflow(value: bytes) -> object:
    overflowed = False

    def number(text: str) -> float:
        nonlocal overflowed
        parsed = float(text)
        if math.isfinite(parsed):
            return parsed
        overflowed = True
        return _Overflow(parsed)

    def integer(text: str) -> float:
        # The same split as orjson: 64-bit integers exact, larger ones as floats.
        if len(text) <= 20 and _I64_MIN <= (parsed := int(text)) <= _U64_MAX:
            return parsed
        return number(text)

    def constant(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        document = json.loads(
            value.decode("utf-8"), parse_float=number, parse_int=integer, parse_constant=constant
        )
        # orjson's own encoder re-checks what the lenient stdlib parser lets through (lone surrogates).
        orjson.dumps(document, default=lambda _: None)
    except (ValueError, RecursionError, orjson.JSONEncodeError):
        return None
    return document if overflowed else None
