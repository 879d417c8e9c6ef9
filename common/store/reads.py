"""The API's reads of one board window instance in Redis, typed: top.lua (a page), locate.lua
(members' score, position and strictly-better count) and the score-range counts. Their result
types are what every reader answers (api/reader.py: memory answers the same).

Positions are 0-based in the *view*: the board's order, or its exact reverse (`reverse`). A
window's order is its rank zset then its overflow zset (max_members)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from common.store.encoding import (
    MemberState,
    Packing,
    TieMode,
    format_score,
    packed_bound,
    parse_state,
    tie_prefix_length,
)
from common.store.keys import BoardKeys
from common.store.pipe import Pipe
from common.store.scripts import load_script
from common.store.topology import Store

# where each field goes (the scripts read the positions from the tables of the same names)
TOP_KEYS, TOP_ARGS = ("RANK", "OVERFLOW", "META", "SEQ"), ("START", "STOP", "DESC", "REVERSE", "PLEN", "RAW")
LOCATE_KEYS = ("RANK", "OVERFLOW", "STATE", "INDEX", "META", "SEQ")
LOCATE_ARGS = ("DESC", "REVERSE", "MODE", "BITS", "BASE", "AROUND", "PLEN", "BETTER")  # then the members
PER_MEMBER = ("STATE", "POSITION", "BETTER", "META")  # locate.lua's reply per member, after total, seq
_STATE, _POSITION, _BETTER, _META = (PER_MEMBER.index(n) for n in ("STATE", "POSITION", "BETTER", "META"))


# Named tuples, not frozen dataclasses: a page builds one per row, and a frozen dataclass costs
# about 0.5 us more to construct (measured: a 10-row page parsed in 7.4 us, most of it here).
class Entry(NamedTuple):
    member: str
    score: float
    meta: bytes | None = None


class Page(NamedTuple):
    total: int
    seq: int
    entries: list[Entry]


class Located(NamedTuple):
    entry: Entry
    position: int  # 0-based, in the view
    better: int  # members strictly better in the view


class Lookup(NamedTuple):
    total: int
    seq: int
    found: list[Located | None]  # in the order asked; None: not on the board


class Around(NamedTuple):
    """A member and the rows around it, read at once (one seq)."""

    found: Located | None  # None: not on the board (and the page is empty)
    page: Page
    start: int  # the page's first position in the view
    ahead: int  # members strictly better than the page's first row (shared ranks start there)


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
    def prefix_length(self) -> int:
        """Bytes of tie prefix before a member id in the zsets (a packed window has none)."""
        return 0 if self.packing is not None else tie_prefix_length(self.mode)

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


def top_args(ref: WindowRef, start: int, stop: int, reverse: bool, raw: bool = False) -> list[str | int]:
    """top.lua's arguments; `raw`: its members keep their tie prefix (common/store/shardreads.py)."""
    values: dict[str, str | int] = {
        "START": start,
        "STOP": stop,
        "DESC": _flag(ref.desc),
        "REVERSE": _flag(reverse),
        "PLEN": ref.prefix_length,
        "RAW": _flag(raw),
    }
    return [values[name] for name in TOP_ARGS]


async def top(
    client: Pipe, ref: WindowRef, start: int, stop: int, reverse: bool, *, keys: list[str] | None = None
) -> Page:
    """The view's positions [start, stop); `keys`: ref.key_list(TOP_KEYS), if the caller keeps it."""
    keys = ref.key_list(TOP_KEYS) if keys is None else keys
    reply = await TOP.run_pipe(client, keys, top_args(ref, start, stop, reverse))
    return _page(ref, reply)


def top_sync(client: Store, ref: WindowRef, start: int, stop: int) -> Page:
    """The board's order, positions [start, stop), from a synchronous client (the worker's)."""
    return _page(ref, TOP.run(client, ref.key_list(TOP_KEYS), top_args(ref, start, stop, False)))


def _page(ref: WindowRef, reply: list[Any]) -> Page:
    return Page(reply[0], reply[1], _rows(ref, reply, 2))


def _rows(ref: WindowRef, reply: list[Any], at: int) -> list[Entry]:
    """The rows of a page as page.lua appends them, its row count at reply[at]."""
    n = reply[at]
    score = float if ref.packing is None else ref.packing.score_of
    members, scores = reply[at + 1 : at + 1 + 2 * n : 2], reply[at + 2 : at + 2 + 2 * n : 2]
    metas = reply[at + 1 + 2 * n : at + 1 + 3 * n]
    new = tuple.__new__  # Entry's own __new__ is a Python lambda around it: a frame per row
    return [
        new(Entry, (member.decode(), score(value), meta or None))
        for member, value, meta in zip(members, scores, metas, strict=True)
    ]


