"""The update_cache wire format, written by the worker and replayed by API nodes.

Keys (compaction keeps the latest record of each):
- `<board>\\0<instance>\\0<member>`: the member's state in a window instance, or its absence;
- `<board>\\0<instance>\\0`: the instance's latest reset (`rankstream reset`);
- `<board>\\0\\0<member>`: the member's meta on the board (format 2);
- `<board>\\0\\0`: the whole board was emptied, every window and the meta (format 2);
- `<board>\\0<instance>\\0\\0<n>`: a backfill's n-th chunk of the instance (format 2);
- `<board>\\0`: the board's seq marker (every change up to it is on the topic).

Every record of a board goes to partition crc32(board) % partitions, so a node replays one
partition per hot board. A sharded board's records name the shard (`common/store/shards.py`).

A league's division (instance `season:<id>@<tier>.<n>`: common/league.py) is written in format 3
whatever the writer's format: format 2's layouts under a first byte `0x30 | kind`, so a node of a
release before leagues refuses it (UnknownFormatError: upgrade API nodes before workers) rather
than keep it as a period it does not know. Its tie is the member's seat order.

Values come in two formats; a node reads both, so old and new workers can write side by side
through a rolling upgrade (API nodes first: a node of the previous release cannot read format 2).
- Format 1: a fixed header (kind, score, tie ms, seq) and, for a state or an absence, the member's
  meta JSON as Redis held it after that seq. Every window record carries the meta.
- Format 2: one byte `0x20 | kind`, the seq, then for a state the score and tie ms (25 bytes in
  all). The meta travels in records of its own (kind META, the JSON after the seq; none = the
  member has no meta), published when an event changes it and whenever a touched member has
  one, so replay reads each member's meta once, and resets or a backfill can never bring back an
  older meta. A backfill publishes chunks: up to
  CHUNK_MEMBERS members' states and metas at its seq in one record, replayed in bulk; a chunk's
  member counts as a format-1 state (its meta, or none, at the chunk's seq).
States are absolute: replaying them is idempotent, and the higher seq wins whatever order they
arrive in, so a backfill and live updates can interleave safely. A reset says the instance (or,
with no instance, the whole board: every window and the meta) was empty at its seq: records at
or before it are void, whenever they arrive. A null value (a key's deletion, `rankstream
reshard-board`) voids what the key held.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from common.league import is_division

FORMATS = (1, 2)
FORMAT = 2  # what workers write unless RANKSTREAM_CACHE_RECORD_FORMAT says otherwise

_V1 = struct.Struct(">BdqQ")  # kind, score, tie ms, seq
_V2 = 0x20  # a format-2 value's first byte is 0x20 | kind (a format-1 value's is the kind)
_V3 = 0x30  # a league division's record: format 2's layout, first byte 0x30 | kind
_V2_STATE = struct.Struct(">BQdq")  # 0x20 | kind, seq, score, tie ms
_V2_SEQ = struct.Struct(">BQ")  # 0x20 | kind, seq (then a META record's meta JSON)


class Kind(IntEnum):
    STATE = 1
    DELETED = 2
    MARKER = 3  # the board's seq: every change up to it is on the topic
    RESET = 4  # the instance was emptied at this seq (its member is ""); no instance: the board
    # never a value: a key's deletion (a null value; `rankstream reshard-board` deletes the
    # records of a board's old shards): what that key held is void
    GONE = 5
    META = 6  # the member's meta on the board from this seq on (format 2; None: it has none)
    CHUNK = 7  # many members' states and metas at one seq: a backfill's (format 2)


STATE_V2 = _V2 | Kind.STATE  # the first byte of a format-2 state: replay's bulk (api/hotboards.py)
CHUNK_V2 = _V2 | Kind.CHUNK
CHUNK_V3 = _V3 | Kind.CHUNK  # a backfill's chunk of a league division
_CHUNK = struct.Struct(">BQII")  # 0x20 | CHUNK, seq, members, bytes of the members' ids
CHUNK_MEMBERS = 1000  # a chunk holds at most this many members
CHUNK_BYTES = 256 * 1024  # and is cut before it grows past this (well under Kafka's 1 MB)
V2_STATE = _V2_STATE  # a format-2 state's layout, which hot windows keep as is while loading
# its fields' bytes: the seq and the score big-endian, the tie ms' low 6 bytes (TIE_BYTES)
V2_SEQ, V2_SCORE, V2_TIE = slice(1, 9), slice(9, 17), slice(19, 25)


class UnknownFormatError(ValueError):
    """A record this release cannot read: written by a newer worker."""


@dataclass(frozen=True, slots=True)
class Record:
    kind: Kind
    board: str
    instance: str  # "" for a marker, a meta record and a whole board's reset
    member: str  # "" for a marker and a reset
    score: float
    tie_ms: int
    seq: int
    meta: bytes | None
    # the format it came in: a format-1 state or absence also says what the member's meta was
    version: int = 1


ChunkRow = tuple[str, float, int, bytes | None]  # member, score, tie ms, meta


def partition_for(board: str, partitions: int) -> int:
    return zlib.crc32(board.encode()) % partitions


def _key(board: str, instance: str, member: str) -> bytes:
    return f"{board}\0{instance}\0{member}".encode()


@dataclass(frozen=True, slots=True)
class RecordWriter:
    """Encodes records in one format (1 or 2): (key, value) pairs, or None where the format has
    no such record (format 1 carries meta inside window records)."""

    version: int = FORMAT

    def __post_init__(self) -> None:
        if self.version not in FORMATS:
            raise ValueError(f"update_cache record format must be one of {FORMATS}, not {self.version}")

    def state(
        self,
        board: str,
        instance: str,
        member: str,
        *,
        score: float,
        tie_ms: int,
        seq: int,
        meta: bytes | None,
    ) -> tuple[bytes, bytes]:
        key = _key(board, instance, member)
        if is_division(instance):
            return key, _V2_STATE.pack(_V3 | Kind.STATE, seq, score + 0.0, tie_ms)
        if self.version == 1:
            return key, _V1.pack(Kind.STATE, score, tie_ms, seq) + (meta or b"")
        return key, _V2_STATE.pack(STATE_V2, seq, score + 0.0, tie_ms)  # -0.0 is 0.0, as in Redis

    def deleted(
        self, board: str, instance: str, member: str, seq: int, meta: bytes | None = None
    ) -> tuple[bytes, bytes]:
        """The member is absent from the instance; in format 1 `meta` is its meta on the board all
        the same (a delete drops it; a member absent from one instance may keep it for others)."""
        key = _key(board, instance, member)
        if is_division(instance):
            return key, _V2_SEQ.pack(_V3 | Kind.DELETED, seq)
        if self.version == 1:
            return key, _V1.pack(Kind.DELETED, 0.0, 0, seq) + (meta or b"")
        return key, _V2_SEQ.pack(_V2 | Kind.DELETED, seq)

    def reset(self, board: str, instance: str, seq: int) -> tuple[bytes, bytes]:
        if is_division(instance):
            return _key(board, instance, ""), _V2_SEQ.pack(_V3 | Kind.RESET, seq)
        if self.version == 1:
            return _key(board, instance, ""), _V1.pack(Kind.RESET, 0.0, 0, seq)
        return _key(board, instance, ""), _V2_SEQ.pack(_V2 | Kind.RESET, seq)

    def marker(self, board: str, seq: int) -> tuple[bytes, bytes]:
        if self.version == 1:
            return f"{board}\0".encode(), _V1.pack(Kind.MARKER, 0.0, 0, seq)
        return f"{board}\0".encode(), _V2_SEQ.pack(_V2 | Kind.MARKER, seq)

    def meta(self, board: str, member: str, seq: int, meta: bytes | None) -> tuple[bytes, bytes] | None:
        """The member's meta from `seq` on (None: it has none)."""
        if self.version == 1:
            return None
        return _key(board, "", member), _V2_SEQ.pack(_V2 | Kind.META, seq) + (meta or b"")

    def chunk(
        self, board: str, instance: str, number: int, seq: int, rows: Sequence[ChunkRow]
    ) -> tuple[bytes, bytes] | None:
        """Members' states in an instance and their metas, all at `seq`, in one record: what a
        backfill publishes (None in format 1: one state record per member)."""
        if self.version == 1 or not rows:
            return None
        states = b"".join(_V2_STATE.pack(STATE_V2, seq, score + 0.0, tie) for _, score, tie, _ in rows)
        members = b"\0".join(member.encode() for member, _, _, _ in rows)
        metas = b"\0".join(meta or b"" for _, _, _, meta in rows)
        head = CHUNK_V3 if is_division(instance) else CHUNK_V2
        value = _CHUNK.pack(head, seq, len(rows), len(members)) + states + members + metas
        return f"{board}\0{instance}\0\0{number}".encode(), value

    def board_reset(self, board: str, seq: int) -> tuple[bytes, bytes] | None:
        """The whole board was emptied at `seq`: every window period (those no record named yet
        too) and every member's meta (a whole-board reset; a backfill's end)."""
        if self.version == 1:
            return None
        return _key(board, "", ""), _V2_SEQ.pack(_V2 | Kind.RESET, seq)


