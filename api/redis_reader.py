"""BoardReader over Redis: top.lua and locate.lua answer in one round trip each."""

from __future__ import annotations

import redis.asyncio as aioredis

from api.reader import Counted, Entry, Located, Lookup, Page
from common.boards import BoardType, Order
from common.keys import BoardKeys
from common.ranking import TIE_WIDTH, TieMode, format_score, tie_mode
from common.scripts import load_script


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class RedisBoardReader:
    source = "redis"

    def __init__(self, client: aioredis.Redis, keys: BoardKeys, board_type: BoardType, instance: str) -> None:
        self._client = client
        self._keys = keys
        self._instance = instance
        self._desc = "1" if board_type.order is Order.DESC else "0"
        self._mode = tie_mode(board_type)

    async def page(self, start: int, stop: int, reverse: bool) -> Page:
        keys = self._keys
        reply = await load_script("top").run_async(
            self._client,
            [keys.rank(self._instance), keys.overflow(self._instance), keys.meta, keys.seq],
            [
                start,
                stop,
                self._desc,
                "1" if reverse else "0",
                0 if self._mode is TieMode.NONE else TIE_WIDTH,
            ],
        )
        total, seq, n = int(reply[0]), int(reply[1]), int(reply[2])
        metas = reply[3 + 2 * n :]
        entries = [
            Entry(_text(reply[3 + 2 * i]), float(reply[4 + 2 * i]), metas[i] or None) for i in range(n)
        ]
        return Page(total, seq, entries)

    async def locate(self, members: list[str], reverse: bool) -> Lookup:
        keys = self._keys
        reply = await load_script("locate").run_async(
            self._client,
            [
                keys.rank(self._instance),
                keys.overflow(self._instance),
                keys.state(self._instance),
                keys.meta,
                keys.seq,
            ],
            [self._desc, "1" if reverse else "0", self._mode.value, *members],
        )
        found: list[Located | None] = []
        for i, member in enumerate(members):
            state, position, better, meta = reply[2 + 4 * i : 6 + 4 * i]
            if not state:
                found.append(None)
                continue
            score = float(_text(state).split("|", 1)[0])
            found.append(Located(Entry(member, score, meta or None), int(position), int(better)))
        return Lookup(int(reply[0]), int(reply[1]), found)

    async def count_between(self, low: str, high: str) -> Counted:
        pipe = self._client.pipeline(transaction=False)
        pipe.zcount(self._keys.rank(self._instance), low, high)
        pipe.zcount(self._keys.overflow(self._instance), low, high)
        pipe.get(self._keys.seq)
        ranked, overflow, seq = await pipe.execute()
        return Counted(int(ranked) + int(overflow), int(seq or 0))

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        text = format_score(score)
        high_first = (self._desc == "1") != reverse
        better = (f"({text}", "+inf") if high_first else ("-inf", f"({text}")
        pipe = self._client.pipeline(transaction=False)
        for key in (self._keys.rank(self._instance), self._keys.overflow(self._instance)):
            pipe.zcount(key, *better)
            pipe.zcount(key, text, text)
        pipe.get(self._keys.seq)
        b1, e1, b2, e2, seq = await pipe.execute()
        return int(b1) + int(b2), int(e1) + int(e2), int(seq or 0)
