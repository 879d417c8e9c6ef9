"""Ranking rules shared by every reader (Redis and memory): how positions become ranks.
How Redis and memory order members, and the exact range of scores: common/store/encoding.py."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import orjson

from common.boards import TieBreak
from common.store.reads import Entry


class Ties(StrEnum):
    """`ordinal`: ranks are unique (1, 2, 3, 4); `shared`: equal scores share one (1, 2, 2, 4)."""

    ORDINAL = "ordinal"
    SHARED = "shared"


def member_rank(position: int, better: int, ties: Ties) -> int:
    """1-based rank of a member at 0-based `position` with `better` members strictly ahead."""
    return position + 1 if ties is Ties.ORDINAL else better + 1


def page_ranks(offset: int, scores: list[float], first_better: int, ties: Ties) -> list[int]:
    """Ranks of a page starting at 0-based `offset`; `first_better` = members strictly ahead of
    the first item. Shared ranks: an item equal to the one before shares its rank, any other
    item's rank is its position (standard competition ranking, 1, 2, 2, 4)."""
    if ties is Ties.ORDINAL:
        return [offset + i + 1 for i in range(len(scores))]
    ranks: list[int] = []
    for i, score in enumerate(scores):
        if i == 0:
            ranks.append(first_better + 1)
        elif score == scores[i - 1]:
            ranks.append(ranks[-1])
        else:
            ranks.append(offset + i + 1)
    return ranks


def rank_of_score(strictly_better: int, equal: int, tie_break: TieBreak, ties: Ties) -> int:
    """The rank a member reaching `score` now would get: with `first` it ranks behind everyone
    already at that score (they got there earlier), otherwise ahead of them."""
    if ties is Ties.SHARED or tie_break is not TieBreak.FIRST:
        return strictly_better + 1
    return strictly_better + equal + 1


_EXACT = 2**53


def json_score(value: float) -> float | int:
    """A score as answers carry it: an integer when it is one (and exact), else the float
    (items() inlines this)."""
    return int(value) if value.is_integer() and abs(value) <= _EXACT else value


def item(rank: int | None, entry: Entry) -> dict[str, Any]:
    """A ranked member as every answer and period result carries it: rank, member, score, meta."""
    return items([rank], [entry])[0]


def items(ranks: Sequence[int | None], entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """item() of each (rank, entry): one loop with json_score inlined (a page's rows are the read
    path's hottest code)."""
    out: list[dict[str, Any]] = []
    for rank, (member, score, meta) in zip(ranks, entries, strict=True):
        exact = score.is_integer() and -_EXACT <= score <= _EXACT
        row: dict[str, Any] = {"rank": rank, "member": member, "score": int(score) if exact else score}
        if meta is not None:
            row["meta"] = orjson.Fragment(meta)  # stored as JSON already: embedded, not re-parsed
        out.append(row)
    return out
