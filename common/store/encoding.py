"""Every encoding of the Redis contract, and the memory order that must equal Redis' order.

Scores. A board's zset score is the member's exact score. Scores are IEEE doubles; integer
scores are exact for |score| <= EXACT_MAX = 2**53 - 1: with both operands inside that range, an
incr whose true result is inside it is computed exactly, and one whose true result is outside
lands at >= 2**53 and is refused, so no score is ever rounded silently. Such events (and any
event whose own score is outside the range) are dead-lettered as `score_out_of_range`.
Non-integer scores are IEEE doubles with their usual rounding. `format_score` is the one text
form of a score (what apply.lua writes and ZCOUNT bounds use).

Ties. Equal scores are ordered by the time (ms) the member reached that score: that time is
written as a fixed-width hex prefix of the zset member (TIE_WIDTH digits, exact to the
millisecond up to 9999-12-31), so Redis' own bytewise ordering of equal-score members *is* the
tie rule. Desc boards read with ZREVRANGE (equal scores: larger member first), asc boards with
ZRANGE; `tie_mode` picks the prefix that makes the board's tie_break come out.

Packed windows. A board type that declares its score range keeps, in the windows where it fits,
the tie inside an integer score and the member's id as the zset member (common/store/packing.py,
`Packing`): one sorted-set entry per member, no tie prefix, no tie index.

Member state. "<score>|<tie ms>" (`parse_state`; written by common/store/lua/encoding.lua) is
how the scripts report a member's state, and what the previous release's state hash holds.

Memory. A hot window orders `sortable_score(...) + memory_body(...)` bytes: an 8-byte
order-preserving image of the score, then the tie-encoded member as Redis holds it, inverted
for desc boards so the best member is always first; tests/integration/test_store_order.py
proves it is Redis' order.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import overload

from common.boards import BoardType, Order, TieBreak, Window, WindowKind
from common.store.packing import BEFORE_START_MS, longest_period_ms, packable, tie_bits

EXACT_MAX = 2**53 - 1
TIE_BYTES = 6  # 48 bits of milliseconds, beyond year 9999
TIE_WIDTH = 2 * TIE_BYTES  # the hex digits of a zset member's tie prefix
TIE_MAX = (1 << (8 * TIE_BYTES)) - 1


class TieMode(StrEnum):
    """How members are prefixed: `inv` = earlier sorts later bytewise, `fwd` = earlier sorts first."""

    INV = "inv"
    FWD = "fwd"
    NONE = "none"


class Status(IntEnum):
    """What apply.lua reports per event."""

    DUPLICATE = 0  # the id was applied less than the id window ago (a producer retry)
    APPLIED = 1
    OUT_OF_RANGE = 2  # rejected by the script (also when redelivered: the fence remembers)
    REDELIVERED = 3  # at or before the board's fence for its source: already handled
    FAILED = 4  # redelivered, and its processing raised on its first delivery (dead-letter it again)


def tie_mode(board_type: BoardType) -> TieMode:
    if board_type.tie_break is TieBreak.NONE:
        return TieMode.NONE
    earlier_first = board_type.tie_break is TieBreak.FIRST
    # desc reads in reverse byte order, so "earlier first" needs earlier times to sort *later*
    if (board_type.order is Order.DESC) == earlier_first:
        return TieMode.INV
    return TieMode.FWD


def window_bits(board_type: BoardType, window: Window) -> int | None:
    """The tie bits a window of the type packs beside its scores; None: the general layout (a
    rolling window's always: its tie, the member's latest event, says which buckets it is in)."""
    if board_type.score_range is None or window.kind is WindowKind.ROLLING:
        return None
    if board_type.league is not None and window.kind is WindowKind.SEASON:
        return None  # a division's ties are join orders (common/league.py), not times
    bits = tie_bits(longest_period_ms(window), board_type.tie_break is not TieBreak.NONE)
    return bits if bits is not None and packable(board_type.score_range, bits) else None


def window_packing(board_type: BoardType, window: Window, period_start_ms: int) -> Packing | None:
    """How an instance of the window (its period starting at `period_start_ms`; 0 for total)
    packs; None: the general layout."""
    bits = window_bits(board_type, window)
    if bits is None:
        return None
    base = period_start_ms - BEFORE_START_MS if bits else 0  # without ties nothing counts from it
    return Packing(bits, base, tie_mode(board_type) is TieMode.INV)


def _tie_value(mode: TieMode, tie_ms: int) -> int:
    return TIE_MAX - tie_ms if mode is TieMode.INV else tie_ms


def encode_member(mode: TieMode, tie_ms: int, member: str) -> str:
    """The zset member of `member` that reached its score at `tie_ms`."""
    if mode is TieMode.NONE:
        return member
    return f"{_tie_value(mode, tie_ms):0{TIE_WIDTH}x}{member}"


def decode_member(mode: TieMode, encoded: str) -> str:
    return encoded if mode is TieMode.NONE else encoded[TIE_WIDTH:]


def decode_entry(mode: TieMode, encoded: str) -> tuple[str, int]:
    """(member, tie) of a tie-prefixed zset member (encode_member's inverse; mode not none)."""
    return encoded[TIE_WIDTH:], _tie_value(mode, int(encoded[:TIE_WIDTH], 16))  # inv: its own inverse


def tie_prefix_length(mode: TieMode) -> int:
    """Characters of a zset member before the member id."""
    return 0 if mode is TieMode.NONE else TIE_WIDTH


def format_score(score: float) -> str:
    """The one text form of a score: integers without a fraction, others round-trip exact."""
    value = float(score)  # an int is a float to the type checker, not to is_integer()
    if value.is_integer() and abs(value) <= 2**53:
        return str(int(value))
    return repr(value)


@overload
def text(raw: bytes | str) -> str: ...


@overload
def text(raw: bytes | str | None) -> str | None: ...


def text(raw: bytes | str | None) -> str | None:
    """A reply field as text (clients with and without decode_responses); None stays None."""
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True, slots=True)
class MemberState:
    score: float
    tie_ms: int


