"""place.lua's and standing.lua's typed wrappers: seats in a league season (common/league.py),
and a member's standing in their division, as the API reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from common.league import League, Movement, Seat, parse_seat
from common.store.encoding import TieMode, encode_member, text, tie_prefix_length
from common.store.keys import BoardKeys
from common.store.pipe import Pipe
from common.store.reads import Entry, WindowRef
from common.store.scripts import Call, load_script
from common.store.topology import Store

PLACE_KEYS = ("SEATS", "TAKEN", "MARK", "MOVING")
PLACE_ARGS = ("EXPIRE", "ENTRY", "SIZE", "STEM", "SEASON", "MODE", "DESC", "TIERS", "KEPT")
_SCRIPT = load_script("place", (("K", PLACE_KEYS), ("A", PLACE_ARGS)))
STANDING_KEYS, STANDING_ARGS = (
    ("RANK", "META", "SEQ"),
    ("ENTRY", "AROUND", "LIMIT", "DESC", "REVERSE", "PLEN"),
)
_STANDING = load_script("standing", (("K", STANDING_KEYS), ("A", STANDING_ARGS)))


@dataclass(frozen=True, slots=True)
class Placing:
    """The members of one board's league season to seat, in the order they joined."""

    keys: BoardKeys
    season: str  # the season's instance: `season:<period id>`
    expire_at_ms: int  # the season's (0 = never)
    # the earlier seasons still kept, newest first (the first: the season before it, sealed by
    # the first seat of this one), and their expiries
    earlier: Sequence[tuple[str, int]]
    league: League
    mode: TieMode  # the board's (its divisions' entries: common/store/encoding.py)
    desc: bool
    members: Sequence[str]

    def call(self) -> Call:
        keys = self.keys
        names = {
            "SEATS": keys.seats(self.season),
            "TAKEN": keys.seats_taken(self.season),
            "MARK": keys.prepared(self.season),
            "MOVING": keys.moving,
        }
        values: dict[str, str | int] = {
            "EXPIRE": self.expire_at_ms,
            "ENTRY": self.league.entry_tier,
            "SIZE": self.league.division_size,
            "STEM": keys.stem,
            "SEASON": self.season,
            "MODE": self.mode.value,
            "DESC": "1" if self.desc else "0",
            "TIERS": len(self.league.tiers),
            "KEPT": len(self.earlier),
        }
        args: list[str | int] = [values[name] for name in PLACE_ARGS]
        for tier in self.league.tiers:
            args += [tier, *_rule(self.league.promote.get(tier)), *_rule(self.league.demote.get(tier))]
        for season, expire in self.earlier:
            args += [season, expire]
        return Call([names[name] for name in PLACE_KEYS], [*args, *self.members])


def _rule(movement: Movement | None) -> tuple[str, str]:
    """A promotion or demotion as place.lua reads it: ('c', count), ('f', fraction), or ('', '')."""
    if movement is None:
        return "", ""
    if movement.count is not None:
        return "c", str(movement.count)
    return "f", repr(movement.fraction)


def place_many(client: Store, placings: Sequence[Placing]) -> list[list[Seat | None]]:
    """Each placing's members' seats (taken now, or earlier; None: the season is sealed, final),
    in one round trip."""
    replies = _SCRIPT.run_many(client, [p.call() for p in placings])
    return [[parse_seat(raw) if raw else None for raw in reply] for reply in replies]


def seats_taken(raw: dict[bytes, bytes], league: League) -> dict[str, int]:
    """HGETALL of a season's seats taken: tier -> count, for every tier of the league."""
    got = {text(k): int(v) for k, v in raw.items()}
    return {tier: got.get(tier, 0) for tier in league.tiers}


class Standing(NamedTuple):
    members: int  # in the division, with a score
    seq: int
    position: int | None  # the member's, 0-based in the view (None: no score now)
    score: float | None
    start: int  # the around page's first position
    top: list[Entry]
    around: list[Entry]


async def standing(
    client: Pipe, ref: WindowRef, member: str, join: int, *, n: int, limit: int, reverse: bool
) -> Standing:
    """`member` (seated `join`-th in their tier) in the division `ref`: its top `limit` rows, the
    member's position and score, the n rows above and below, in one call (one seq)."""
    keys = [ref.rank_key, ref.keys.meta, ref.keys.seq]
    values: dict[str, str | int] = {
        "ENTRY": encode_member(ref.mode, join, member),  # a division's entry: no tie index to ask
        "AROUND": n,
        "LIMIT": limit,
        "DESC": "1" if ref.desc else "0",
        "REVERSE": "1" if reverse else "0",
        "PLEN": tie_prefix_length(ref.mode),
    }
    reply = await _STANDING.run_pipe(client, keys, [values[name] for name in STANDING_ARGS])
    position = int(reply[2])
    top, at = _page(reply, 5)
    around, _ = _page(reply, at)
    score = None if position < 0 else float(reply[3])
    return Standing(
        int(reply[0]), int(reply[1]), None if position < 0 else position, score, int(reply[4]), top, around
    )


def _page(reply: list[Any], at: int) -> tuple[list[Entry], int]:
    """A page as page.lua appends it at reply[at], and where the reply goes on."""
    n = int(reply[at])
    rows = reply[at + 1 : at + 1 + 2 * n]
    metas = reply[at + 1 + 2 * n : at + 1 + 3 * n]
    entries = [
        Entry(text(m), float(v), meta or None)
        for m, v, meta in zip(rows[::2], rows[1::2], metas, strict=True)
    ]
    return entries, at + 1 + 3 * n
