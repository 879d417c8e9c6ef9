"""place.lua's typed wrapper: seats in a league season (common/league.py), and what the API
reads of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.league import League, Seat, parse_seat
from common.store.encoding import text
from common.store.keys import BoardKeys
from common.store.scripts import Call, load_script
from common.store.topology import Store

PLACE_KEYS, PLACE_ARGS = ("SEATS", "TAKEN", "CARRIED"), ("EXPIRE", "ENTRY", "TIERS")
_SCRIPT = load_script("place", (("K", PLACE_KEYS), ("A", PLACE_ARGS)))


@dataclass(frozen=True, slots=True)
class Placing:
    """The members of one board's league season to seat, in the order they joined."""

    keys: BoardKeys
    season: str  # the season's instance: `season:<period id>`
    expire_at_ms: int  # the season's (0 = never)
    league: League
    members: Sequence[str]

    def call(self) -> Call:
        keys = [self.keys.seats(self.season), self.keys.seats_taken(self.season), self.keys.tiers]
        args: list[str | int] = [self.expire_at_ms, self.league.entry_tier, len(self.league.tiers)]
        return Call(keys, [*args, *self.league.tiers, *self.members])


def place_many(client: Store, placings: Sequence[Placing]) -> list[list[Seat]]:
    """Each placing's members' seats (taken now, or earlier), in one round trip."""
    replies = _SCRIPT.run_many(client, [p.call() for p in placings])
    return [[parse_seat(raw) for raw in reply] for reply in replies]


def seats_taken(raw: dict[bytes, bytes], league: League) -> dict[str, int]:
    """HGETALL of a season's seats taken: tier -> count, for every tier of the league."""
    got = {text(k): int(v) for k, v in raw.items()}
    return {tier: got.get(tier, 0) for tier in league.tiers}
