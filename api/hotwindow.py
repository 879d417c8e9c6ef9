"""One hot board window instance in memory, ordered exactly as Redis orders it.

Each member is one `bytes` key in a SortedList (sortedcontainers: O(log n) add/remove/index,
O(log n + k) slices) and the same object in a dict member (UTF-8) -> key:

    sortable(score) | encoded member | terminator | seq

The first three parts are common/store/encoding.py's memory order (Redis' order, proved by
tests/integration/test_store_order.py); the trailing seq never decides order.

While a node replays (`loading`), a window keeps each member's latest state as the record's
own bytes (a format-2 state, common/cache_records.py), and builds every key and the sorted list
once at the end: a replay then costs a dict lookup per record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from sortedcontainers import SortedList

from common.cache_records import STATE_V2, V2_SCORE, V2_SEQ, V2_STATE, V2_TIE
from common.store.encoding import (
    SCORE_BYTES,
    TieMode,
    memory_key_maker,
    memory_member,
    memory_member_id,
    next_prefix,
    sortable_score,
    unsortable_score,
)
from common.store.shards import shard_index_of

_U64 = struct.Struct(">Q")


class HotWindow:
    """Members of one window instance, in the board's order (best first)."""

    __slots__ = ("_desc", "_floor", "_floored", "_keys", "_list", "_make", "_mode", "_shards", "_tombs",
                 "loading")  # fmt: skip

    def __init__(self, desc: bool, mode: TieMode, shards: int = 1) -> None:
        self._desc = desc
        self._mode = mode
        self._make = memory_key_maker(mode, desc, score_at=V2_SCORE, tie_at=V2_TIE, seq_at=V2_SEQ)
        self._shards = shards  # a sharded board: each shard's seqs count apart (common/store/shards.py)
        # member (UTF-8) -> key; while loading, member -> its latest state as a format-2 state
        self._keys: dict[bytes, bytes] = {}
        self._list: SortedList = SortedList()
        self._tombs: dict[bytes, int] = {}  # deleted member -> seq of the delete (rejects older states)
        # per shard, the seq of the window's latest reset there: states and deletes up to it are void
        self._floor = [-1] * shards
        self._floored = False  # whether any reset is known (replay's bulk skips the check until then)
        self.loading = True  # while replaying: states staged; keys and the sorted list built at the end

    def _floor_of(self, member: bytes) -> int:
        return self._floor[shard_index_of(member, self._shards)]

    def _member(self, key: bytes) -> str:
        return memory_member_id(self._mode, self._desc, key[SCORE_BYTES:-9])

    @staticmethod
    def _seq(key: bytes) -> int:
        seq: int = _U64.unpack_from(key, len(key) - 8)[0]
        return seq

    def _held_seq(self, member: bytes) -> int:
        """The seq of the member's state or delete held here; -1 if neither."""
        held = self._keys.get(member)
        if held is None:
            return self._tombs.get(member, -1)
        if self.loading:
            seq: int = _U64.unpack_from(held, V2_SEQ.start)[0]
            # a state a reset voided is dropped at the end of loading (`reset`)
            return seq if not self._floored or seq > self._floor_of(member) else self._tombs.get(member, -1)
        return self._seq(held)

    def items(self) -> dict[str, tuple[float, int, int]]:
        """member -> (score, tie ms, seq): the whole window, for inspection and tests."""
        out = {}
        if self.loading:
            for member, state in self._keys.items():
                _, seq, score, tie = V2_STATE.unpack(state)
                if self._held_seq(member) == seq:  # not voided by a reset
                    out[member.decode()] = (score, tie if self._mode is not TieMode.NONE else 0, seq)
            return out
        for member, key in self._keys.items():
            _, tie = memory_member(self._mode, self._desc, key[SCORE_BYTES:-9])
            out[member.decode()] = (unsortable_score(key, self._desc), tie, self._seq(key))
        return out

    def __len__(self) -> int:
        """Members held (while loading: and states a reset voided, until the end of loading)."""
        return len(self._keys)

    def __contains__(self, member: object) -> bool:
        if not isinstance(member, str):
            return False
        encoded = member.encode()
        return encoded in self._keys and (not self.loading or self._held_seq(encoded) >= 0)

    def tie_of(self, member: str) -> int | None:
        """The member's tie (a league division's: its seat order); None if absent or loading."""
        key = self._keys.get(member.encode())
        if key is None or self.loading:
            return None
        return memory_member(self._mode, self._desc, key[SCORE_BYTES:-9])[1]

    def member_seq(self, member: str) -> int:
        """The seq of the member's state or delete held here; -1 if neither."""
        return self._held_seq(member.encode())

    def stage(self, member: bytes, state: bytes) -> bool:
        """While loading: a member's state as a format-2 state record's value (replay's bulk);
        True if applied (no newer state, delete or reset of the member is known)."""
        seq = state[V2_SEQ]
        old = self._keys.get(member)
        if old is not None:
            if old[V2_SEQ] > seq:  # big-endian: byte order is number order
                return False
        elif self._tombs and self._tombs.get(member, -1) > _U64.unpack(seq)[0]:
            return False
        if self._floored and _U64.unpack(seq)[0] <= self._floor_of(member):
            return False
        self._keys[member] = state
        if old is None and self._tombs:
            self._tombs.pop(member, None)
        return True

    def put(self, member: str, score: float, tie: int, seq: int) -> bool:
        """Set a member's state unless a newer one is known; True if applied."""
        encoded = member.encode()
        state = V2_STATE.pack(STATE_V2, seq, score + 0.0, tie)
        if self.loading:
            return self.stage(encoded, state)
        if seq <= self._floor_of(encoded) or self._held_seq(encoded) > seq:
            return False
        old = self._keys.get(encoded)
        key = self._make(state, encoded)
        if old is not None:
            self._list.remove(old)
        self._list.add(key)
        self._keys[encoded] = key
        self._tombs.pop(encoded, None)
        return True

    def delete(self, member: str, seq: int) -> bool:
        encoded = member.encode()
        if seq <= self._floor_of(encoded) or self._held_seq(encoded) > seq:
            return False
        old = self._keys.pop(encoded, None)
        if old is not None and not self.loading:
            self._list.remove(old)
        self._tombs[encoded] = seq
        return True

    def forget(self, member: str) -> bool:
        """Drop whatever is known of the member (its state, or its delete); True if anything."""
        encoded = member.encode()
        old = self._keys.pop(encoded, None)
        if old is not None and not self.loading:
            self._list.remove(old)
        return self._tombs.pop(encoded, None) is not None or old is not None

    def reset(self, seq: int, shard: int = 0) -> bool:
        """The window was emptied at `seq` (`rankstream reset`; a sharded board: that shard, at
        its seq): what is known up to it goes, and states or deletes up to it that arrive later
        are refused; newer ones (a replay meets records in any order) stay. True if it changed
        anything."""
        if seq <= self._floor[shard]:
            return False
        self._floor[shard] = seq
        self._floored = True

        def void(member: bytes, at: int) -> bool:
            return at <= seq and (self._shards == 1 or shard_index_of(member, self._shards) == shard)

        self._tombs = {member: at for member, at in self._tombs.items() if not void(member, at)}
        if self.loading:  # the states it voids are dropped at the end, in the pass that builds keys
            return True
        gone = [member for member, key in self._keys.items() if void(member, self._seq(key))]
        for member in gone:
            del self._keys[member]
        if gone:
            self._list = SortedList(self._keys.values())  # rare: one sort beats many removals
        return True

    def finish_loading(self) -> None:
        """Build every key and the sorted list once (one sort beats a million inserts; a backfill
        publishes in rank order, which the sort finds already in runs)."""
        if not self.loading:
            return
        make, keys = self._make, self._keys
        if self._floored:  # states a reset voided while loading
            if self._shards == 1:
                floor = _U64.pack(self._floor[0])
                void = [member for member, state in keys.items() if state[V2_SEQ] <= floor]
            else:
                void = [member for member in keys if self._held_seq(member) < 0]
            for member in void:
                del keys[member]
        for member, state in keys.items():  # in place: each key takes the place of its state
            keys[member] = make(state, member)
        self._list = SortedList(keys.values())
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
        key = self._keys.get(member.encode())
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
