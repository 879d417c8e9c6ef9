"""Control messages: `rankstream erase` and `rankstream reset` as messages on update_rank.

They travel with the board's events (keyed by the board), so the worker applies them in stream
order, behind the board's offset fence (a redelivered one changes nothing) and publishes their
update_cache records in the same transaction as the events around them.

A control message carries the header `rankstream-control` (`erase` or `reset`) and one JSON
object (unknown fields refused; `window` and `period` may be null or absent):

    erase  {"id": "erase:<uuid4 hex>", "board": "<board>", "member": "<member>"}
    reset  {"id": "reset:<uuid4 hex>", "board": "<board>", "window": W, "period": P}

The worker turns one into an `UpdateEvent` of op ERASE or RESET; a reset's selector rides in
its `member` field:

    *                       the whole board (every window, and the members' meta)
    <window>                every period of that window (`total`: the total)
    <window>:<period id>    that one period (its canonical id)

Anything that can't be applied is a `BadEvent` with reason `bad_control` (dead-lettered)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import orjson

from common.boards import BoardsConfig, BoardType, split_board
from common.errors import BadEvent
from common.events import MAX_ID_LEN, Op, Reason, UpdateEvent, member_problem
from common.periods import parse_period
from common.windows import WindowKind

CONTROL_HEADER = "rankstream-control"
WHOLE_BOARD = "*"
# a message to produce: its value and headers (confluent-kafka's shape)
Message = tuple[bytes, list[tuple[str, str | bytes | None]]]
_KINDS = {Op.ERASE.value: Op.ERASE, Op.RESET.value: Op.RESET}
_FIELDS = {
    Op.ERASE: frozenset({"id", "board", "member"}),
    Op.RESET: frozenset({"id", "board", "window", "period"}),
}


def control_kind(headers: Iterable[tuple[str, str | bytes | None]] | None) -> bytes | None:
    """The value of the control header (None: an ordinary message)."""
    if not headers:
        return None
    for name, value in headers:
        if name == CONTROL_HEADER:
            return value.encode() if isinstance(value, str) else value or b""
    return None


def _bad(message: str) -> BadEvent:
    return BadEvent(Reason.BAD_CONTROL, message)


def check_board(boards: BoardsConfig, board: object) -> BoardType:
    """The board's type (BadEvent if the id is malformed or its type is not configured)."""
    parts = split_board(board) if isinstance(board, str) else None
    if parts is None:
        raise _bad(f"board must be <type> or <type>:<scope>, got {board!r}")
    board_type = boards.type_for(parts[0])
    if board_type is None:
        raise _bad(f"board type {parts[0]!r} is not configured and there is no 'default' type")
    return board_type


def check_member(member: object) -> str:
    if not isinstance(member, str):
        raise _bad(f"member must be a string, got {member!r}")
    problem = member_problem(member)
    if problem is not None:
        raise _bad(problem)
    return member


def reset_selector(boards: BoardsConfig, board_type: BoardType, window: object, period: object) -> str:
    """The canonical selector of what a reset empties (see the module's docstring)."""
    if window is None:
        if period is not None:
            raise _bad("a period needs its window (--window)")
        return WHOLE_BOARD
    if not isinstance(window, str) or not any(w.name == window for w in board_type.windows):
        names = ", ".join(w.name for w in board_type.windows)
        raise _bad(f"window {window!r} is not one of board type {board_type.name!r}'s windows ({names})")
    found = board_type.window(window)
    if period is None:
        return window
    if found.kind is WindowKind.ROLLING:  # its periods are sums of the same buckets
        raise _bad(f"window {window!r} is rolling: reset it whole, without a period")
    if not found.periodic:
        raise _bad(f"window {window!r} has no periods: reset it without a period")
    if not isinstance(period, str):
        raise _bad(f"period must be a string, got {period!r}")
    try:
        return f"{window}:{parse_period(found, period, boards.timezone).id}"
    except ValueError as exc:
        raise _bad(f"period {period!r} of window {window!r}: {exc}") from None


def parse_selector(selector: str) -> tuple[str | None, str | None]:
    """(window, period id) of a reset's selector; (None, None) for the whole board."""
    if selector == WHOLE_BOARD:
        return None, None
    window, _, period = selector.partition(":")
    return window, period or None


def parse_control(kind: bytes, value: bytes | None, boards: BoardsConfig) -> UpdateEvent:
    """The control op a message with the control header carries (BadEvent bad_control if none)."""
    op = _KINDS.get(kind.decode("utf-8", "replace"))
    if op is None:
        raise _bad(f"the {CONTROL_HEADER} header must be erase or reset, got {kind!r}")
    try:
        fields = orjson.loads(value or b"")
    except orjson.JSONDecodeError as exc:
        raise _bad(f"not valid JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise _bad(f"the value must be a JSON object, got {type(fields).__name__}")
    unknown = sorted(set(fields) - _FIELDS[op])
    if unknown:
        raise _bad(f"unknown field {unknown[0]!r} in a {op.value} message")
    control_id = fields.get("id")
    if not isinstance(control_id, str) or not 1 <= len(control_id) <= MAX_ID_LEN:
        raise _bad(f"id must be a string of 1-{MAX_ID_LEN} characters")
    board_type = check_board(boards, fields.get("board"))
    if op is Op.ERASE:
        target = check_member(fields.get("member"))
    else:
        target = reset_selector(boards, board_type, fields.get("window"), fields.get("period"))
    return UpdateEvent(
        id=control_id,
        board=fields["board"],
        board_type=board_type.name,
        member=target,
        op=op,
        score=0.0,
        ts=None,
        meta=None,
    )


def control_message(op: Op, board: str, **fields: Any) -> Message:
    """The value and headers of a control message (`member=` for erase; `window=`, `period=`)."""
    body = {"id": f"{op.value}:{uuid.uuid4().hex}", "board": board, **fields}
    return orjson.dumps(body), [(CONTROL_HEADER, op.value.encode())]
