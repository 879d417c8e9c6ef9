"""A sharded board's reads (common/store/shards.py): every answer merged from its K shards,
exactly what the one board would answer.

Within a window, Redis orders members by (zset score, zset member bytes): the zset score is the
score (or a packed window's score and tie), the zset member starts with the tie prefix. So the
K shards' rows merge by the same pair, and a member's position is the sum over the shards of
the members before it there (ahead.lua finds that in a shard that does not hold it). Each read
costs one round trip per step, all shards at once:

- a page: each shard's first rows, merged. A deep page (K * offset > SHALLOW_ROWS) first narrows,
  per shard, where its part of the page starts: each round reads one row in the middle of each
  shard's candidate range and counts its place in the others (ahead.lua), which halves every
  range; then it reads the narrowed ranges and merges them.
- a member's rank: its own shard's answer (locate.lua), then its place in the others.
- around a member: its state from its shard, then each shard's rows around its place.
- counts: summed.

A read is not atomic across shards: each shard is read as it is at that moment (one board is
too, between the reads of one request). Sequence numbers are the sum of the shards'."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple

from common.store import reads
from common.store.encoding import MemberState, encode_member, format_score, pack
from common.store.pipe import Pipe
from common.store.reads import Around, Counted, Entry, Located, Lookup, Page, WindowRef
from common.store.scripts import load_script
from common.store.shards import shard_index
from common.store.topology import Store

AHEAD_KEYS = ("RANK", "OVERFLOW", "META", "SEQ")
AHEAD_ARGS = ("DESC", "REVERSE", "SCORE", "MEMBER", "LO", "HI", "AROUND", "PLEN")
_AHEAD = load_script("ahead", (("K", AHEAD_KEYS), ("A", AHEAD_ARGS)))
# a page whose rows lie within this many positions of each shard's top is read in one round trip
SHALLOW_ROWS = 1_000
MAX_ROUNDS = 64  # a narrowing halves every range per round: 64 rounds cover any zset


# A shard's row as the merge needs it: (zset score, zset member with its tie prefix, the score as
# Redis wrote it, meta). Plain tuples: they merge by their first two items in C, and only the
# rows a page keeps become Entries.
Row = tuple[float, bytes, bytes, bytes | None]


class _Place(NamedTuple):
    total: int
    seq: int
    ahead: int  # the shard's members before the member in the view
    better: int  # those strictly better (-1: not counted)
    rows: list[Row]


def _rows(reply: list[Any], at: int) -> list[Row]:
    """The rows top.lua (raw 1) or ahead.lua appended at reply[at]."""
    n = int(reply[at])
    members, scores = reply[at + 1 : at + 1 + 2 * n : 2], reply[at + 2 : at + 2 + 2 * n : 2]
    metas = reply[at + 1 + 2 * n : at + 1 + 3 * n]
    return [(float(v), m, v, meta or None) for m, v, meta in zip(members, scores, metas, strict=True)]


def entry(ref: WindowRef, row: Row) -> Entry:
    """A row as reads answer it (its member id, its score)."""
    score = row[0] if ref.packing is None else ref.packing.score_of(row[2])
    return Entry(row[1][ref.prefix_length :].decode(), score, row[3])


def merge(lists: Sequence[list[Row]], high_first: bool) -> list[Row]:
    """Rows of several shards, each list in view order (highest first or lowest), in view order."""
    return list(heapq.merge(*lists, reverse=high_first))


def _before(a: tuple[float, bytes], b: tuple[float, bytes], high_first: bool) -> bool:
    """Whether zset entry `a` comes before `b` in the view."""
    return a > b if high_first else a < b


def _high_first(ref: WindowRef, reverse: bool) -> bool:
    return ref.desc != reverse


def top_rows(client: Store, ref: WindowRef, start: int, stop: int) -> tuple[int, int, list[Row]]:
    """(total, seq, rows at positions [start, stop) in the board's order) of one shard, from a
    synchronous client (the worker's: a period's result, common/results.py)."""
    args = reads.top_args(ref, start, stop, False, raw=True)
    reply = reads.TOP.run(client, ref.key_list(reads.TOP_KEYS), args)
    return int(reply[0]), int(reply[1]), _rows(reply, 2)


async def _tops(
    client: Pipe, refs: Sequence[WindowRef], ranges: Sequence[tuple[int, int]], reverse: bool
) -> list[tuple[int, int, list[Row]]]:
    """(total, seq, rows at view positions [start, stop)) of each shard, all in one write."""
    calls = [
        (ref.key_list(reads.TOP_KEYS), reads.top_args(ref, start, stop, reverse, raw=True))
        for ref, (start, stop) in zip(refs, ranges, strict=True)
    ]
    replies = await reads.TOP.run_pipe_many(client, calls)
    return [(int(reply[0]), int(reply[1]), _rows(reply, 2)) for reply in replies]


def _zset_entry(ref: WindowRef, member: str, state: MemberState) -> tuple[str, bytes]:
    """A member's zset score (as text) and zset member, from its state."""
    if ref.packing is not None:
        return format_score(pack(ref.packing, state.score, state.tie_ms)), member.encode()
    return format_score(state.score), encode_member(ref.mode, state.tie_ms, member).encode()


def _place_call(
    ref: WindowRef, zset_entry: tuple[str, bytes], reverse: bool, bounds: tuple[str, str] | None, around: int
) -> tuple[list[str], list[str | int | bytes]]:
    """ahead.lua's keys and arguments: where (score_text, zmember) stands in one shard; `around`
    >= 0: with the rows around it."""
    score_text, zmember = zset_entry
    lo, hi = bounds if bounds is not None else ("", "")
    values: dict[str, str | int | bytes] = {
        "DESC": "1" if ref.desc else "0",
        "REVERSE": "1" if reverse else "0",
        "SCORE": score_text,
        "MEMBER": zmember,
        "LO": lo,
        "HI": hi,
        "AROUND": around,
        "PLEN": ref.prefix_length,
    }
    return ref.key_list(AHEAD_KEYS), [values[n] for n in AHEAD_ARGS]


async def _places(client: Pipe, calls: Sequence[tuple[list[str], list[str | int | bytes]]]) -> list[_Place]:
    """ahead.lua's answers to `calls`, all sent in one write."""
    replies = await _AHEAD.run_pipe_many(client, calls)
    out = []
    for (_, args), reply in zip(calls, replies, strict=True):
        rows = _rows(reply, 4) if int(args[AHEAD_ARGS.index("AROUND")]) >= 0 else []
        out.append(_Place(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), rows))
    return out


