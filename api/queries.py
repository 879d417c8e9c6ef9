"""The answers of docs/contract.md §6, built from a BoardReader (Redis or memory) with the rank
rules of common/ranking.py, so every route and every source ranks the same way."""

from __future__ import annotations

from typing import Any

from api.errors import ApiError
from api.params import Target
from api.reader import BoardReader, Located, Page
from common.ranking import Ties, item, items, json_score, member_rank, page_ranks, rank_of_score


def _shared(target: Target) -> bool:
    """Whether ranks need strictly-better counts (shared ties), which Redis then counts."""
    return target.ties is Ties.SHARED


def located_item(found: Located, target: Target) -> dict[str, Any]:
    return item(member_rank(found.position, found.better, target.ties), found.entry)


async def ranked_page(reader: BoardReader, target: Target, offset: int, limit: int) -> tuple[Page, list[int]]:
    page = await reader.page(offset, offset + limit, target.reverse)
    scores = [e.score for e in page.entries]
    first_better = 0
    if page.entries and target.ties is Ties.SHARED:  # ordinal ranks are positions
        first_better, _, _ = await reader.better_and_equal(scores[0], target.reverse)
    return page, page_ranks(offset, scores, first_better, target.ties)


def top_answer(target: Target, page: Page, ranks: list[int], source: str) -> dict[str, Any]:
    return {
        **target.describe(),
        "total": page.total,
        "items": items(ranks, page.entries),
        "source": source,
        "seq": page.seq,
    }


async def me_item(reader: BoardReader, target: Target, member: str) -> dict[str, Any] | None:
    found = (await reader.locate([member], target.reverse, _shared(target))).found[0]
    return None if found is None else located_item(found, target)


async def member_answer(reader: BoardReader, target: Target, member: str) -> dict[str, Any]:
    lookup = await reader.locate([member], target.reverse, _shared(target))
    found = lookup.found[0]
    if found is None:
        raise ApiError(404, "member_not_found", f"{member!r} is not on this board")
    return {**target.describe(), **located_item(found, target), "source": reader.source, "seq": lookup.seq}


async def around_answer(reader: BoardReader, target: Target, member: str, n: int) -> dict[str, Any]:
    got = await reader.around(member, n, target.reverse, _shared(target))  # one read: one seq
    if got.found is None:
        raise ApiError(404, "member_not_found", f"{member!r} is not on this board")
    ranks = page_ranks(got.start, [e.score for e in got.page.entries], got.ahead, target.ties)
    return top_answer(target, got.page, ranks, reader.source)


async def lookup_answer(reader: BoardReader, target: Target, members: list[str]) -> dict[str, Any]:
    lookup = await reader.locate(members, target.reverse, _shared(target))
    items = [
        {"rank": None, "member": member, "score": None} if found is None else located_item(found, target)
        for member, found in zip(members, lookup.found, strict=True)
    ]
    return {
        **target.describe(),
        "total": lookup.total,
        "items": items,
        "source": reader.source,
        "seq": lookup.seq,
    }


async def count_answer(reader: BoardReader, target: Target, low: float, high: float) -> dict[str, Any]:
    counted = await reader.count_between(_bound(low), _bound(high))
    return {
        **target.describe(),
        "min": _json_bound(low),
        "max": _json_bound(high),
        "count": counted.count,
        "source": reader.source,
        "seq": counted.seq,
    }


async def rank_answer(reader: BoardReader, target: Target, score: float) -> dict[str, Any]:
    better, equal, seq = await reader.better_and_equal(score, target.reverse)
    rank = rank_of_score(better, equal, target.board_type.tie_break, target.ties)
    return {
        **target.describe(),
        "score": json_score(score),
        "rank": rank,
        "source": reader.source,
        "seq": seq,
    }


def _bound(value: float) -> str:
    if value == float("inf"):
        return "+inf"
    if value == float("-inf"):
        return "-inf"
    return repr(value) if not value.is_integer() else str(int(value))


def _json_bound(value: float) -> float | int | str:
    return _bound(value) if value in (float("inf"), float("-inf")) else json_score(value)


async def with_trend(previous: BoardReader | None, target: Target, body: dict[str, Any]) -> dict[str, Any]:
    """`body` (a top, around, lookup or member answer) with `prev_rank` on each item, on `me` and
    on a member answer itself: the member's rank in the previous period of the window (`previous`
    reads it; None: no previous period is kept), null where it was absent."""
    items: list[dict[str, Any]] = list(body.get("items", ()))
    me = body.get("me")
    named = [*items, *([me] if me else []), *([] if "items" in body else [body])]
    members = list(dict.fromkeys(entry["member"] for entry in named))
    ranks: dict[str, int | None] = dict.fromkeys(members)
    if previous is not None and members:
        found = (await previous.locate(members, target.reverse, _shared(target))).found
        for name, hit in zip(members, found, strict=True):
            ranks[name] = None if hit is None else member_rank(hit.position, hit.better, target.ties)
    out = dict(body)
    if "items" in body:
        out["items"] = [{**entry, "prev_rank": ranks[entry["member"]]} for entry in items]
    else:
        out["prev_rank"] = ranks[body["member"]]
    if me:
        out["me"] = {**me, "prev_rank": ranks[me["member"]]}
    return out
