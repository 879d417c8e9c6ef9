"""Leaderboard reads straight from Redis, using the same keys and ranking rules as the worker."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis

from common.boards import BoardType, Order
from common.keys import BoardKeys
from common.ranking import decode_member, tie_mode


@dataclass(frozen=True, slots=True)
class Item:
    rank: int
    member: str
    score: float
    meta: object | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"rank": self.rank, "member": self.member, "score": _num(self.score)}
        if self.meta is not None:
            out["meta"] = self.meta
        return out


def _num(score: float) -> float | int:
    return int(score) if score.is_integer() and abs(score) <= 2**53 else score


@dataclass(frozen=True, slots=True)
class TopPage:
    total: int
    seq: int
    items: list[Item]


async def read_top(
    client: aioredis.Redis,
    *,
    keys: BoardKeys,
    board_type: BoardType,
    instance: str,
    offset: int,
    limit: int,
) -> TopPage:
    rank_key = keys.rank(instance)
    desc = board_type.order is Order.DESC
    pipe = client.pipeline(transaction=False)
    if desc:
        pipe.zrevrange(rank_key, offset, offset + limit - 1, withscores=True)
    else:
        pipe.zrange(rank_key, offset, offset + limit - 1, withscores=True)
    pipe.zcard(rank_key)
    pipe.zcard(keys.overflow(instance))
    pipe.get(keys.seq)
    rows, card, overflow, seq = await pipe.execute()
    mode = tie_mode(board_type)
    members = [decode_member(mode, raw.decode()) for raw, _ in rows]
    metas = await client.hmget(keys.meta, members) if members else []
    items = [
        Item(offset + i + 1, member, float(score), orjson.loads(meta) if meta else None)
        for i, ((_, score), member, meta) in enumerate(zip(rows, members, metas, strict=True))
    ]
    return TopPage(total=int(card) + int(overflow), seq=int(seq or 0), items=items)
