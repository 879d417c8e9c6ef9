"""One hot board window instance in memory, ordered exactly as Redis orders it.

Each member is one `bytes` key in a SortedList (sortedcontainers: O(log n) add/remove/index,
O(log n + k) slices) and the same object in a dict member -> key:

    sortable(score) | encoded member | terminator | seq

The first three parts are common/store/encoding.py's memory order (Redis' order, proved by
tests/integration/test_store_order.py); the trailing seq never decides order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from sortedcontainers import SortedList

from common.store.encoding import (
    SCORE_BYTES,
    TieMode,
    memory_body,
    memory_member,
    memory_member_id,
    next_prefix,
    sortable_score,
    unsortable_score,
)
from common.store.shards import shard_index

_U64 = struct.Struct(">Q")


class HotWindow:
    """Members of one window instance, in the board's order (best first)."""

    __slots__ = ("_desc", "_floor", "_keys", "_list", "_mode", "_shards", "_tombs", "loading")

    def __init__(self, desc: bool, mode: TieMode, shards: int = 1) -> None:
        self._desc = desc
        self._mode = mode
        self._shards = shards  # a sharded board: each shard's seqs count apart (common/store/shards.py)
        self._keys: dict[str, bytes] = {}
        self._list: SortedList = SortedList()
        self._tombs: dict[str, int] = {}  # deleted member -> seq of the delete (rejects older states)
        # per shard, the seq of the window's latest reset there: states and deletes up to it are void
        self._floor = [-1] * shards
        self.loading = True  # while replaying: the dict only; the sorted list is built once at the end

    def _floor_of(self, member: str) -> int:
        return self._floor[shard_index(member, self._shards)]

    def _key(self, member: str, score: float, tie: int, seq: int) -> bytes:
        body = memory_body(self._mode, self._desc, member, tie)
        return sortable_score(score, self._desc) + body + _U64.pack(seq)

    def _member(self, key: bytes) -> str:
        return memory_member_id(self._mode, self._desc, key[SCORE_BYTES:-9])

    @staticmethod
    def _seq(key: bytes) -> int:
        seq: int = _U64.unpack_from(key, len(key) - 8)[0]
        return seq

    def items(self) -> dict[str, tuple[float, int, int]]:
        """member -> (score, tie ms, seq): the whole window, for inspection and tests."""
        out = {}
        for member, key in self._keys.items():
            _, tie = memory_member(self._mode, self._desc, key[SCORE_BYTES:-9])
            out[member] = (unsortable_score(key, self._desc), tie, self._seq(key))
        return out

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, member: object) -> bool:
        return member in self._keys

    def member_seq(self, member: str) -> int:
        """The seq of the member's state or delete held here; -1 if neither."""
        key = self._keys.get(member)
        return self._seq(key) if key is not None else self._tombs.get(member, -1)

    def put(self, member: str, score: float, tie: int, seq: int) -> bool:
        """Set a member's state unless a newer one is known; True if applied."""
        if seq <= self._floor_of(member):
            return False
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
        if seq <= self._floor_of(member):
            return False
        old = self._keys.get(member)
        if (self._seq(old) if old is not None else self._tombs.get(member, -1)) > seq:
            return False
        if old is not None:
            del self._keys[member]
            if not self.loading:
                self._list.remove(old)
        self._tombs[member] = seq
        return True

    def forget(self, member: str) -> bool:
        """Drop whatever is known of the member (its state, or its delete); True if anything."""
        old = self._keys.pop(member, None)
        if old is not None and not self.loading:
            self._list.remove(old)
        return self._tombs.pop(member, None) is not None or old is not None

    def reset(self, seq: int, shard: int = 0) -> bool:
        """The window was emptied at `seq` (`rankstream reset`; a sharded board: that shard, at
        its seq): what is known up to it goes, and states or deletes up to it that arrive later
        are refused; newer ones (a replay meets records in any order) stay. True if it changed
        anything."""
        if seq <= self._floor[shard]:
            return False
        self._floor[shard] = seq

        def void(member: str, at: int) -> bool:
            return at <= seq and (self._shards == 1 or shard_index(member, self._shards) == shard)

        gone = [member for member, key in self._keys.items() if void(member, self._seq(key))]
        for member in gone:
            del self._keys[member]
        self._tombs = {member: at for member, at in self._tombs.items() if not void(member, at)}
        if gone and not self.loading:
            self._list = SortedList(self._keys.values())  # rare: one sort beats many removals
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
        return [(self._member(k), unsortable_score(k, self._desc)) for k in keys]

    def locate(self, member: str, reverse: bool) -> tuple[float, int, int] | None:
        """(score, position, members strictly better) in the view, or None."""
        key = self._keys.get(member)
        if key is None:
            return None
        position = self._list.index(key)
        score = unsortable_score(key, self._desc)
        better, _ = self.better_and_equal(score, reverse)
        return score, (len(self._list) - 1 - position if reverse else position), better

    def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int]:
        prefix = sortable_score(score, self._desc)
        before = self._list.bisect_left(prefix)
        through = self._list.bisect_left(next_prefix(prefix))
        equal = through - before
        return (len(self._list) - through, equal) if reverse else (before, equal)

    def count_between(self, low: float, high: float) -> int:
        if low > high:
            return 0
        a, b = sortable_score(low, self._desc), sortable_score(high, self._desc)
        first, last = (b, a) if self._desc else (a, b)
        return int(self._list.bisect_left(next_prefix(last)) - self._list.bisect_left(first))
