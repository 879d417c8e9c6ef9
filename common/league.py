"""Leagues (docs/contract.md §3): a board type's season split into divisions of a fixed size,
grouped in tiers. The rules every process shares live here: what a seat is, which division a
seat is in, how a division is named in the API and in Redis.

A member's first event of a season takes a *seat*: the next free place in their tier, numbered
from 0 in the order members joined (common/store/lua/place.lua hands them out, atomically).
Seat `order` is in division `order // division_size + 1`, so a division opens when the one
before it is full. Inside a division, equal scores rank by join order: the seat's order is the
member's tie there. Seats are never taken back during their season (not by a delete, an erase
or a reset): a division never holds more members than its size, and a member never has two.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

TIER_RE = re.compile(r"[a-z0-9_]{1,32}")
MAX_TIERS = 32
MAX_DIVISION_SIZE = 10_000
DIVISION_MARK = "@"  # a division's instance: `<season instance>@<tier>.<n>` (common/store/keys.py)
_DIVISION_RE = re.compile(rf"({TIER_RE.pattern})\.([1-9][0-9]{{0,8}})")


@dataclass(frozen=True, slots=True)
class Movement:
    """How many of a division move at the season's end: a count, or a fraction of its members
    (rounded down)."""

    count: int | None = None
    fraction: float | None = None

    def of(self, members: int) -> int:
        if self.count is not None:
            return min(self.count, members)
        assert self.fraction is not None
        return int(self.fraction * members)


@dataclass(frozen=True, slots=True)
class League:
    division_size: int
    tiers: tuple[str, ...]  # lowest first
    entry_tier: str  # where a member with no tier yet starts
    promote: Mapping[str, Movement]  # tier -> how many of each of its divisions move up
    demote: Mapping[str, Movement]
    rewards_top: int  # the best this many of each division are rewarded (0: none)

    def division(self, seat_order: int) -> int:
        """The division (1-based, per tier) of the seat taken `seat_order`-th in its tier."""
        return seat_order // self.division_size + 1

    def divisions(self, seats: int) -> int:
        """How many divisions a tier with `seats` seats taken has opened."""
        return (seats + self.division_size - 1) // self.division_size

    def outcome(self, tier: str, rank: int, members: int) -> str:
        """The tier a member ranked `rank` of the `members` with a score in their division of
        `tier` ends the season in: promoted first, then demoted (place.lua decides the same)."""
        t = self.tiers.index(tier)
        up, down = self.promote.get(tier), self.demote.get(tier)
        if t < len(self.tiers) - 1 and up is not None and rank <= up.of(members):
            return self.tiers[t + 1]
        if t > 0 and down is not None and rank > members - down.of(members):
            return self.tiers[t - 1]
        return tier


class Seat(NamedTuple):
    tier: str
    order: int  # 0-based, in the order members of the tier joined: the member's tie


def seat_text(seat: Seat) -> str:
    """A seat as Redis keeps it (place.lua writes the same): `<tier>:<order>`."""
    return f"{seat.tier}:{seat.order}"


def parse_seat(raw: bytes | str) -> Seat:
    text = raw.decode() if isinstance(raw, bytes) else raw
    tier, _, order = text.rpartition(":")
    return Seat(tier, int(order))


def division_id(tier: str, number: int) -> str:
    """A division's name in the API: `<tier>.<n>` (`gold.3`)."""
    return f"{tier}.{number}"


def parse_division(text: str) -> tuple[str, int] | None:
    """(tier, number) of `gold.3`; None if it is not a division's name."""
    match = _DIVISION_RE.fullmatch(text)
    return None if match is None else (match[1], int(match[2]))


def is_division(instance: str) -> bool:
    return DIVISION_MARK in instance


def season_instance_of(instance: str) -> str:
    """The season a division's instance is in (`season:<id>`); any other instance itself."""
    return instance.partition(DIVISION_MARK)[0]


def division_instance(season_instance: str, tier: str, number: int) -> str:
    """The window instance a division is in Redis: `season:<period>@<tier>.<n>`."""
    return f"{season_instance}{DIVISION_MARK}{division_id(tier, number)}"


def seat_instance(league: League, season_instance: str, seat: Seat) -> str:
    return division_instance(season_instance, seat.tier, league.division(seat.order))
