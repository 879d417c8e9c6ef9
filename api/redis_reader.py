"""BoardReader over Redis: common/store/reads.py answers each read in one round trip."""

from __future__ import annotations

from api.params import Target
from common.boards import Order
from common.store import reads
from common.store.encoding import tie_mode, window_packing
from common.store.keys import BoardKeys
from common.store.pipe import Pipe


class RedisBoardReader:
    """Stateless but for its keys: the API keeps one per window instance (api/routes.py)."""

    source = "redis"

    def __init__(self, client: Pipe, keys: BoardKeys, where: Target) -> None:
        self._client = client
        board_type = where.board_type
        packing = window_packing(board_type, board_type.window(where.window), where.period_start_ms)
        desc = board_type.order is Order.DESC
        self._ref = ref = reads.WindowRef(keys, where.instance, desc, tie_mode(board_type), packing)
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