def locate_args(ref: WindowRef, reverse: bool, around: int, better: bool) -> list[str | int]:
    packing = ref.packing
    values: dict[str, str | int] = {
        "DESC": _flag(ref.desc),
        "REVERSE": _flag(reverse),
        "MODE": ref.mode.value,
        "BITS": -1 if packing is None else packing.bits,
        "BASE": 0 if packing is None else packing.base_ms,
        "AROUND": around,
        "PLEN": ref.prefix_length,
        "BETTER": _flag(better),
    }
    return [values[name] for name in LOCATE_ARGS]


def _located(reply: list[Any], members: Sequence[str]) -> list[Located | None]:
    return [None if got is None else got[0] for got in located_states(reply, members)]


def located_states(reply: list[Any], members: Sequence[str]) -> list[tuple[Located, MemberState] | None]:
    """locate.lua's members, each with its state (its tie: common/store/shardreads.py needs it)."""
    found: list[tuple[Located, MemberState] | None] = []
    for i, member in enumerate(members):
        at = 2 + len(PER_MEMBER) * i
        state = parse_state(reply[at + _STATE])
        if state is None:
            found.append(None)
            continue
        entry = Entry(member, state.score, reply[at + _META] or None)
        found.append((Located(entry, int(reply[at + _POSITION]), int(reply[at + _BETTER])), state))
    return found


async def locate(
    client: Pipe,
    ref: WindowRef,
    members: Sequence[str],
    reverse: bool,
    *,
    keys: list[str] | None = None,
    better: bool = True,
) -> Lookup:
    """`keys`: ref.key_list(LOCATE_KEYS), if the caller keeps it; better=False: no strictly-better
    counts (Located.better -1: ordinal ranks need none; two ZCOUNTs a member saved)."""
    keys = ref.key_list(LOCATE_KEYS) if keys is None else keys
    reply = await LOCATE.run_pipe(client, keys, [*locate_args(ref, reverse, -1, better), *members])
    return Lookup(int(reply[0]), int(reply[1]), _located(reply, members))


async def around(
    client: Pipe,
    ref: WindowRef,
    member: str,
    n: int,
    reverse: bool,
    *,
    keys: list[str] | None = None,
    better: bool = True,
) -> Around:
    """`member` and the n rows above and below it, in one call; `keys`, `better` as for locate
    (without better, Around.ahead is 0)."""
    keys = ref.key_list(LOCATE_KEYS) if keys is None else keys
    reply = await LOCATE.run_pipe(client, keys, [*locate_args(ref, reverse, n, better), member])
    page = Page(int(reply[0]), int(reply[1]), _rows(ref, reply, 2 + len(PER_MEMBER)))
    found = _located(reply, [member])[0]
    return Around(found, page, 0 if found is None else around_start(found.position, n), int(reply[-1]))


def around_start(position: int, n: int) -> int:
    """The first position of the page of n rows above and below `position` (locate.lua's too):
    clamped at the top; the page itself is cut at the bottom."""
    return max(position - n, 0)


def _zcount_bounds(ref: WindowRef, low: str, high: str) -> tuple[str, str]:
    """ZCOUNT bounds on scores, as the window's zsets hold them (packed, or the scores themselves)."""
    if ref.packing is None:
        return low, high
    return packed_bound(ref.packing, low, True), packed_bound(ref.packing, high, False)


async def count_between(client: Pipe, ref: WindowRef, low: str, high: str) -> Counted:
    """(members with low <= score <= high, seq); bounds in Redis syntax (`-inf`, `(5`, `10`)."""
    low, high = _zcount_bounds(ref, low, high)
    # one write: the pipe sends what one turn queues together
    replies = [
        client.send("ZCOUNT", ref.rank_key, low, high),
        client.send("ZCOUNT", ref.overflow_key, low, high),
        client.send("GET", ref.keys.seq),
    ]
    ranked, overflow, seq = await asyncio.gather(*replies)  # every reply retrieved, errors too
    return Counted(int(ranked) + int(overflow), int(seq or 0))


def better_bounds(ref: WindowRef, score: float, reverse: bool) -> tuple[str, str]:
    """ZCOUNT bounds of the members strictly better than `score` in the view."""
    value = format_score(score)
    if ref.desc != reverse:
        return _zcount_bounds(ref, f"({value}", "+inf")
    return _zcount_bounds(ref, "-inf", f"({value}")


async def better_and_equal(client: Pipe, ref: WindowRef, score: float, reverse: bool) -> tuple[int, int, int]:
    """(members strictly better than `score` in the view, members equal to it, seq)."""
    value = format_score(score)
    better = better_bounds(ref, score, reverse)
    equal = _zcount_bounds(ref, value, value)
    replies = [client.send("ZCOUNT", key, *bounds) for key in (ref.rank_key, ref.overflow_key)
               for bounds in (better, equal)]  # fmt: skip
    replies.append(client.send("GET", ref.keys.seq))
    b1, e1, b2, e2, seq = await asyncio.gather(*replies)
    return int(b1) + int(b2), int(e1) + int(e2), int(seq or 0)
