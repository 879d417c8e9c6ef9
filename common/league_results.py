"""A league season's end (docs/leagues.md#the-season-end-record): each division's final
standings, with every ranked member's tier, the tier the season ends them in, and their reward,
as records of rank_period_closed. worker/results.py emits them exactly once per season, every
division's record in one transaction, on one partition (the season's).

A record, keyed `<board>|season|<period>|<division>`:
    {"board", "window": "season", "period", "division": "<tier>.<n>", "tier", "closed_at": the
     season's end (ms), "members": how many of the division have a score, "seq": the board's seq
     when the season was read, "top": [{"rank", "member", "score", "meta"?, "tier", "new_tier",
     "reward"}]}
`new_tier` is what the member's next seat will be (place.lua decides it the same way, from the
same sealed standings); `reward` is true for the best `rewards.top` of the division.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from common.boards import BoardType, Order
from common.league import League, division_id, division_instance
from common.periods import Period
from common.ranking import item
from common.results import RESULT_PAGE, result_key
from common.store import reads
from common.store.encoding import tie_mode
from common.store.keys import BoardKeys, window_instance
from common.store.league import seats_taken
from common.store.topology import Store
from common.windows import SEASON_WINDOW


@dataclass(frozen=True, slots=True)
class SeasonEnd:
    key: str  # `<board>|season|<period>`: the due season, and its records' keys' prefix
    seq: int
    members: int  # ranked, over every division
    records: list[tuple[str, bytes]]  # (key, value) per division opened, lowest tier first


def season_end(client: Store, prefix: str, board_type: BoardType, board: str, period: Period) -> SeasonEnd:
    """Every division of the season, read page by page (each call short), into its record."""
    league = board_type.league
    assert league is not None
    keys = BoardKeys(prefix, board)
    season = window_instance(SEASON_WINDOW, period.id)
    taken = seats_taken(client.hgetall(keys.seats_taken(season)), league)  # type: ignore[arg-type]
    seq = int(client.get(keys.seq) or 0)
    desc = board_type.order is Order.DESC
    key = result_key(board, SEASON_WINDOW, period.id)
    records: list[tuple[str, bytes]] = []
    ranked = 0
    for tier in league.tiers:
        for number in range(1, league.divisions(taken[tier]) + 1):
            ref = reads.WindowRef(keys, division_instance(season, tier, number), desc, tie_mode(board_type))
            rows = _rows(client, ref)
            ranked += len(rows)
            name = division_id(tier, number)
            body = {
                "board": board, "window": SEASON_WINDOW, "period": period.id, "division": name, "tier": tier,
                "closed_at": period.end_ms, "members": len(rows), "seq": seq,
                "top": [_ranked(league, tier, rank, entry, len(rows)) for rank, entry in enumerate(rows, 1)],
            }  # fmt: skip
            records.append((f"{key}|{name}", orjson.dumps(body)))
    return SeasonEnd(key, seq, ranked, records)


def _rows(client: Store, ref: reads.WindowRef) -> list[reads.Entry]:
    rows: list[reads.Entry] = []
    while True:
        page = reads.top_sync(client, ref, len(rows), len(rows) + RESULT_PAGE)
        rows += page.entries
        if not page.entries or len(rows) >= page.total:
            return rows


def _ranked(league: League, tier: str, rank: int, entry: reads.Entry, members: int) -> dict[str, object]:
    return {**item(rank, entry), "tier": tier, "new_tier": league.outcome(tier, rank, members),
            "reward": rank <= league.rewards_top}  # fmt: skip
