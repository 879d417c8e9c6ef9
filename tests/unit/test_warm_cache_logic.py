"""api/warm.py's bookkeeping without Redis: answers kept only while the seq check keeps up, a
board's generation dropped only once nothing of it is kept or read, the byte bound counting
keys, an answer too big for the cache read but not kept, and a changed board's answers out of
memory at once (a soak found them held until the LRU reached them)."""

from __future__ import annotations

import asyncio
import math
import time

from api.warm import ANSWER_OVERHEAD, WarmCache


def loaded(cache: WarmCache, key: str, board: str, body: bytes = b"{}") -> None:
    async def read() -> tuple[bytes, int]:
        return body, 7

    asyncio.run(cache.load(key, board, 2**62, read, lambda seq: {}))


def test_nothing_is_served_once_the_seq_check_falls_behind():
    cache = WarmCache(1 << 20, lambda: 0)
    cache.live = True
    loaded(cache, "/top", "gift:a")
    assert cache.get("/top") is not None
    cache.checked_until = time.monotonic() - 0.001  # no successful check lately
    assert cache.get("/top") is None and cache.stamp("gift:a") is None
    cache.checked_until = math.inf
    assert cache.get("/top") is not None  # kept, served again once checked


def test_a_board_is_forgotten_only_when_nothing_of_it_is_kept():
    cache = WarmCache(3 * (ANSWER_OVERHEAD + 10), lambda: 0)
    cache.live = True
    loaded(cache, "/a1", "gift:a")
    loaded(cache, "/b1", "gift:b")
    cache.prune()
    assert cache.boards_held() == {"gift:a": 7, "gift:b": 7}
    for i in range(3):  # gift:c's answers push gift:a's and gift:b's out (least recently used)
        loaded(cache, f"/c{i}", "gift:c")
    cache.prune()
    assert set(cache.boards_held()) == {"gift:c"}
    assert cache.stamp("gift:a") == (cache.epoch, 0)


def test_an_answer_too_big_for_the_cache_is_read_but_not_kept():
    cache = WarmCache(ANSWER_OVERHEAD + 100, lambda: 0)
    cache.live = True
    loaded(cache, "/big", "gift:a", b"x" * 1000)
    assert cache.get("/big") is None and cache.size == 0


def test_a_changed_boards_answers_leave_memory_at_once():
    cache = WarmCache(1 << 20, lambda: 0)
    cache.live = True
    for i in range(5):
        loaded(cache, f"/a{i}", "gift:a")
        loaded(cache, f"/b{i}", "gift:b")
        loaded(cache, f"/c{i}", "gift:c")
    held = cache.size_bytes
    cache.changed("gift:a", 7, 8)  # a notice
    cache.moved("gift:b")  # the seq check
    assert cache.size == 5 and cache.size_bytes == held // 3
    assert all(cache.get(f"/c{i}") is not None for i in range(5))
    cache.drop("gift:c")  # served from memory from now on
    assert cache.size == 0 and cache.size_bytes == 0
    cache.prune()
    assert cache.boards_held() == {}
