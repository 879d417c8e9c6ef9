"""Ties inside the score: the packed layout of a board type that declares its score range.

A window instance of such a type keeps one sorted-set entry per member, the member's own id
with the score `score * 2**bits + tie`, where `tie` is the time (ms) the member reached its
score counted from BEFORE_START_MS before the start of the instance's period (inverted,
`2**bits - 1 - offset`, when earlier must sort later), so Redis' score order *is* the board's
order with its tie rule, and no state hash or tie prefix is needed (common/store/encoding.py,
`Packing`). Exact while every packed value stays within 2**53: the declared range times
2**bits must fit, which common/boards.py checks when the config is loaded.

`total` has no period to count ties from, so it packs only without ties (tie_break: none);
with ties it keeps the general layout. This module knows no board type (common/boards.py
imports it), only windows.
"""

from __future__ import annotations

from common.windows import Window, WindowKind

EXACT_BITS = 53
_HOUR_MS = 3_600_000
# Ties count from BEFORE_START_MS before the period's start: where a daylight-saving gap is not
# on the hour (Pacific/Chatham), an event can fall in a period that starts after it, by less
# than the shift (common/periods.py). Every period's events then fit [0, BEFORE_START_MS +
# the longest real duration of one period), the latter with room for a 2 h shift (a repeated
# local hour is one bucket).
BEFORE_START_MS = 2 * 3_600_000
LONGEST_PERIOD_MS = {
    "hour": 3 * _HOUR_MS,
    "day": 26 * _HOUR_MS,
    "week": (7 * 24 + 2) * _HOUR_MS,
    "month": (31 * 24 + 2) * _HOUR_MS,
    "year": (366 * 24 + 2) * _HOUR_MS,
}


def longest_period_ms(window: Window) -> int | None:
    """The longest real duration one period of the window can span; None: it has no periods."""
    if window.kind is WindowKind.FIXED and window.minutes is not None:
        return window.minutes * 60_000 + 2 * _HOUR_MS  # a repeated local time stays in one period
    if window.kind is WindowKind.SEASON:
        if window.rule is not None:
            return window.rule.every_days * 24 * _HOUR_MS + 2 * _HOUR_MS
        return max(season.end_ms - season.start_ms for season in window.seasons)
    return LONGEST_PERIOD_MS.get(window.kind.value)


def tie_bits(longest_ms: int | None, ties: bool) -> int | None:
    """Bits of tie time a window whose periods last at most `longest_ms` packs beside the score;
    None: it can't pack (it has no periods to count ties from)."""
    if not ties:
        return 0
    return None if longest_ms is None else (BEFORE_START_MS + longest_ms - 1).bit_length()


def packable_bounds(bits: int) -> tuple[int, int]:
    """The widest integer score range whose packed values stay within 2**53."""
    room = 1 << (EXACT_BITS - bits)
    return -room, room - 1


def packable(score_range: tuple[int, int], bits: int) -> bool:
    low, high = packable_bounds(bits)
    return low <= score_range[0] and score_range[1] <= high
