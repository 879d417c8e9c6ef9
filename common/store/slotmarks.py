"""Slot marks: how a worker on a Redis Cluster tells a board lost with its shard from a new one.

A board's keys all live in one slot. When a shard loses its data (a master restarted empty before
its replica took over, a failover to an empty replica) while the group's records
(`{sources:…}`) live on another shard, its boards' fences are simply gone, and a board without
a fence looks new: the worker would start it over from the events still to come, silently. So
a deployment on a cluster keeps a mark in every one of the 16,384 slots (96 B each: 1.5 MB),
written when its data set begins (worker/sources.py: the sources hash records `slots`, "0" while
they are written, "1" once done) or by `rankstream accept-redis`, never because a worker finds
them missing; a mark lives and moves with its slot. apply.lua, meeting a board without a fence,
checks its slot's mark: none means the slot lost its data, and the board's partitions stop
(board_epoch_mismatch) instead of counting from zero. `rankstream accept-redis` writes the missing
marks again."""

from __future__ import annotations

from redis.crc import key_slot

from common.store.keys import BoardKeys, slot_mark
from common.store.topology import SLOTS, Store, slot_tag

_PIPE = 2_000


def mark_of(keys: BoardKeys) -> str:
    """The mark of the slot the board's keys live in."""
    return slot_mark(keys.prefix, slot_tag(key_slot(keys.seq.encode())))


def write_marks(client: Store, prefix: str) -> int:
    """Mark every slot that has no mark yet; how many were written."""
    written = 0
    for start in range(0, SLOTS, _PIPE):
        pipe = client.pipeline(transaction=False)
        for slot in range(start, min(start + _PIPE, SLOTS)):
            pipe.set(slot_mark(prefix, slot_tag(slot)), "1", nx=True)
        written += sum(1 for done in pipe.execute() if done)
    return written
