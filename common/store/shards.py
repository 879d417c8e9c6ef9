"""Sharded boards (`shards: K`, docs/boards.md): where each member of a board lives.

A board of a type with K > 1 shards is K boards in Redis, each under its own hash tag, so its
writes and reads spread over K Cluster slots. Shard i's name is `<board>#<K>.<i>.<salt>`: `#`
never occurs in a board id (common/boards.py), so the board is everything before it. The salt is
the smallest number that puts shard i's slot in the middle half of the i-th K-th of the 16,384
slots: a cluster whose masters own equal runs of slots, as `redis-cli --cluster create` and
rebalance leave them, holds the K shards of every board on as many masters as it can. A name
depends only on (board, K, i), so every process finds the same keys without asking Redis.

A member's shard is a stable hash of its id (CRC-32 mod K): every event of a member, and so every
redelivery and every id the id window remembers of it, reaches the same shard."""

from __future__ import annotations

import zlib
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

SHARD_MARK = "#"
MAX_SHARDS = 64
_SLOTS = REDIS_CLUSTER_HASH_SLOTS


def shard_index(member: str, shards: int) -> int:
    """The shard of `member` on a board of `shards` shards."""
    return 0 if shards == 1 else shard_index_of(member.encode(), shards)


def shard_index_of(member: bytes, shards: int) -> int:
    """The shard of a member given as UTF-8."""
    return 0 if shards == 1 else zlib.crc32(member) % shards


@lru_cache(maxsize=65_536)
def shard_names(board: str, shards: int) -> tuple[str, ...]:
    """The names of a board's shards in Redis, shard 0 first; (board,) when it has one."""
    if shards == 1:
        return (board,)
    names = []
    width = _SLOTS / shards
    for i in range(shards):
        low, high = i * width + width / 4, (i + 1) * width - width / 4
        salt = 0
        while True:
            name = f"{board}{SHARD_MARK}{shards}.{i}.{salt}"
            if low <= key_slot(name.encode()) < high:
                break
            salt += 1
        names.append(name)
    return tuple(names)


def shard_of(board: str, shards: int, member: str) -> str:
    """The name in Redis of the shard holding `member`."""
    return shard_names(board, shards)[shard_index(member, shards)]


def index_of(name: str) -> int:
    """The shard number of a name in Redis (0: a board's own name)."""
    _, mark, rest = name.partition(SHARD_MARK)
    return int(rest.split(".")[1]) if mark else 0


def count_of(name: str) -> int:
    """The shard count a name in Redis was made for (1: a board's own name)."""
    _, mark, rest = name.partition(SHARD_MARK)
    return int(rest.split(".")[0]) if mark else 1


def board_of(name: str) -> str:
    """The board a name in Redis belongs to: itself, or the board of a shard."""
    return name.partition(SHARD_MARK)[0]


def is_shard(name: str) -> bool:
    return SHARD_MARK in name
