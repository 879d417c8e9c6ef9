"""The members' meta of one hot board in memory: the newest record's, in whatever order they come.

A member's meta is the board's (one per member, not per window), and every update_cache record
of the member carries it as Redis held it after the record's seq. Records of different window
instances arrive out of seq order (one batch publishes a member's day:A and day:B records in
whichever order the member first touched them; a replay meets compacted records by offset), so
memory keeps the seq each meta came with and only a newer record replaces it.

Each value is one bytes object: the seq (8 bytes, big-endian) then the meta JSON; members
without meta take no room. A record without meta newer than the kept one drops it (a delete op or
an erase dropped it in Redis); an older record with meta cannot bring it back then, because the
window the newer record went to holds the member's state or delete at that newer seq.

Known limit: a reset removes that evidence. If resets of `total` and of the window instance a
member's newer records went to void them, and the member's meta is forgotten with its windows, an
older record of another, un-reset instance arriving after them (a backfill's, labelled with the
seq it started at) brings back the older meta. The cure is a record of its own for a member's
meta on update_cache (keyed per member, compacted, with its seq), not tied to window records.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

_SEQ = struct.Struct(">Q")
_HEAD = _SEQ.size


class HotMeta:
    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, bytes] = {}

    def get(self, member: str) -> bytes | None:
        held = self._held.get(member)
        return None if held is None else held[_HEAD:]

    def __contains__(self, member: object) -> bool:
        return member in self._held

    def take(
        self, member: str, seq: int, meta: bytes | None, newer_elsewhere: Callable[[str, int], bool]
    ) -> None:
        """A record of `member` at `seq` carrying `meta` was applied to one of its windows.

        `newer_elsewhere(member, seq)` says whether a window holds a newer state or delete of the
        member: asked only when memory keeps no meta for it, it stops an older record re-adding
        meta a newer one lacked."""
        held = self._held.get(member)
        if held is not None:
            if _SEQ.unpack_from(held)[0] > seq:
                return  # a newer record's meta is known
        elif not meta or newer_elsewhere(member, seq):
            return
        if meta:
            self._held[member] = _SEQ.pack(seq) + meta
        else:
            del self._held[member]

    def keep_only(self, present: Callable[[str], bool]) -> None:
        """Forget the members no window holds any more (after a reset): reads never show them,
        and one that comes back brings its meta along in its state record."""
        self._held = {m: held for m, held in self._held.items() if present(m)}

    def __len__(self) -> int:
        return len(self._held)

    def items(self) -> Iterator[tuple[str, bytes]]:
        """(member, meta JSON) of every member that has meta."""
        return ((member, held[_HEAD:]) for member, held in self._held.items())
