"""What `rankstream dlq replay` does with one dead letter (pure: no Kafka here): send it, or say
why not, in one line.

The order of the checks: replayed before (the ledger; --force passes it), an erase or reset (not
an event), the one event the dead letter stands for (records.py: never an array's other
elements), the fix, the id kept, `ts`, then the worker's own parser: what is sent is exactly what
was checked, and the worker would accept it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from common.boards import BoardsConfig
from common.events import MAX_ID_LEN, Reason, parse_message
from rankstream.dlq.fix import Fix, apply_fix
from rankstream.dlq.ledger import Entry, Ledger, replayed_before
from rankstream.dlq.records import DeadLetter, Unreplayable, iso_ms, original_event


@dataclass(frozen=True, slots=True)
class Send:
    letter: DeadLetter
    event: dict[str, Any]
    key: bytes  # the event's board, as any producer keys it
    value: bytes
    before: Entry | None  # --force: when it was replayed before


@dataclass(frozen=True, slots=True)
class Leave:
    letter: DeadLetter
    outcome: Literal["already", "skipped", "refused"]
    why: str


def plan(
    letter: DeadLetter,
    *,
    ledger: Ledger,
    fix: Fix | None,
    boards: BoardsConfig,
    max_ts_ms: int,
    force: bool,
) -> Send | Leave:
    """Send or Leave `letter`; `max_ts_ms`: the latest `ts` the worker accepts now."""
    before = replayed_before(ledger, letter)
    if before is not None and not force:
        when = iso_ms(before.replayed_at_ms) if before.source is not None else "(unreadable ledger record)"
        return Leave(letter, "already", f"replayed at {when}; --force sends it again")
    try:
        checked = _event(letter, fix, max_ts_ms, boards)
    except Unreplayable as exc:
        return Leave(letter, "refused", str(exc))
    if checked is None:
        return Leave(letter, "skipped", "the fix returned None")
    event, value = checked
    return Send(letter, event, str(event["board"]).encode(), value, before)


def _event(
    letter: DeadLetter, fix: Fix | None, max_ts_ms: int, boards: BoardsConfig
) -> tuple[dict[str, Any], bytes] | None:
    """The event to send and its bytes; None when the fix leaves it out."""
    if letter.reason == Reason.BAD_CONTROL:
        raise Unreplayable("an erase or reset, not an event: run `rankstream erase` or `reset` again")
    original = original_event(letter)
    event = original if fix is None else apply_fix(fix, original)
    if event is None:
        return None
    _check_id_kept(original.get("id"), event.get("id"))
    if event.get("ts") is None:
        # when the worker first read it (to within its lag), not when it is replayed: the periods
        # it would have counted in (docs/producing.md: set ts when you replay)
        event = {**event, "ts": letter.timestamp_ms}
    value = encode(event)
    found = parse_message(value, boards, max_ts_ms)
    if found.rejections:
        bad = found.rejections[0]
        raise Unreplayable(f"still invalid: {bad.reason}: {bad.message}")
    return event, value


def _check_id_kept(was: object, now: object) -> None:
    """A replay keeps the event's id: only the id window tells a replay from its first delivery.
    An id that was no valid id (missing, empty, too long, not a string) is for the fix to set."""
    valid = isinstance(was, str) and 1 <= len(was) <= MAX_ID_LEN
    if valid and now != was:
        raise Unreplayable(f"the fix changed the id ({was!r} -> {now!r}): a replay keeps its id")


def encode(event: dict[str, Any]) -> bytes:
    """The event as compact UTF-8 JSON; Unreplayable if it is not JSON (a number beyond a double,
    a value of another type a fix put there)."""
    try:
        return json.dumps(event, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
        raise Unreplayable(f"the event is not JSON: {exc}") from None
