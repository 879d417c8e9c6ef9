"""Backfill: a board made hot after it already holds data gets its whole current state into
update_cache before any marker says "complete". Run by every worker at start (one wins the
lock, the others skip) and by `rankstream backfill`.

Every record is labelled with the board seq read *before* the scan: a change made during the
scan is published live with a higher seq, and replay keeps the higher seq, whatever the order.
After the states, a reset of the whole board (format 2: every window, and the meta; format 1:
each instance Redis holds) at the seq before voids every older record: what the board held
before a spell of not being hot (a member deleted meanwhile) does not come back. The reset comes
after the states, so a node following the board live never sees it emptied.

The flag (BoardKeys.hot_ready, "<seq>|<window>,<window>...") says which hot windows were
backfilled; workers publish a board's markers only while the flag covers every window their
config makes hot, so a window added to a hot board is backfilled too. A board that stops being
hot stops being published: every worker, at start, drops the flags of the boards its config no
longer makes hot (the set keys.hot_flagged lists them), so the board is backfilled again when it
becomes hot again. A flag of the form "<seq>" (before windows were recorded) covers nothing: such
a board is backfilled once more, which replay takes as it takes any record."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from common.boards import BoardsConfig
from common.cache_records import CHUNK_BYTES, CHUNK_MEMBERS, ChunkRow
from common.store import scan
from common.store.encoding import (
    hot_flag,
    hot_flag_covers,
    text,
)
from common.store.keys import BoardKeys, hot_flagged
from common.store.scan import StateRow
from common.store.shards import shard_names
from common.store.topology import Store
from worker.publisher import CachePublisher

_log = logging.getLogger(__name__)
LOCK_MS = 600_000


def _publish_instance(
    publisher: CachePublisher, board: str, instance: str, seq: int, rows: Iterable[StateRow]
) -> int:
    """An instance's members, all labelled `seq`: in chunks (format 2), or one state record each
    (format 1, whose records carry the meta); the members published."""
    records = publisher.records
    chunk: list[ChunkRow] = []
    size = number = published = 0
    for row in rows:
        published += 1
        if records.version == 1:
            state = row.state
            publisher.produce(
                board,
                records.state(board, instance, row.member, score=state.score, tie_ms=state.tie_ms,
                              seq=seq, meta=row.meta),
            )  # fmt: skip
            continue
        chunk.append((row.member, row.state.score, row.state.tie_ms, row.meta))
        size += 40 + len(row.member) + len(row.meta or b"")
        if len(chunk) >= CHUNK_MEMBERS or size >= CHUNK_BYTES:
            publisher.produce(board, records.chunk(board, instance, number, seq, chunk))
            chunk, size, number = [], 0, number + 1
    publisher.produce(board, records.chunk(board, instance, number, seq, chunk))  # None if empty
    return published


def backfill_board(
    client: Store,
    publisher: CachePublisher,
    *,
    boards: BoardsConfig,
    key_prefix: str,
    board: str,
    timeout: float = 60.0,
) -> int | None:
    """Publish the board's state and its marker, then flag it. None if another worker holds it."""
    keys = BoardKeys(key_prefix, board)
    windows = boards.hot_windows(board)
    if hot_flag_covers(client.get(keys.hot_ready), windows):
        return 0
    if not client.set(keys.hot_lock, "1", nx=True, px=LOCK_MS):
        return None
    try:
        seq0 = int(client.get(keys.seq) or 0)
        records = publisher.records
        published = 0
        instances = scan.window_instances(client, keys, windows, boards, board.split(":", 1)[0])
        for instance, packing, mode in instances:
            rows = (row for page in scan.state_pages(client, keys, instance, packing, mode) for row in page)
            published += _publish_instance(publisher, board, instance, seq0, rows)
        if seq0 > 0:  # what is older than the backfill and was not restated is void: changes
            # made while the board was not hot (a member deleted then) were never published
            whole = records.board_reset(board, seq0 - 1)  # format 2: every window and the meta
            if whole is not None:
                publisher.produce(board, whole)
            else:  # format 1: each instance Redis holds
                for instance, _, _ in instances:
                    publisher.produce(board, records.reset(board, instance, seq0 - 1))
        publisher.produce(board, records.marker(board, seq0))
        publisher.flush(timeout)
        client.sadd(hot_flagged(key_prefix), board)  # before the flag: every flag is listed
        client.set(keys.hot_ready, hot_flag(seq0, windows))
        _log.info("hot board backfilled", extra={"board": board, "members": published, "seq": seq0})
        return published
    finally:
        client.delete(keys.hot_lock)


def forget_cold(client: Store, boards: BoardsConfig, key_prefix: str) -> list[str]:
    """Drop the flags of the boards the config no longer makes hot; the boards dropped."""
    listed = hot_flagged(key_prefix)
    cold = sorted(b for b in (text(raw) for raw in client.smembers(listed)) if not boards.hot_windows(b))
    for board in cold:
        client.delete(BoardKeys(key_prefix, board).hot_ready)
        client.srem(listed, board)
        _log.info("hot board no longer hot: its backfill flag dropped", extra={"board": board})
    return cold


def backfill_all(client: Store, publisher: CachePublisher, boards: BoardsConfig, key_prefix: str) -> None:
    forget_cold(client, boards, key_prefix)
    for hot in boards.hot:  # a sharded board: each shard alone, with its own seq, marker and flag
        for name in shard_names(hot.board, boards.shards_of(hot.board)):
            backfill_board(client, publisher, boards=boards, key_prefix=key_prefix, board=name)