def state_text(score: float, tie_ms: int) -> str:
    """A member's state as a state hash (and a rolling bucket) holds it: encoding.lua ENC.state."""
    return f"{format_score(score)}|{tie_ms}"


def parse_state(raw: bytes | str) -> MemberState | None:
    """A state hash value (or apply.lua's reply of one); '' = absent."""
    value = text(raw)
    if not value:
        return None
    score, tie = value.split("|")
    return MemberState(float(score), int(tie))


@dataclass(frozen=True, slots=True)
class Packing:
    """One packed window instance: `bits` of tie time beside the score, counted from `base_ms`
    (BEFORE_START_MS before the start of the instance's period: `window_packing`), inverted
    when the tie mode is inv. apply.lua packs (encoding.lua ENC.pack); this side reads."""

    bits: int
    base_ms: int
    inv: bool

    def unpack(self, value: float | bytes | str) -> MemberState:
        packed = int(float(value))
        score, offset = packed >> self.bits, packed & ((1 << self.bits) - 1)
        tie = (1 << self.bits) - 1 - offset if self.inv else offset
        return MemberState(float(score), self.base_ms + tie if self.bits else 0)

    def score_of(self, value: float | bytes | str) -> float:
        """The score of a packed value (a reply field, exact: packed values stay within 2**53)."""
        return float(int(float(value)) >> self.bits)

    def at_least(self, score: float) -> int:
        """The smallest packed value of a score >= `score`."""
        return math.ceil(score) << self.bits

    def above(self, score: float) -> int:
        """The smallest packed value of a score > `score`."""
        return (math.floor(score) + 1) << self.bits


def pack(p: Packing, score: float, tie: int) -> float:
    """encoding.lua ENC.pack, in the same double arithmetic."""
    if p.bits == 0:
        return score
    off = tie - p.base_ms
    scale = float(1 << p.bits)
    if p.inv:
        off = int(scale) - 1 - off
    return score * scale + off


def packed_bound(packing: Packing, bound: str, low: bool) -> str:
    """A ZCOUNT bound on scores (`-inf`, `(5`, `10`) as the same bound on packed values."""
    if bound in ("-inf", "+inf", "inf"):
        return bound
    exclusive = bound.startswith("(")
    value = float(bound[1:] if exclusive else bound)
    if abs(value) > EXACT_MAX:  # beyond every packed value: the matching infinity
        return "+inf" if value > 0 else "-inf"
    if low:  # score > v (exclusive) or score >= v: packed >= the first such
        return str(packing.above(value) if exclusive else packing.at_least(value))
    # score < v (exclusive) or score <= v: packed < the first score >= v (or > v)
    return f"({packing.at_least(value) if exclusive else packing.above(value)}"


# --- memory: bytes whose order is Redis' order (api/hotwindow.py) ------------------------------
_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")
_SIGN = 1 << 63
_MASK = (1 << 64) - 1
_INVERT = bytes(range(255, -1, -1))
SCORE_BYTES = 8


def sortable_score(score: float, desc: bool) -> bytes:
    """8 bytes whose byte order is the number order (complemented for desc: best first)."""
    # + 0.0 turns -0.0 into 0.0: Redis holds them equal, so must the byte order
    bits = _U64.unpack(_DOUBLE.pack(score + 0.0))[0]
    bits = (~bits & _MASK) if bits & _SIGN else bits | _SIGN
    return _U64.pack(~bits & _MASK if desc else bits)


