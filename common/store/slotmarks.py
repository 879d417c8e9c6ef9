"""Slot marks: how a worker on a Redis Cluster tells a board lost with its shard from a new one.

A board's keys all live in one slot. When a shard loses its data (a master restarted empty before
its replica took over, a failover to an empty replica) while the group's records
(`{sources:…}`) live on another shard, its boards' fences are simply gone, and a board without
a fence looks new: the worker would start it over from the events still to come, silently. So
a deployment on a cluster keeps a mark in every one of the 16,384 slots (96 B each: 1.5 MB),
written once, when its workers first find none (the sources hash then records `slots`); a mark
lives and moves with its slot. apply.lua, meeting a board without a fence, checks its slot's
mark: none means the slot lost its data, and the board's partitions stop (board_epoch_mismatch)
instead of counting from zero. `rankstream accept-redis` writes the missing marks again."""

from __future__ import annotations

from functools import cache

from redis.crc import key_slot

from common.store.keys import BoardKeys, slot_mark
from common.store.topology import Store

SLOTS = 16_384
_PIPE = 2_000


@cache
def _tags() -> tuple[str, ...]:
    """A hash tag per slot (`s<n>`, the first n whose tag hashes there): ~0.1 s, once."""
    table: list[str | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        slot = key_slot(f"s{n}".encode())
        if table[slot] is None:
            table[slot] = f"s{n}"
            left -= 1
        n += 1
    return tuple(t or "" for t in table)


def mark_of(keys: BoardKeys) -> str:
    """The mark of the slot the board's keys live in."""
    return slot_mark(keys.prefix, _tags()[key_slot(keys.seq.encode())])


def write_marks(client: Store, prefix: str) -> int:
    """Mark every slot that has no mark yet; how many were written."""
    written = 0
    tags = _tags()
    for start in range(0, SLOTS, _PIPE):
        pipe = client.pipeline(transaction=False)
        for tag in tags[start : start + _PIPE]:
            pipe.set(slot_mark(prefix, tag), "1", nx=True)
        written += sum(1 for done in pipe.execute() if done)
    return written
