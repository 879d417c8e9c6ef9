"""Boards an API node made hot by itself (it registered them in Redis: BoardKeys.promoted,
common/store/promotion.py), as this worker knows them.

The worker never polls for registrations: every write states what the worker believes of its
board (ApplyRequest.promoted, GuardedWrite.promoted), and apply.lua, guarded.lua and the
native transaction refuse a write whose belief is wrong, before writing anything. The worker
learns the truth from the refusal and writes again. So each write made while a board is
registered reports its states and is published to update_cache, whichever worker makes it:
what lets a node load the board from Redis and follow it from update_cache, exactly.

A registered board is published in every window of its type (a node serves it whole), with a
marker after each batch; it needs no backfill (the node reads Redis itself). A board the config
makes hot stays as the config says."""

from __future__ import annotations

from common.boards import BoardsConfig
from common.store.shards import board_of

MAX_BELIEVED = 100_000  # beyond, the set starts over: a write that finds it wrong learns again


class Promotions:
    def __init__(self, boards: BoardsConfig) -> None:
        self._boards = boards
        self._promoted: set[str] = set()  # boards (a sharded board's: shard names) believed registered

    def believed(self, board: str) -> bool:
        return board in self._promoted

    def learn(self, board: str, promoted: bool) -> None:
        """What a refused write found: the board is registered, or no longer."""
        if not promoted:
            self._promoted.discard(board)
            return
        if len(self._promoted) >= MAX_BELIEVED:
            self._promoted.clear()
        self._promoted.add(board)

    def windows(self, board: str) -> tuple[str, ...]:
        """The windows published of `board` (or a shard's name): the config's hot windows, or
        every window of its type while it is registered; () otherwise."""
        hot = self._boards.hot_windows(board)
        if hot or board not in self._promoted:
            return hot
        board_type = self._boards.type_for(board_of(board).split(":", 1)[0])
        return () if board_type is None else tuple(w.name for w in board_type.promotable_windows())

    def marks(self, board: str) -> bool:
        """Whether the board's markers go out without a backfill: registered, not hot by the config."""
        return board in self._promoted and not self._boards.hot_windows(board)
