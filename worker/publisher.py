"""Publishes hot boards' absolute member states to the compacted update_cache topic.

After each applied batch: one record per touched (hot window instance, member) with its state
after the batch, one per hot window instance a reset emptied (with the seq it was emptied at),
and, once the board is backfilled, one marker with the board's seq. A sharded board's records
name the shard they come from (its seqs are the shard's) and go to the board's partition. Live
records go out in the batch's transaction (worker/outputs.py), so offsets are never committed
past a change that API nodes could miss; a backfill's `flush()` raises unless every record was
acknowledged."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from common.boards import BoardsConfig
from common.cache_records import FORMAT, RecordWriter, partition_for
from common.control import WHOLE_BOARD
from common.events import Op
from common.store.encoding import MemberState, Status, hot_flag_covers
from common.store.keys import TOTAL_INSTANCE, BoardKeys
from common.store.shards import board_of
from common.store.topology import Store
from worker.apply import Outcome
from worker.dlq import Sink
from worker.promotions import Promotions

_log = logging.getLogger(__name__)


def instance_window(instance: str) -> str:
    return TOTAL_INSTANCE if instance == TOTAL_INSTANCE else instance.split(":", 1)[0]


class CachePublisher:
    def __init__(
        self,
        sink: Sink,
        topic: str,
        *,
        partitions: int,
        boards: BoardsConfig,
        client: Store,
        key_prefix: str,
        record_format: int = FORMAT,
        promotions: Promotions | None = None,
    ) -> None:
        self._topic = topic
        # what is published of a board: the config's hot windows, or every window of one an API
        # node registered (worker/promotions.py: the applier's, which learns of them)
        self.promotions = promotions if promotions is not None else Promotions(boards)
        self.records = RecordWriter(record_format)
        self._partitions = partitions
        self._boards = boards
        self._client = client
        self._prefix = key_prefix
        self._backfilled: set[str] = set()
        # the worker's transactional outputs, or an acknowledged producer for a backfill
        self._sink = sink
        self.published = 0

    def over(self, sink: Sink) -> CachePublisher:
        """The same publisher producing through `sink` (the boards it knows are backfilled kept)."""
        twin = CachePublisher(
            sink,
            self._topic,
            partitions=self._partitions,
            boards=self._boards,
            client=self._client,
            key_prefix=self._prefix,
            record_format=self.records.version,
            promotions=self.promotions,
        )
        twin._backfilled = set(self._backfilled)
        return twin

    def produce(self, board: str, record: tuple[bytes, bytes] | None) -> None:
        """`board`: a board, or a shard's name: a sharded board's records share its partition.
        None: a record the format has not (format 1 carries meta in window records)."""
        if record is None:
            return
        key, value = record
        partition = partition_for(board_of(board), self._partitions)
        self._sink.produce(self._topic, value=value, key=key, partition=partition)
        self.published += 1

    def backfilled(self, board: str) -> bool:
        """Markers promise completeness, so none goes out before the board's backfill is done."""
        if board not in self._backfilled and hot_flag_covers(
            self._client.get(BoardKeys(self._prefix, board).hot_ready), self._boards.hot_windows(board)
        ):
            self._backfilled.add(board)
        return board in self._backfilled

    def publish(self, outcomes: Sequence[Outcome]) -> None:
        """Queue the records of one applied batch (duplicates re-publish the current state)."""
        latest: dict[tuple[str, str, str], tuple[MemberState | None, int, bytes | None]] = {}
        metas: dict[tuple[str, str], tuple[int, bytes | None]] = {}  # format 2: meta records
        resets: dict[tuple[str, str], int] = {}  # instance "": the board's meta (a whole reset)
        seqs: dict[str, int] = {}
        for outcome in (o for each in outcomes for o in (each, *each.also)):
            board = outcome.shard or outcome.event.board  # a sharded board's: the shard's records
            hot = self.promotions.windows(board)
            if not hot or outcome.status is Status.OUT_OF_RANGE:
                continue
            seqs[board] = max(seqs.get(board, 0), outcome.seq)
            event = outcome.event
            if event.op is Op.RESET:  # no member: its instances' latest resets
                _note_resets(resets, outcome, hot)
                continue
            for instance, state in outcome.states.items():
                if instance_window(instance) in hot:
                    latest[(board, instance, event.member)] = (state, outcome.seq, outcome.meta)
            # format 2: the member's meta whenever it has one (so a format-1 record's meta that a
            # format-2 state replaces in compaction lives on), and whenever the event changed it
            if outcome.meta or event.meta is not None or event.op in (Op.DELETE, Op.ERASE):
                metas[(board, event.member)] = (outcome.seq, outcome.meta)
        records = self.records
        for (board, instance, member), (state, seq, meta) in latest.items():
            self.produce(board, self._member_record(board, instance, member, state, seq=seq, meta=meta))
        for (board, member), (seq, meta) in metas.items():
            self.produce(board, records.meta(board, member, seq, meta))
        for (board, instance), seq in resets.items():
            self.produce(
                board,
                records.board_reset(board, seq) if not instance else records.reset(board, instance, seq),
            )
        for board, seq in seqs.items():
            if self.promotions.marks(board) or self.backfilled(board):
                self.produce(board, records.marker(board, seq))

    def publish_states(
        self, board: str, instance: str, rows: Sequence[tuple[str, MemberState | None, bytes | None, int]]
    ) -> None:
        """Queue one record per (member, state, meta, seq) of one instance: a rolling period
        being prepared (worker/rolling.py)."""
        for member, state, meta, seq in rows:
            self.produce(board, self._member_record(board, instance, member, state, seq=seq, meta=meta))

    def flush(self, timeout: float) -> None:
        self._sink.flush(timeout)

    def _member_record(
        self,
        board: str,
        instance: str,
        member: str,
        state: MemberState | None,
        *,
        seq: int,
        meta: bytes | None,
    ) -> tuple[bytes, bytes]:
        """A member's state in an instance, or its absence (None); `meta` goes along in format 1."""
        if state is None:
            return self.records.deleted(board, instance, member, seq, meta)
        return self.records.state(
            board, instance, member, score=state.score, tie_ms=state.tie_ms, seq=seq, meta=meta
        )


def _note_resets(resets: dict[tuple[str, str], int], outcome: Outcome, hot: tuple[str, ...]) -> None:
    """The latest reset of each hot window instance a reset's outcome names, and for a
    whole-board reset (which drops every meta too) the board's, under instance ""."""
    board = outcome.shard or outcome.event.board
    for instance, seq in (outcome.resets or {}).items():
        if instance_window(instance) in hot:
            resets[(board, instance)] = max(resets.get((board, instance), 0), seq)
    if outcome.event.member != WHOLE_BOARD:
        return
    # the reset's seq: its own when applied now (a board with no window period left still drops
    # its meta); a redelivered one's, the oldest mark Redis remembers of its instances (its own
    # unless every instance was reset again since)
    if outcome.status is Status.APPLIED:
        seq = outcome.seq
    elif outcome.resets:
        seq = min(outcome.resets.values())
    else:
        return
    resets[(board, "")] = max(resets.get((board, ""), 0), seq)
