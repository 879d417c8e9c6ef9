"""Ranking rules shared by the worker (through apply.lua) and the API.

A board's zset score is the member's exact score. Equal scores are ordered by the time the
member reached that score: that time is written as a fixed-width hex prefix of the zset
member, so Redis' own bytewise ordering of equal-score members *is* the tie rule. Desc
boards read with ZREVRANGE (equal scores: larger member first), asc boards with ZRANGE.

Exact range: scores are IEEE doubles. Integer scores are exact for |score| <= 2**53 - 1:
with both operands inside that range, an incr whose true result is inside it is computed
exactly, and one whose true result is outside lands at >= 2**53 and is refused, so no
score is ever rounded silently. Such events (and any event whose own score is outside the
range) are dead-lettered as `score_out_of_range`. Non-integer scores are IEEE doubles with
their usual rounding. Tie times are exact to the millisecond up to 9999-12-31.
"""

from __future__ import annotations

from enum import StrEnum

from common.boards import BoardType, Order, TieBreak

TIE_WIDTH = 12  # hex digits: 48 bits of milliseconds, beyond year 9999
_TIE_MAX = (1 << (4 * TIE_WIDTH)) - 1


class TieMode(StrEnum):
    """How apply.lua prefixes members: `inv` = earlier sorts later bytewise, `fwd` = earlier sorts first."""

    INV = "inv"
    FWD = "fwd"
    NONE = "none"


def tie_mode(board_type: BoardType) -> TieMode:
    if board_type.tie_break is TieBreak.NONE:
        return TieMode.NONE
    earlier_first = board_type.tie_break is TieBreak.FIRST
    # desc reads in reverse byte order, so "earlier first" needs earlier times to sort *later*
    if (board_type.order is Order.DESC) == earlier_first:
        return TieMode.INV
    return TieMode.FWD


def encode_member(mode: TieMode, tie_ms: int, member: str) -> str:
    if mode is TieMode.NONE:
        return member
    value = _TIE_MAX - tie_ms if mode is TieMode.INV else tie_ms
    return f"{value:0{TIE_WIDTH}x}{member}"


def decode_member(mode: TieMode, encoded: str) -> str:
    return encoded if mode is TieMode.NONE else encoded[TIE_WIDTH:]


def format_score(score: float) -> str:
    """The one text form of a score: integers without a fraction, others round-trip exact."""
    if score.is_integer() and abs(score) <= 2**53:
        return str(int(score))
    return repr(score)


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
