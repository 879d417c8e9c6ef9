"""BoardReader over a hot board in memory: the same answers as Redis, no Redis call."""

from __future__ import annotations

from api.hotboards import HotBoard
from api.hotwindow import HotWindow
from api.reader import Around, Counted, Entry, Located, Lookup, Page
from common.store.reads import around_start

_EMPTY_CACHE: dict[tuple[bool, object], HotWindow] = {}


def _bound(text: str) -> float:
    return float(text.replace("+inf", "inf"))


class MemoryBoardReader:
    source = "memory"

    def __init__(self, hot: HotBoard, instance: str) -> None:
        self._hot = hot
        found = hot.instances.get(instance)
        if found is None:  # a period nobody scored in yet: an empty window, not an error
            found = _EMPTY_CACHE.get((hot.desc, hot.mode))
            if found is None:
                found = HotWindow(hot.desc, hot.mode)
                found.finish_loading()
                _EMPTY_CACHE[(hot.desc, hot.mode)] = found
        self._window = found

    async def page(self, start: int, stop: int, reverse: bool) -> Page:
        meta = self._hot.meta
        entries = [Entry(m, s, meta.get(m)) for m, s in self._window.page(start, stop, reverse)]
        return Page(len(self._window), self._hot.seq, entries)

    async def locate(self, members: list[str], reverse: bool, better: bool = True) -> Lookup:
        found: list[Located | None] = []  # memory counts `better` anyway: O(log n)
        for member in members:
            hit = self._window.locate(member, reverse)
            if hit is None:
                found.append(None)
            else:
                score, position, ahead = hit
                found.append(Located(Entry(member, score, self._hot.meta.get(member)), position, ahead))
        return Lookup(len(self._window), self._hot.seq, found)

    async def around(self, member: str, n: int, reverse: bool, better: bool = True) -> Around:
        found = (await self.locate([member], reverse)).found[0]
        if found is None:
            return Around(None, Page(len(self._window), self._hot.seq, []), 0, 0)
        start = around_start(found.position, n)
        page = await self.page(start, found.position + n + 1, reverse)
        if start == found.position:
            return Around(found, page, start, found.better)
        ahead, _ = self._window.better_and_equal(page.entries[0].score, reverse)
        return Around(found, page, start, ahead)

    async def count_between(self, low: str, high: str) -> Counted:
        return Counted(self._window.count_between(_bound(low), _bound(high)), self._hot.seq)

    async def better_and_equal(self, score: float, reverse: bool) -> tuple[int, int, int]:
        better, equal = self._window.better_and_equal(score, reverse)
        return better, equal, self._hot.seq
