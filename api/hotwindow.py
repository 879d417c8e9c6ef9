"""One hot board window instance in memory, ordered exactly as Redis orders it.

Each member is one `bytes` key in a SortedList (sortedcontainers: O(log n) add/remove/index,
O(log n + k) slices) and the same object in a dict member -> key:

    sortable(score) | encoded member | terminator | seq

`sortable` maps a double to 8 bytes whose byte order is the number order (complemented for desc
boards, so the best member is always first). The encoded member is what Redis orders equal
scores by: the 6 raw bytes of the tie prefix Redis keys carry as 12 hex digits (same order),
then the member id. For desc boards it is inverted byte by byte and ends in 0xff, which is
exactly Redis' reverse-lexicographic order (a member id never holds a NUL, so neither 0xff nor
0x00 occurs inside it). The trailing seq never decides order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from sortedcontainers import SortedList

from common.ranking import TieMode

_DOUBLE = struct.Struct(">d")
_U64 = struct.Struct(">Q")
_SIGN = 1 << 63
_MASK = (1 << 64) - 1
_TIE_MAX = (1 << 48) - 1
_INVERT = bytes(range(255, -1, -1))


def _sortable(score: float, desc: bool) -> bytes:
    # + 0.0 turns -0.0 into 0.0: Redis holds them equal, so must the byte order
    bits = _U64.unpack(_DOUBLE.pack(score + 0.0))[0]
    bits = (~bits & _MASK) if bits & _SIGN else bits | _SIGN
    return _U64.pack(~bits & _MASK if desc else bits)


def _unsortable(raw: bytes, desc: bool) -> float:
    bits = _U64.unpack_from(raw)[0]
    if desc:
        bits = ~bits & _MASK
    bits = bits & ~_SIGN if bits & _SIGN else ~bits & _MASK
    value: float = _DOUBLE.unpack(_U64.pack(bits))[0]
    return value


def _next_prefix(prefix: bytes) -> bytes:
    return _U64.pack(_U64.unpack(prefix)[0] + 1) if prefix != b"\xff" * 8 else b"\xff" * 9


class HotWindow:
    """Members of one window instance, in the board's order (best first)."""

    __slots__ = ("_desc", "_keys", "_list", "_mode", "_tie_len", "_tombs", "loading")

    def __init__(self, desc: bool, mode: TieMode) -> None:
        self._desc = desc
        self._mode = mode
        self._tie_len = 0 if mode is TieMode.NONE else 6
        self._keys: dict[str, bytes] = {}
        self._list: SortedList = SortedList()
        self._tombs: dict[str, int] = {}  # deleted member -> seq of the delete (rejects older states)
        self.loading = True  # while replaying: the dict only; the sorted list is built once at the end

    def _key(self, member: str, score: float, tie: int, seq: int) -> bytes:
        if self._mode is TieMode.INV:
            tie_bytes = _U64.pack(_TIE_MAX - tie)[2:]
        elif self._mode is TieMode.FWD:
            tie_bytes = _U64.pack(tie)[2:]
        else:
            tie_bytes = b""
        encoded = tie_bytes + member.encode()  # what Redis orders equal scores by
        body = encoded.translate(_INVERT) + b"\xff" if self._desc else encoded + b"\x00"
        return _sortable(score, self._desc) + body + _U64.pack(seq)

    def _member(self, key: bytes) -> str:
        body = key[8:-9]
        return (body.translate(_INVERT) if self._desc else body)[self._tie_len :].decode()

    @staticmethod
    def _seq(key: bytes) -> int:
        seq: int = _U64.unpack_from(key, len(key) - 8)[0]
        return seq

    def items(self) -> dict[str, tuple[float, int, int]]:
        """member -> (score, tie ms, seq): the whole window, for inspection and tests."""
        out = {}
        for member, key in self._keys.items():
            body = key[8:-9]
            encoded = body.translate(_INVERT) if self._desc else body
            tie = 0
            if self._tie_len:
                raw = _U64.unpack(b"\0\0" + encoded[:6])[0]
                tie = _TIE_MAX - raw if self._mode is TieMode.INV else raw
            out[member] = (_unsortable(key, self._desc), tie, self._seq(key))
        return out

    def __len__(self) -> int:
        return len(self._keys)

    def seq_of(self, member: str) -> int:
        key = self._keys.get(member)
        return self._seq(key) if key is not None else self._tombs.get(member, -1)

    def put(self, member: str, score: float, tie: int, seq: int) -> bool:
        """Set a member's state unless a newer one is known; True if applied."""
        old = self._keys.get(member)
        if (self._seq(old) if old is not None else self._tombs.get(member, -1)) > seq:
            return False
        key = self._key(member, score, tie, seq)
        if not self.loading:
            if old is not None:
                self._list.remove(old)
            self._list.add(key)
        self._keys[member] = key
        self._tombs.pop(member, None)
        return True

    def delete(self, member: str, seq: int) -> bool:
        old = self._keys.get(member)
        if (self._seq(old) if old is not None else self._tombs.get(member, -1)) > seq:
            return False
        if old is not None:
            del self._keys[member]
            if not self.loading:
                self._list.remove(old)
        self._tombs[member] = seq
        return True

    def finish_loading(self) -> None:
        """Build the sorted list once from every key (one sort beats a million inserts)."""
        self._list = SortedList(self._keys.values())
        self.loading = False

    # --- reads (positions are 0-based in the view; `reverse` flips the board's order) --------
    def page(self, start: int, stop: int, reverse: bool) -> list[tuple[str, float]]:
        n = len(self._list)
        if reverse:
            keys: Iterable[bytes] = reversed(self._list[max(n - stop, 0) : max(n - start, 0)])
        else:
            keys = self._list[start:stop]
        return [(self._member(k), _unsortable(k, self._desc)) for k in keys]

    def locate(self, member: str, reverse: bool) -> tuple[float, int, int] | None:
        """(score, position, members strictly better) in the view, or None."""
        key = self._keys.get(member)
        if key is None:
            return None
        position = self._list.index(key)
        score = _unsortable(key, self._desc)
        better, _ = self.better_and_equal(score, reverse)
        return score, (len(self._list) - 1 - position if reverse else position), better

    def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int]:
        prefix = _sortable(score, self._desc)
        before = self._list.bisect_left(prefix)
        through = self._list.bisect_left(_next_prefix(prefix))
        equal = through - before
        return (len(self._list) - through, equal) if reverse else (before, equal)

    def count_between(self, low: float, high: float) -> int:
        if low > high:
            return 0
        a, b = _sortable(low, self._desc), _sortable(high, self._desc)
        first, last = (b, a) if self._desc else (a, b)
        return int(self._list.bisect_left(_next_prefix(last)) - self._list.bisect_left(first))