def unsortable_score(raw: bytes, desc: bool) -> float:
    bits = _U64.unpack_from(raw)[0]
    if desc:
        bits = ~bits & _MASK
    bits = bits & ~_SIGN if bits & _SIGN else ~bits & _MASK
    value: float = _DOUBLE.unpack(_U64.pack(bits))[0]
    return value


_FLIP_TOP = bytes(b ^ 0x80 for b in range(256))
_NEG_ZERO = _DOUBLE.pack(-0.0)
_SORTABLE_ZERO = b"\x80" + bytes(7)


def memory_key_maker(
    mode: TieMode, desc: bool, *, score_at: slice, tie_at: slice, seq_at: slice
) -> Callable[[bytes, bytes], bytes]:
    """f(state, member) = `sortable_score(score, desc) + memory_body(mode, desc, member, tie)`
    followed by the seq's bytes, built from bytes: `state` holds the score as a big-endian double
    at `score_at`, the tie ms as 6 big-endian bytes at `tie_at`, the seq at `seq_at`; the member
    is UTF-8. Byte translations only (a replay builds a million of them): a double's order image
    flips its top bit (>= 0) or every bit (< 0), the inv tie TIE_MAX - t is t's complement, and a
    desc key is the asc one complemented (tests/unit/test_hotwindow.py holds it to the functions
    above)."""
    inv_tie = mode is TieMode.INV
    no_tie = mode is TieMode.NONE

    def make(state: bytes, member: bytes) -> bytes:
        raw = state[score_at]
        if raw[0] < 0x80:
            image = raw[:1].translate(_FLIP_TOP) + raw[1:]
        else:
            image = _SORTABLE_ZERO if raw == _NEG_ZERO else raw.translate(_INVERT)
        if no_tie:
            body = image + member
        else:
            body = image + (state[tie_at].translate(_INVERT) if inv_tie else state[tie_at]) + member
        if desc:
            return body.translate(_INVERT) + b"\xff" + state[seq_at]
        return body + b"\x00" + state[seq_at]

    return make


def next_prefix(prefix: bytes) -> bytes:
    """The smallest 8-byte string above every key starting with `prefix`."""
    return _U64.pack(_U64.unpack(prefix)[0] + 1) if prefix != b"\xff" * 8 else b"\xff" * 9


def memory_body(mode: TieMode, desc: bool, member: str, tie_ms: int) -> bytes:
    """The bytes after the score: the zset member as Redis orders it (the tie prefix's 6 raw
    bytes order as its 12 hex digits do), inverted byte by byte and ended by 0xff for desc
    boards, which is exactly Redis' reverse-lexicographic order (a member id never holds a NUL,
    so neither 0xff nor 0x00 occurs inside it), ended by 0x00 for asc boards."""
    tie = b"" if mode is TieMode.NONE else _U64.pack(_tie_value(mode, tie_ms))[8 - TIE_BYTES :]
    encoded = tie + member.encode()
    return encoded.translate(_INVERT) + b"\xff" if desc else encoded + b"\x00"


def memory_member(mode: TieMode, desc: bool, body: bytes) -> tuple[str, int]:
    """(member, tie ms) of a `memory_body` without its terminator."""
    encoded = body.translate(_INVERT) if desc else body
    if mode is TieMode.NONE:
        return encoded.decode(), 0
    value = _U64.unpack(b"\0" * (8 - TIE_BYTES) + encoded[:TIE_BYTES])[0]
    return encoded[TIE_BYTES:].decode(), _tie_value(mode, value)


def memory_member_id(mode: TieMode, desc: bool, body: bytes) -> str:
    """The member of a `memory_body` without its terminator (a page's hot path: no tie)."""
    return (body.translate(_INVERT) if desc else body)[0 if mode is TieMode.NONE else TIE_BYTES :].decode()


def hot_flag(seq: int, windows: tuple[str, ...]) -> str:
    """A hot board's backfill flag (BoardKeys.hot_ready): the seq it was backfilled at and which
    windows (worker/backfill.py)."""
    return f"{seq}|{','.join(sorted(windows))}"


def hot_flag_covers(raw: bytes | str | None, windows: tuple[str, ...]) -> bool:
    """Whether a board's flag says every one of `windows` was backfilled (a flag of the form
    "<seq>", from before the windows were recorded, says none was)."""
    if raw is None:
        return False
    _, sep, names = text(raw).partition("|")
    return bool(sep) and set(windows) <= set(names.split(","))