def deleted_key(key: bytes) -> Record | None:
    """A key's deletion (a record with a null value) as a record of kind GONE; None for a whole
    board's reset's key and a chunk's (nothing to void: their seqs are below every seq of the board's
    later layout, as a window reset's is, and a later backfill's chunks supersede them)."""
    parts = key.decode().split("\0")
    if len(parts) == 2:  # a marker's
        return Record(Kind.GONE, parts[0], "", "", 0.0, 0, 0, None, 2)
    if len(parts) == 4 or (not parts[1] and not parts[2]):
        return None
    return Record(Kind.GONE, parts[0], parts[1], parts[2], 0.0, 0, 0, None, 2)


def chunk_parts(value: bytes) -> tuple[int, list[bytes], list[bytes], list[bytes]]:
    """A chunk's seq, and per member its state (a format-2 state's bytes), id and meta (b"": none)."""
    _, seq, count, ids = _CHUNK.unpack_from(value)
    start = _CHUNK.size
    end = start + _V2_STATE.size * count
    states = [value[at : at + _V2_STATE.size] for at in range(start, end, _V2_STATE.size)]
    return seq, states, value[end : end + ids].split(b"\0"), value[end + ids :].split(b"\0")


def decode_chunk(key: bytes, value: bytes) -> list[Record]:
    """A chunk as one format-1 state record per member: a state, and the member's meta at its seq
    (none, too, is a claim: it drops an older meta memory holds)."""
    board, instance, _, _ = key.decode().split("\0")
    seq, states, members, metas = chunk_parts(value)
    out = []
    for state, member, meta in zip(states, members, metas, strict=True):
        _, _, score, tie = _V2_STATE.unpack(state)
        out.append(Record(Kind.STATE, board, instance, member.decode(), score, tie, seq, meta or None, 1))
    return out


