"""The update_cache wire format, written by the worker and replayed by API nodes.

Key: `<board>\\0<instance>\\0<member>` for a member's state, `<board>\\0<instance>\\0` for an
instance's latest reset (`rankstream reset`), `<board>\\0` for the board's seq marker, so
compaction keeps the latest record of each. Every record of a board goes to
partition crc32(board) % partitions, so a node replays one partition per hot board.
Value: a fixed header (kind, score, tie ms, seq) and, for a state or an absence, the member's
meta JSON (the board's, as Redis holds it after that seq).
States are absolute: replaying them is idempotent, and the higher seq wins whatever order
they arrive in, so a backfill and live updates can interleave safely. A reset says the instance
was empty at its seq: states and deletes at or before it are void, whenever they arrive.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

_HEADER = struct.Struct(">BdqQ")  # kind, score, tie ms, seq


class Kind(IntEnum):
    STATE = 1
    DELETED = 2
    MARKER = 3  # the board's seq: every change up to it is on the topic
    RESET = 4  # the instance was emptied at this seq (its member is "")
    # never a value: a key's deletion (a null value; `rankstream reshard-board` deletes the
    # records of a board's old shards): what that key held is void
    GONE = 5


@dataclass(frozen=True, slots=True)
class Record:
    kind: Kind
    board: str
    instance: str  # "" for a marker
    member: str  # "" for a marker and a reset
    score: float
    tie_ms: int
    seq: int
    meta: bytes | None


def partition_for(board: str, partitions: int) -> int:
    return zlib.crc32(board.encode()) % partitions


def state_record(
    board: str, instance: str, member: str, *, score: float, tie_ms: int, seq: int, meta: bytes | None
) -> tuple[bytes, bytes]:
    key = f"{board}\0{instance}\0{member}".encode()
    return key, _HEADER.pack(Kind.STATE, score, tie_ms, seq) + (meta or b"")


def deleted_record(
    board: str, instance: str, member: str, seq: int, meta: bytes | None = None
) -> tuple[bytes, bytes]:
    """The member is absent from the instance; `meta` is its meta on the board all the same (a
    delete drops it; a member absent from one instance may keep it for the others)."""
    key = f"{board}\0{instance}\0{member}".encode()
    return key, _HEADER.pack(Kind.DELETED, 0.0, 0, seq) + (meta or b"")


def reset_record(board: str, instance: str, seq: int) -> tuple[bytes, bytes]:
    return f"{board}\0{instance}\0".encode(), _HEADER.pack(Kind.RESET, 0.0, 0, seq)


def marker_record(board: str, seq: int) -> tuple[bytes, bytes]:
    return f"{board}\0".encode(), _HEADER.pack(Kind.MARKER, 0.0, 0, seq)


def deleted_key(key: bytes) -> Record:
    """A key's deletion (a record with a null value) as a record of kind GONE."""
    parts = key.decode().split("\0")
    instance, member = (parts[1], parts[2]) if len(parts) == 3 else ("", "")
    return Record(Kind.GONE, parts[0], instance, member, 0.0, 0, 0, None)


def decode(key: bytes, value: bytes) -> Record:
    kind, score, tie, seq = _HEADER.unpack_from(value)
    parts = key.decode().split("\0")
    if kind == Kind.MARKER:
        return Record(Kind.MARKER, parts[0], "", "", 0.0, 0, seq, None)
    meta = value[_HEADER.size :] or None
    return Record(Kind(kind), parts[0], parts[1], parts[2], score, tie, seq, meta)
