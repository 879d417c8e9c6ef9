"""xhash.lua's bucketed layout (the id window's zsets, the tie indexes' hashes) in Python, for the
worker: which bucket holds a slot value (XH.bucket), and when and how a bucket that outgrew its cap
splits (XH.settle_at, xhash.lua's `split`), so that common/store/native.py writes a split as
native commands. The result is the scripts' own, byte for byte
(tests/integration/test_decided_writes.py splits with a cap of 4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from common.store.keys import string_slot

MAX_DEPTH = 20  # xhash.lua XH.MAX_DEPTH


def bytes_slot(fp: bytes) -> int:
    """XH.bytes_slot: an id fingerprint's slot value, its first three bytes."""
    return fp[0] + fp[1] * 256 + fp[2] * 65536


def entry_slot(entry: bytes) -> int:
    """XH.string_slot of a tie index field (a member id)."""
    return string_slot(entry.decode())


def bucket(directory: bytes, dir_key: str, value: int) -> tuple[str, int, int]:
    """XH.bucket: the key, depth and prefix of the bucket holding slot value `value`."""
    n = len(directory)
    if n == 0:
        return f"{dir_key}:0:0", 0, 0
    d = directory[value % n]
    p = value % (1 << d)
    return f"{dir_key}:{d}:{p}", d, p


def splits(d: int, cap: int, card: int, new: int) -> bool:
    """XH.settle_at's rule: a bucket of depth d holding `card` entries after `new` were added
    splits when it grew past a multiple of the cap (past the cap itself, or for a bucket a split
    could not separate, past the next multiple)."""
    return d < MAX_DEPTH and card > cap and (card - new - 1) // cap < (card - 1) // cap


class Bucket(NamedTuple):
    key: str
    depth: int
    prefix: int


@dataclass
class Split:
    """The buckets a split leaves (key -> its entries, in the order they are written) and the
    directory after it; `dropped` is the bucket that was split; `empty`, the buckets of the new
    directory it left without an entry (no key holds them)."""

    dropped: str
    buckets: dict[str, dict[bytes, bytes]]
    directory: bytes
    empty: tuple[str, ...] = ()


def split(
    dir_key: str,
    directory: bytes,
    at: Bucket,
    entries: dict[bytes, bytes],
    *,
    cap: int,
    slot: Callable[[bytes], int],
) -> Split | None:
    """xhash.lua `split` of bucket `at` (depth d) holding `entries`: by bit d of each entry's slot
    value, a half that still holds more than the cap split again; None when every entry has one
    slot value (no split can separate them: the bucket stays as it is)."""
    key, d, p = at
    values = {e: slot(e) for e in entries}
    if len(set(values.values())) <= 1:
        return None
    halves: tuple[dict[bytes, bytes], dict[bytes, bytes]] = ({}, {})
    for e, value in entries.items():
        halves[(values[e] >> d) & 1][e] = value
    table = bytearray(directory) if directory else bytearray(b"\x00")
    if 1 << d == len(table):  # the bucket is at the global depth: double the directory
        table = table + table
    for s in range(p, len(table), 1 << d):
        table[s] = d + 1
    out: dict[str, dict[bytes, bytes]] = {}
    empty: list[str] = []
    for half, part in enumerate(halves):
        hp = p + half * (1 << d)
        hkey = f"{dir_key}:{d + 1}:{hp}"
        if not part:
            empty.append(hkey)
            continue
        out[hkey] = part
        if len(part) > cap and d + 1 < MAX_DEPTH:
            deeper = split(dir_key, bytes(table), Bucket(hkey, d + 1, hp), part, cap=cap, slot=slot)
            if deeper is not None:
                del out[hkey]
                out.update(deeper.buckets)
                empty += deeper.empty
                table = bytearray(deeper.directory)
    return Split(key, out, bytes(table), tuple(empty))