def decode(key: bytes, value: bytes) -> Record:
    head = value[0]
    parts = key.decode().split("\0")
    if head & 0xF0 in (_V2, _V3):
        version = 3 if head & 0xF0 == _V3 else 2
        kind = head & 0x0F
        if kind == Kind.STATE:
            _, seq, score, tie = _V2_STATE.unpack_from(value)
            return Record(Kind.STATE, parts[0], parts[1], parts[2], score, tie, seq, None, version)
        seq = _V2_SEQ.unpack_from(value)[1]
        if kind == Kind.MARKER:
            return Record(Kind.MARKER, parts[0], "", "", 0.0, 0, seq, None, version)
        if kind in (Kind.DELETED, Kind.RESET):
            return Record(Kind(kind), parts[0], parts[1], parts[2], 0.0, 0, seq, None, version)
        if kind == Kind.META:
            meta = value[_V2_SEQ.size :] or None
            return Record(Kind.META, parts[0], "", parts[2], 0.0, 0, seq, meta, version)
    elif Kind.STATE <= head <= Kind.RESET:
        kind, score, tie, seq = _V1.unpack_from(value)
        if kind == Kind.MARKER:
            return Record(Kind.MARKER, parts[0], "", "", 0.0, 0, seq, None)
        return Record(Kind(kind), parts[0], parts[1], parts[2], score, tie, seq, value[_V1.size :] or None)
    raise UnknownFormatError(
        f"an update_cache record of a newer format (first byte {head:#04x}) than this node reads: "
        "upgrade API nodes before workers"
    )
