"""Period results (docs/contract.md §6, docs/period-results.md): the record a closed period emits to
rank_period_closed, its key, when it is due, and how it is read from Redis. The worker emits it
(worker/results.py), `rankstream periods --republish` re-emits it (rankstream/periods.py).

The record, keyed `<board>|<window>|<period>`:
    {"board", "window", "period", "closed_at": the period's end (ms), "members": how many it
     holds, "seq": the board's seq when it was read, "top": [{"rank", "member", "score", "meta"?}]}
Ranks are 1-based and unique, in the board's order with its tie rule (what `top` answers)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from common.boards import RESULT_SETTLE_MS, BoardType, Order, Window
from common.periods import Period
from common.ranking import item
from common.store import reads, shardreads
from common.store.encoding import tie_mode, window_packing
from common.store.keys import BoardKeys, window_instance
from common.store.shards import shard_names
from common.store.topology import Store

# Members per top.lua call while a result is read: each call stays under a millisecond of Redis
# time on a million-member board, even with 1 KiB metas (bench/results.py: ~1.5 us a member, 3.2
# with such metas; 500 a page took up to 1.4 ms), so reading a 10,000-member top blocks nobody.
RESULT_PAGE = 200
# A record holds up to 10,000 members with their metas (<= 1 KiB each): ~11 MiB at most. The topic
# (rankstream/topics.py) and the worker's results producer, which compresses, allow this much.
MAX_RESULT_BYTES = 16 * 1024 * 1024


def result_key(board: str, window: str, period: str) -> str:
    """The record's Kafka key, and the period's name in `{results}:due`."""
    return f"{board}|{window}|{period}"


def split_result_key(key: str) -> tuple[str, str, str]:
    """(board, window, period) of a result key (neither a board nor a window holds `|`)."""
    board, window, period = key.split("|", 2)
    return board, window, period


def result_due_ms(board_type: BoardType, period: Period) -> int:
    """When the period's result is read: once the period closed and its late grace passed."""
    return period.end_ms + board_type.late_grace_ms + RESULT_SETTLE_MS


@dataclass(frozen=True, slots=True)
class PeriodResult:
    board: str
    window: str
    period: str
    closed_at: int  # ms: the period's end
    members: int
    seq: int
    top: list[reads.Entry]

    @property
    def key(self) -> str:
        return result_key(self.board, self.window, self.period)

    def encode(self) -> bytes:
        items = [item(rank, entry) for rank, entry in enumerate(self.top, 1)]
        body = {
            "board": self.board,
            "window": self.window,
            "period": self.period,
            "closed_at": self.closed_at,
            "members": self.members,
            "seq": self.seq,
            "top": items,
        }
        return orjson.dumps(body)


def read_result(
    client: Store,
    prefix: str,
    board_type: BoardType,
    board: str,
    *,
    window: Window,
    period: Period,
    seq: int | None = None,
    page: int = RESULT_PAGE,
) -> PeriodResult:
    """The period's best `period_results.top` members, page by page (one short call each), and
    how many it holds. `seq`: the record's (a republished one keeps the first's); else the
    board's as the first page reads it."""
    assert board_type.results is not None
    packing = window_packing(board_type, window, period.start_ms)
    desc = board_type.order is Order.DESC
    refs = [
        reads.WindowRef(BoardKeys(prefix, name), window_instance(window.name, period.id), desc,
                        tie_mode(board_type), packing)
        for name in shard_names(board, board_type.shards)
    ]  # fmt: skip
    want = board_type.results.top
    tops, total, seqs = [], 0, 0
    for ref in refs:  # a sharded board: each shard's best `want`, merged; members and seq summed
        count, shard_seq, rows = shardreads.top_rows(client, ref, 0, min(page, want))
        total, seqs = total + count, seqs + shard_seq
        while len(rows) < min(want, count):
            _, _, more = shardreads.top_rows(client, ref, len(rows), min(len(rows) + page, want))
            if not more:  # emptied meanwhile (an erase): what was read is the result
                break
            rows += more
        tops.append(rows)
    entries = [shardreads.entry(refs[0], row) for row in shardreads.merge(tops, desc)[:want]]
    seq = seqs if seq is None else seq
    return PeriodResult(board, window.name, period.id, period.end_ms, total, seq, entries)
