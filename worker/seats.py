"""League seats as the worker uses them (common/league.py): before a batch is applied, every
member whose event counts in a league season gets their seat (common/store/lua/place.lua, one
call per board and season, pipelined), and the event counts in that seat's division instead of
the season.

A seat never changes during its season, so the worker keeps the seats it learned (bounded,
least recently used first out) and asks Redis only for members it has not seen this season.
A Redis data set that is not the one it learned them from (worker/apply.py's epoch) drops them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from cachetools import LRUCache

from common.boards import BoardType, Order
from common.league import League, Seat, division_instance, parse_seat, seat_instance
from common.store.apply import Instance
from common.store.encoding import text, tie_mode
from common.store.keys import BoardKeys
from common.store.league import Placing, place_many
from common.store.topology import Store
from common.windows import SEASON_WINDOW

DEFAULT_MAX_SEATS = 200_000  # ~200 B each: ~40 MB of a worker at most; a miss costs one HGET in place.lua
_SEASON_PREFIX = f"{SEASON_WINDOW}:"


def season_of(pairs: Iterable[Instance]) -> Instance | None:
    """The league season's instance among an event's instances (None: its season takes no event)."""
    for inst in pairs:
        if inst.name.startswith(_SEASON_PREFIX) and inst.rolling is None:
            return inst
    return None


def division(league: League, season: Instance, seat: Seat) -> Instance:
    """The division a seat is in, as the instance an event there counts in (sealed with its
    season: their marker is one, common/store/keys.py prepared)."""
    return Instance(seat_instance(league, season.name, seat), season.expire_at_ms, sealable=True, joined=True)


class Wanted(NamedTuple):
    """A board's league season to seat members in, and the seasons before it still kept."""

    board: str
    board_type: BoardType
    season: Instance
    earlier: list[tuple[str, int]]  # (instance, expiry), newest first
    members: list[str]  # in the order they joined


class Seats:
    def __init__(self, prefix: str, max_seats: int = DEFAULT_MAX_SEATS) -> None:
        self._prefix = prefix
        self._known: LRUCache[tuple[str, str, str], Seat] = LRUCache(maxsize=max_seats)
        # (board, season) found sealed by place.lua: final, it seats no one any more
        self._sealed: LRUCache[tuple[str, str], bool] = LRUCache(maxsize=10_000)
        self.asked = 0  # members Redis was asked to seat (metrics, tests)

    def clear(self) -> None:
        self._known.clear()
        self._sealed.clear()

    def seats(self, board: str, season: str, member: str) -> bool:
        """Whether an event of `member` in `season` would take a seat: not seated as far as
        this worker knows, in a season not known to be sealed."""
        return (board, season) not in self._sealed and (board, season, member) not in self._known

    def get(self, board: str, season: str, member: str) -> Seat | None:
        return self._known.get((board, season, member))

    def take(self, client: Store, wanted: Sequence[Wanted]) -> None:
        """Seat these members (a sealed season seats no one: they stay unknown)."""
        placings = [
            Placing(
                BoardKeys(self._prefix, w.board),
                w.season.name,
                w.season.expire_at_ms,
                w.earlier,
                league,
                tie_mode(w.board_type),
                w.board_type.order is Order.DESC,
                w.members,
            )
            for w in wanted
            if w.members and (league := w.board_type.league) is not None
        ]
        if not placings:
            return
        for placing, seats in zip(placings, place_many(client, placings), strict=True):
            board = placing.keys.board
            for member, seat in zip(placing.members, seats, strict=True):
                if seat is not None:
                    self._known[(board, placing.season, member)] = seat
                else:  # a sealed season (place.lua seats no one there)
                    self._sealed[(board, placing.season)] = True
            self.asked += len(placing.members)

    def lookup(self, client: Store, board: str, season: str, members: Sequence[str]) -> list[Seat | None]:
        """The seats these members hold (None: none), asking Redis for those not known; seats
        nobody takes (an erase's member)."""
        unknown = [m for m in members if self.get(board, season, m) is None]
        if unknown:
            raw = client.hmget(BoardKeys(self._prefix, board).seats(season), unknown)
            for member, value in zip(unknown, raw, strict=True):
                if value is not None:
                    self._known[(board, season, member)] = parse_seat(value)
        return [self.get(board, season, m) for m in members]

    def divisions(self, client: Store, board: str, board_type: BoardType, season: Instance) -> list[Instance]:
        """Every division of the season that has opened (a reset empties them all)."""
        league = board_type.league
        assert league is not None
        raw = client.hgetall(BoardKeys(self._prefix, board).seats_taken(season.name))
        out = []
        for tier_raw, count in raw.items():
            tier = text(tier_raw)
            for number in range(1, league.divisions(int(count)) + 1):
                name = division_instance(season.name, tier, number)
                out.append(Instance(name, season.expire_at_ms, joined=True))
        return out
