"""The API's reads of one board window instance in Redis, typed: top.lua (a page), locate.lua
(members' score, position and strictly-better count) and the score-range counts. Their result
types are what every reader answers (api/reader.py: memory answers the same).

Positions are 0-based in the *view*: the board's order, or its exact reverse (`reverse`). A
window's order is its rank zset then its overflow zset (max_members)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from common.store.encoding import (
    Packing,
    TieMode,
    format_score,
    packed_bound,
    parse_state,
    text,
    tie_prefix_length,
)
from common.store.keys import BoardKeys
from common.store.scripts import load_script

# where each field goes (the scripts read the positions from the tables of the same names)
TOP_KEYS, TOP_ARGS = ("RANK", "OVERFLOW", "META", "SEQ"), ("START", "STOP", "DESC", "REVERSE", "PLEN")
LOCATE_KEYS = ("RANK", "OVERFLOW", "STATE", "INDEX", "META", "SEQ")
LOCATE_ARGS = ("DESC", "REVERSE", "MODE", "BITS", "BASE")  # then the members
PER_MEMBER = ("STATE", "POSITION", "BETTER", "META")  # locate.lua's reply per member, after total, seq
_STATE, _POSITION, _BETTER, _META = (PER_MEMBER.index(n) for n in ("STATE", "POSITION", "BETTER", "META"))


@dataclass(frozen=True, slots=True)
class Entry:
    member: str
    score: float
    meta: bytes | None = None


@dataclass(frozen=True, slots=True)
class Page:
    total: int
    seq: int
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Located:
    entry: Entry
    position: int  # 0-based, in the view
    better: int  # members strictly better in the view


@dataclass(frozen=True, slots=True)
class Lookup:
    total: int
    seq: int
    found: list[Located | None]  # in the order asked; None: not on the board


@dataclass(frozen=True, slots=True)
class Counted:
    count: int
    seq: int


@dataclass(frozen=True, slots=True)
class WindowRef:
    """One window instance of one board, and how the board orders it."""

    keys: BoardKeys
    instance: str
    desc: bool
    mode: TieMode
    packing: Packing | None = None  # a packed window (common/store/packing.py)

    @property
    def rank_key(self) -> str:
        return self.keys.rank(self.instance, self.packing is not None)

    @property
    def overflow_key(self) -> str:
        return self.keys.overflow(self.instance, self.packing is not None)

    def _key(self, name: str) -> str:
        keys = self.keys
        if name == "RANK":
            return self.rank_key
        if name == "OVERFLOW":
            return self.overflow_key
        if name == "STATE":
            return keys.state(self.instance)
        if name == "INDEX":
            return keys.tie_index(self.instance)
        return keys.meta if name == "META" else keys.seq

    def key_list(self, names: Sequence[str]) -> list[str]:
        return [self._key(name) for name in names]


def _flag(value: bool) -> str:
    return "1" if value else "0"


TOP = load_script("top", (("K", TOP_KEYS), ("A", TOP_ARGS)))
LOCATE = load_script("locate", (("K", LOCATE_KEYS), ("A", LOCATE_ARGS), ("M", PER_MEMBER)))


def _top_args(ref: WindowRef, start: int, stop: int, reverse: bool) -> list[str | int]:
    values: dict[str, str | int] = {
        "START": start,
        "STOP": stop,
        "DESC": _flag(ref.desc),
        "REVERSE": _flag(reverse),
        "PLEN": 0 if ref.packing is not None else tie_prefix_length(ref.mode),
    }
    return [values[name] for name in TOP_ARGS]


async def top(client: aioredis.Redis, ref: WindowRef, start: int, stop: int, reverse: bool) -> Page:
    """The view's positions [start, stop)."""
    reply = await TOP.run_async(client, ref.key_list(TOP_KEYS), _top_args(ref, start, stop, reverse))
    return _page(ref, reply)


def top_sync(client: redis.Redis, ref: WindowRef, start: int, stop: int) -> Page:
    """The board's order, positions [start, stop), from a synchronous client (the worker's)."""
    return _page(ref, TOP.run(client, ref.key_list(TOP_KEYS), _top_args(ref, start, stop, False)))


def _page(ref: WindowRef, reply: list[Any]) -> Page:
    total, seq, n = int(reply[0]), int(reply[1]), int(reply[2])
    metas = reply[3 + 2 * n :]
    score = float if ref.packing is None else ref.packing.score_of
    rows = [Entry(text(reply[3 + 2 * i]), score(reply[4 + 2 * i]), metas[i] or None) for i in range(n)]
    return Page(total, seq, rows)


async def locate(client: aioredis.Redis, ref: WindowRef, members: Sequence[str], reverse: bool) -> Lookup:
    packing = ref.packing
    values: dict[str, str | int] = {
        "DESC": _flag(ref.desc),
        "REVERSE": _flag(reverse),
        "MODE": ref.mode.value,
        "BITS": -1 if packing is None else packing.bits,
        "BASE": 0 if packing is None else packing.base_ms,
    }
    args = [values[name] for name in LOCATE_ARGS]
    reply = await LOCATE.run_async(client, ref.key_list(LOCATE_KEYS), [*args, *members])
    found: list[Located | None] = []
    for i, member in enumerate(members):
        at = 2 + len(PER_MEMBER) * i
        state = parse_state(reply[at + _STATE])
        if state is None:
            found.append(None)
            continue
        entry = Entry(member, state.score, reply[at + _META] or None)
        found.append(Located(entry, int(reply[at + _POSITION]), int(reply[at + _BETTER])))
    return Lookup(int(reply[0]), int(reply[1]), found)


def _zcount_bounds(ref: WindowRef, low: str, high: str) -> tuple[str, str]:
    """ZCOUNT bounds on scores, as the window's zsets hold them (packed, or the scores themselves)."""
    if ref.packing is None:
        return low, high
    return packed_bound(ref.packing, low, True), packed_bound(ref.packing, high, False)


async def count_between(client: aioredis.Redis, ref: WindowRef, low: str, high: str) -> Counted:
    """(members with low <= score <= high, seq); bounds in Redis syntax (`-inf`, `(5`, `10`)."""
    low, high = _zcount_bounds(ref, low, high)
    pipe = client.pipeline(transaction=False)
    pipe.zcount(ref.rank_key, low, high)
    pipe.zcount(ref.overflow_key, low, high)
    pipe.get(ref.keys.seq)
    ranked, overflow, seq = await pipe.execute()
    return Counted(int(ranked) + int(overflow), int(seq or 0))


async def better_and_equal(
    client: aioredis.Redis, ref: WindowRef, score: float, reverse: bool
) -> tuple[int, int, int]:
    """(members strictly better than `score` in the view, members equal to it, seq)."""
    value = format_score(score)
    high_first = ref.desc != reverse
    better = (
        _zcount_bounds(ref, f"({value}", "+inf") if high_first else _zcount_bounds(ref, "-inf", f"({value}")
    )
    equal = _zcount_bounds(ref, value, value)
    pipe = client.pipeline(transaction=False)
    for key in (ref.rank_key, ref.overflow_key):
        pipe.zcount(key, *better)
        pipe.zcount(key, *equal)
    pipe.get(ref.keys.seq)
    b1, e1, b2, e2, seq = await pipe.execute()
    return int(b1) + int(b2), int(e1) + int(e2), int(seq or 0)
