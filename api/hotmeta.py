"""The members' meta of one hot board in memory: the newest record's, in whatever order they come.

A member's meta is the board's (one per member, not per window). Records arrive out of seq order
(a replay meets compacted records by offset; a backfill's records interleave with live ones), so
memory keeps the seq each meta came with and only a newer record replaces it.

Each value is one bytes object: the seq (8 bytes, big-endian) then the meta JSON; members
without meta take no room.

Format 2 (common/cache_records.py) publishes a member's meta in a record of its own (`claim`):
the newest wins; a dropped meta is remembered with its seq, so an older record cannot bring it
back; a whole-board reset (`reset`) voids every meta up to its seq, whenever records arrive.

Format 1 carries the meta inside every window record (`take`): a record without meta newer than
the kept one drops it; an older record with meta cannot bring it back then, because the window
the newer record went to holds the member's state or delete at that newer seq. Known limit of
format 1 only: a reset removes that evidence (a later record of another, un-reset instance older
than the resets could bring back an older meta); format 2's own meta records close it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from common.store.shards import shard_index_of

_SEQ = struct.Struct(">Q")
_HEAD = _SEQ.size


class HotMeta:
    """Keyed by the member's UTF-8 bytes (what records carry); the methods take it as text."""

    __slots__ = ("_dropped", "_floor", "_shards", "held")

    def __init__(self, shards: int = 1) -> None:
        self.held: dict[bytes, bytes] = {}  # member -> seq + meta JSON (read it, never write it)
        self._dropped: dict[bytes, int] = {}  # member -> the seq its meta was dropped at
        self._shards = shards
        self._floor = [-1] * shards  # per shard: the seq of the whole board's latest reset

    def get(self, member: str) -> bytes | None:
        held = self.held.get(member.encode())
        return None if held is None else held[_HEAD:]

    def __contains__(self, member: object) -> bool:
        return isinstance(member, str) and member.encode() in self.held

    def _known(self, member: bytes) -> int | None:
        """The seq of what memory knows of the member's meta (held or dropped); None: nothing."""
        held = self.held.get(member)
        if held is not None:
            seq: int = _SEQ.unpack_from(held)[0]
            return seq
        return self._dropped.get(member)

    def _set(self, member: bytes, seq: int, meta: bytes | None) -> None:
        if meta:
            self.held[member] = _SEQ.pack(seq) + meta
            self._dropped.pop(member, None)
        else:
            self.held.pop(member, None)
            self._dropped[member] = seq

    def _void(self, member: bytes, seq: int) -> bool:
        """Whether a reset of the member's shard at or after `seq` voids a record at `seq`."""
        return seq <= self._floor[shard_index_of(member, self._shards)]

    def claim(self, member: str, seq: int, meta: bytes | None) -> bool:
        """A format-2 meta record: the member's meta from `seq` on (None: none). True if applied."""
        encoded = member.encode()
        known = self._known(encoded)
        if (known is not None and known > seq) or self._void(encoded, seq):
            return False
        self._set(encoded, seq, meta)
        return True

    def take(
        self, member: str, seq: int, meta: bytes | None, newer_elsewhere: Callable[[str, int], bool]
    ) -> None:
        """A format-1 record of `member` at `seq` carrying `meta` was applied to one of its windows.

        `newer_elsewhere(member, seq)` says whether a window holds a newer state or delete of the
        member: asked only when memory knows nothing of its meta, it stops an older record
        re-adding meta a newer one lacked."""
        encoded = member.encode()
        known = self._known(encoded)
        if known is not None:
            if known > seq:
                return  # a newer record's meta is known
        elif not meta or newer_elsewhere(member, seq):
            return
        if not self._void(encoded, seq):
            self._set(encoded, seq, meta)

    def reset(self, seq: int, shard: int = 0) -> bool:
        """The board's meta (a sharded board's: that shard's) was dropped at `seq`: what memory
        knows up to it goes, and records up to it that arrive later are void. True if it changed
        anything."""
        if seq <= self._floor[shard]:
            return False
        self._floor[shard] = seq

        def kept(member: bytes, at: int) -> bool:
            return at > seq or (self._shards > 1 and shard_index_of(member, self._shards) != shard)

        self.held = {m: held for m, held in self.held.items() if kept(m, _SEQ.unpack_from(held)[0])}
        self._dropped = {m: at for m, at in self._dropped.items() if kept(m, at)}
        return True

    def forget(self, member: str) -> bool:
        """Drop whatever is known of the member's meta (its record's key was deleted)."""
        encoded = member.encode()
        return self.held.pop(encoded, None) is not None or self._dropped.pop(encoded, None) is not None

    def keep_only(self, present: Callable[[str], bool]) -> None:
        """Forget the members no window holds any more (after a format-1 reset): reads never
        show them, and one that comes back brings its meta along in its state record."""
        self.held = {m: held for m, held in self.held.items() if present(m.decode())}

    def __len__(self) -> int:
        return len(self.held)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """(member, meta JSON) of every member that has meta."""
        return ((member.decode(), held[_HEAD:]) for member, held in self.held.items())
