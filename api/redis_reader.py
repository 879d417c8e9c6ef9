"""BoardReader over Redis: common/store/reads.py answers each read in one round trip; a sharded
board's reads merge its shards (common/store/shardreads.py)."""

from __future__ import annotations

from api.params import Target
from common.boards import Order
from common.store import reads
from common.store.encoding import tie_mode, window_packing
from common.store.keys import BoardKeys
from common.store.pipe import Pipe
from common.store.shardreads import ShardedWindow
from common.store.shards import shard_names


class RedisBoardReader:
    """Stateless but for its keys: the API keeps one per window instance (api/routes.py)."""

    source = "redis"

    def __init__(self, client: Pipe, keys: BoardKeys, where: Target) -> None:
        self._client = client
        self._ref = ref = window_ref(keys, where)
        self._top_keys, self._locate_keys = ref.key_list(reads.TOP_KEYS), ref.key_list(reads.LOCATE_KEYS)

    async def page(self, start: int, stop: int, reverse: bool) -> reads.Page:
        return await reads.top(self._client, self._ref, start, stop, reverse, keys=self._top_keys)

    async def locate(self, members: list[str], reverse: bool, better: bool = True) -> reads.Lookup:
        return await reads.locate(
            self._client, self._ref, members, reverse, keys=self._locate_keys, better=better
        )

    async def around(self, member: str, n: int, reverse: bool, better: bool = True) -> reads.Around:
        return await reads.around(
            self._client, self._ref, member, n, reverse, keys=self._locate_keys, better=better
        )

    async def count_between(self, low: str, high: str) -> reads.Counted:
        return await reads.count_between(self._client, self._ref, low, high)

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        return await reads.better_and_equal(self._client, self._ref, score, reverse)


def window_ref(keys: BoardKeys, where: Target) -> reads.WindowRef:
    board_type = where.board_type
    packing = window_packing(board_type, board_type.window(where.window), where.period_start_ms)
    desc = board_type.order is Order.DESC
    return reads.WindowRef(keys, where.instance, desc, tie_mode(board_type), packing)


class ShardedBoardReader:
    """A sharded board's window: each read merged from its shards."""

    source = "redis"

    def __init__(self, client: Pipe, prefix: str, where: Target) -> None:
        self._client = client
        names = shard_names(where.board, where.board_type.shards)
        self._window = ShardedWindow([window_ref(BoardKeys(prefix, name), where) for name in names])

    async def page(self, start: int, stop: int, reverse: bool) -> reads.Page:
        return await self._window.page(self._client, start, stop, reverse)

    async def locate(self, members: list[str], reverse: bool, better: bool = True) -> reads.Lookup:
        return await self._window.locate(self._client, members, reverse, better)

    async def around(self, member: str, n: int, reverse: bool, better: bool = True) -> reads.Around:
        return await self._window.around(self._client, member, n, reverse, better)

    async def count_between(self, low: str, high: str) -> reads.Counted:
        return await self._window.count_between(self._client, low, high)

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        return await self._window.better_and_equal(self._client, score, reverse)