class ShardedWindow:
    """One window instance of a sharded board: a WindowRef per shard, shard 0 first."""

    def __init__(self, refs: Sequence[WindowRef]) -> None:
        self.refs = tuple(refs)

    def _home(self, member: str) -> int:
        return shard_index(member, len(self.refs))

    async def page(self, client: Pipe, start: int, stop: int, reverse: bool) -> Page:
        """The view's positions [start, stop)."""
        refs, span = self.refs, max(stop - start, 0)
        # c[s], the shard's members before the page's first row, lies in [lo[s], hi[s]]
        lo, hi = [0] * len(refs), [start] * len(refs)
        if len(refs) * start > SHALLOW_ROWS:
            heads = await _tops(client, refs, [(0, 0)] * len(refs), reverse)
            sizes = [total for total, _, _ in heads]
            everyone = sum(sizes)
            hi = [min(n, start) for n in sizes]
            lo = [min(max(0, start - (everyone - n)), h) for n, h in zip(sizes, hi, strict=True)]
            for _ in range(MAX_ROUNDS):
                if sum(h - low for low, h in zip(lo, hi, strict=True)) <= SHALLOW_ROWS:
                    break
                await self._narrow(client, start, reverse, lo, hi)
        got = await _tops(client, refs, [(lo[s], hi[s] + span) for s in range(len(refs))], reverse)
        merged = merge([rows for _, _, rows in got], _high_first(refs[0], reverse))
        first = start - sum(lo)
        entries = [entry(refs[0], row) for row in merged[first : first + span]]
        return Page(sum(t for t, _, _ in got), sum(q for _, q, _ in got), entries)

    async def _narrow(self, client: Pipe, start: int, reverse: bool, lo: list[int], hi: list[int]) -> None:
        """One round: each shard's middle candidate, placed in every other shard, halves every
        range [lo, hi] of where the shard's part of the page starts."""
        refs = self.refs
        middles = {s: (lo[s] + hi[s]) // 2 for s in range(len(refs)) if hi[s] > lo[s]}
        pivots = await _tops(
            client, [refs[s] for s in middles], [(m, m + 1) for m in middles.values()], reverse
        )
        rows = {s: got[2][0] for s, got in zip(middles, pivots, strict=True) if got[2]}
        asks = [(s, t) for s in rows for t in range(len(refs)) if t != s]
        places = await _places(
            client,
            [_place_call(refs[t], (rows[s][2].decode(), rows[s][1]), reverse, None, -1) for s, t in asks],
        )
        found: dict[int, dict[int, int]] = {s: {} for s in rows}
        for (s, t), place in zip(asks, places, strict=True):
            found[s][t] = place.ahead
        for s, aheads in found.items():
            m = middles[s]
            position = m + sum(aheads.values())
            if position < start:  # the pivot is before the page: so is all before it
                lo[s] = max(lo[s], m + 1)
                for t, ahead in aheads.items():
                    lo[t] = max(lo[t], ahead)
            elif position > start:  # after it: so is all after it
                hi[s] = min(hi[s], m)
                for t, ahead in aheads.items():
                    hi[t] = min(hi[t], ahead)
            else:  # the page's first row
                lo[s] = hi[s] = m
                for t, ahead in aheads.items():
                    lo[t] = hi[t] = ahead
        for s in range(len(refs)):  # a write between rounds may cross them: keep them ranges
            hi[s] = max(hi[s], lo[s])

    async def locate(
        self, client: Pipe, members: Sequence[str], reverse: bool, better: bool = True
    ) -> Lookup:
        refs = self.refs
        asked: list[list[str]] = [[] for _ in refs]
        for member in dict.fromkeys(members):
            asked[self._home(member)].append(member)
        shards = [s for s in range(len(refs)) if asked[s]]
        calls = [
            (
                refs[s].key_list(reads.LOCATE_KEYS),
                [*reads.locate_args(refs[s], reverse, -1, better), *asked[s]],
            )
            for s in shards
        ]
        replies = await reads.LOCATE.run_pipe_many(client, calls)
        counts = {s: (int(reply[0]), int(reply[1])) for s, reply in zip(shards, replies, strict=True)}
        homes: dict[str, tuple[int, Located, MemberState]] = {}
        for s, reply in zip(shards, replies, strict=True):
            for member, got in zip(asked[s], reads.located_states(reply, asked[s]), strict=True):
                if got is not None:
                    homes[member] = (s, *got)
        asks = [(member, t) for member, (s, _, _) in homes.items() for t in range(len(refs)) if t != s]
        places = await _places(client, [self._member_call(homes[m], t, reverse, better) for m, t in asks])
        placed = {m: [f.position, f.better] for m, (_, f, _) in homes.items()}
        for (member, t), place in zip(asks, places, strict=True):
            counts.setdefault(t, (place.total, place.seq))
            placed[member][0] += place.ahead
            if better:
                placed[member][1] += place.better
        rest = [s for s in range(len(refs)) if s not in counts]  # no member of theirs, none found
        if rest:
            heads = await _tops(client, [refs[s] for s in rest], [(0, 0)] * len(rest), reverse)
            counts.update({s: (total, seq) for s, (total, seq, _) in zip(rest, heads, strict=True)})
        found: list[Located | None] = []
        for member in members:
            home = homes.get(member)
            if home is None:
                found.append(None)
                continue
            position, ahead = placed[member]
            found.append(Located(home[1].entry, position, ahead if better else -1))
        return Lookup(sum(t for t, _ in counts.values()), sum(q for _, q in counts.values()), found)

    def _member_call(
        self,
        home: tuple[int, Located, MemberState],
        shard: int,
        reverse: bool,
        better: bool,
        around: int = -1,
    ) -> tuple[list[str], list[str | int | bytes]]:
        """ahead.lua's call for a member (its shard, location and state) in `shard`."""
        s, found, state = home
        zset_entry = _zset_entry(self.refs[s], found.entry.member, state)
        ref = self.refs[shard]
        bounds = reads.better_bounds(ref, state.score, reverse) if better else None
        return _place_call(ref, zset_entry, reverse, bounds, around)

    async def around(self, client: Pipe, member: str, n: int, reverse: bool, better: bool = True) -> Around:
        refs, s = self.refs, self._home(member)
        ref = refs[s]
        reply = await reads.LOCATE.run_pipe(
            client, ref.key_list(reads.LOCATE_KEYS), [*reads.locate_args(ref, reverse, -1, better), member]
        )
        got = reads.located_states(reply, [member])[0]
        if got is None:
            heads = await _tops(client, refs, [(0, 0)] * len(refs), reverse)
            empty = Page(sum(t for t, _, _ in heads), sum(q for _, q, _ in heads), [])
            return Around(None, empty, 0, 0)
        home = (s, *got)
        places = await _places(
            client, [self._member_call(home, t, reverse, better, n) for t in range(len(refs))]
        )
        position = sum(place.ahead for place in places)  # its own shard's: its place there
        merged = merge([place.rows for place in places], _high_first(ref, reverse))
        score_text, zmember = _zset_entry(ref, member, got[1])
        key = (float(score_text), zmember)
        # its place among the rows: the rows before it (it is there unless a write moved it since)
        at = sum(1 for row in merged if _before((row[0], row[1]), key, _high_first(ref, reverse)))
        start = reads.around_start(position, n)
        rows = merged[at - (position - start) : at + n + 1]
        total, seq = sum(p.total for p in places), sum(p.seq for p in places)
        strictly = sum(p.better for p in places) if better else -1
        located = Located(got[0].entry, position, strictly)
        ahead = 0
        if better and rows:
            ahead = strictly
            if start != position:  # the page's first row is above it: its own count
                counts = await asyncio.gather(
                    *(reads.better_and_equal(client, r, entry(ref, rows[0]).score, reverse) for r in refs)
                )
                ahead = sum(b for b, _, _ in counts)
        return Around(located, Page(total, seq, [entry(ref, row) for row in rows]), start, ahead)

    async def count_between(self, client: Pipe, low: str, high: str) -> Counted:
        counts = await asyncio.gather(*(reads.count_between(client, ref, low, high) for ref in self.refs))
        return Counted(sum(c.count for c in counts), sum(c.seq for c in counts))

    async def better_and_equal(self, client: Pipe, score: float, reverse: bool) -> tuple[int, int, int]:
        counts = await asyncio.gather(
            *(reads.better_and_equal(client, ref, score, reverse) for ref in self.refs)
        )
        return sum(b for b, _, _ in counts), sum(e for _, e, _ in counts), sum(q for _, _, q in counts)
