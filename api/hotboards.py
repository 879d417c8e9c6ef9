"""Hot boards: replay update_cache into memory before the node reports ready, then follow it.

A thread owns the Kafka consumer (confluent-kafka is blocking; the API is asyncio). Replay:
read each hot board's seq from Redis, record the end offsets of their partitions, load every
record into dicts, and when each partition reached its recorded end *and* each board's marker
reached its seq, build the sorted structures once and flip to ready. After that the thread
hands decoded records to the event loop, which applies them: the loop is the only writer
while it serves reads, so a read never sees a half-applied update.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition

from api import promoted
from api.hotmeta import HotMeta
from api.hotwindow import HotWindow
from api.readrates import ReadRates
from common.boards import BoardsConfig, BoardType, Order
from common.cache_records import (
    CHUNK_V2,
    CHUNK_V3,
    STATE_V2,
    V2_SEQ,
    V2_STATE,
    Kind,
    Record,
    chunk_parts,
    decode,
    decode_chunk,
    deleted_key,
    partition_for,
)
from common.clients import kafka_consumer, redis_client
from common.clock import Clock, system_ms
from common.errors import InfrastructureError
from common.kafka_types import consume_available
from common.league import is_division, season_instance_of
from common.periods import expire_at_ms, parse_period
from common.settings import Settings
from common.store.encoding import tie_mode
from common.store.keys import TOTAL_INSTANCE, BoardKeys
from common.store.shards import board_of, index_of, shard_names
from common.store.topology import Store

_log = logging.getLogger(__name__)
BATCH = 10_000
SWEEP_MS = 60_000
REFUSED_S = 60.0  # a board that could not be made hot by itself is not tried again for this long
BEHIND_S = 10.0  # a board made hot by itself whose memory has not reached the seq Redis had then leaves


@dataclass
class HotBoard:
    board: str
    windows: tuple[str, ...]
    desc: bool
    mode: Any
    shards: int = 1  # a sharded board: its records come from each shard, with that shard's seqs
    instances: dict[str, HotWindow] = field(default_factory=dict)
    meta: HotMeta = field(init=False)
    # per name in Redis (the board's own, or each shard's): the newest seq memory reflects
    # (records and markers), the newest marker (every change up to it is in memory), and
    # Redis' seq when replay started
    seqs: dict[str, int] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)
    targets: dict[str, int] = field(default_factory=dict)
    replayed: int = 0
    ready: bool = False
    version: int = 0  # bumped by every change to memory (an older record can change it too)
    # its names in Redis: records of another shard count's (left from before `rankstream
    # reshard-board`, until compaction drops them) are not this board's
    names: frozenset[str] = field(init=False)
    shard_names: tuple[str, ...] = field(init=False)  # the same, shard 0 first
    # while replaying: window by its instance as a record key spells it, and per name the newest
    # seq staged (big-endian bytes) (`stage`: a format-2 state's fast path)
    _staging: dict[bytes, HotWindow] = field(init=False, default_factory=dict)
    _staged_seqs: dict[bytes, bytes] = field(init=False, default_factory=dict)
    # per shard: the seq up to which the whole board was emptied (a window created later too)
    floors: list[int] = field(init=False)
    # a board the node made hot by itself (api/promoted.py): per periodic window, the start of
    # the first period memory holds (older ones are read from Redis); None: every period
    since: dict[str, int] | None = None

    @classmethod
    def of(cls, board: str, windows: tuple[str, ...], board_type: BoardType) -> HotBoard:
        """An empty board of this type, holding these windows."""
        return cls(board, windows, board_type.order is Order.DESC, tie_mode(board_type), board_type.shards)

    def __post_init__(self) -> None:
        self.shard_names = shard_names(self.board, self.shards)
        self.names = frozenset(self.shard_names)
        self.meta = HotMeta(self.shards)
        self.floors = [-1] * self.shards

    @property
    def seq(self) -> int:
        """The board's seq memory reflects: a sharded board's is the sum of its shards'."""
        if self._staged_seqs:
            self._fold_staged_seqs()
        return sum(self.seqs.values())

    def settled_seqs(self) -> list[int] | None:
        """Each shard's seq (shard 0 first) while memory stands between two of the board's
        batches (each shard's newest marker is its newest seq: memory holds exactly what Redis
        held at those seqs); None in the middle of a batch."""
        if self._staged_seqs:
            self._fold_staged_seqs()
        seqs = [self.seqs.get(name, 0) for name in self.shard_names]
        markers = [self.markers.get(name, 0) for name in self.shard_names]
        return seqs if seqs == markers else None

    def _fold_staged_seqs(self) -> None:
        for name, seq in self._staged_seqs.items():
            self.seqs[name.decode()] = max(self.seqs.get(name.decode(), 0), int.from_bytes(seq))
        self._staged_seqs.clear()

    def stage(self, name: bytes, instance: bytes, member: bytes, state: bytes) -> None:
        """While replaying: a format-2 state record (split key and value), the bulk of a replay,
        without decoding it (`apply` takes every other record)."""
        self.replayed += 1
        window = self._staged_window(name, instance, state[V2_SEQ])
        if window.loading:
            window.stage(member, state)
        else:  # a window built while the board loads: rare (a sweep dropped an instance)
            _, at, score, tie = V2_STATE.unpack(state)
            window.put(member.decode(), score, tie, at)

    def stage_chunk(self, name: bytes, instance: bytes, chunk: bytes) -> None:
        """While replaying: a backfill's chunk (common/cache_records.py): each member's state
        staged, and its meta (or its having none) taken as a format-1 record's."""
        seq, states, members, metas = chunk_parts(chunk)
        self.replayed += len(states)
        window = self._staged_window(name, instance, seq.to_bytes(8))
        if not window.loading:  # rare (a sweep dropped an instance): as records
            for record in decode_chunk(name + b"\0" + instance + b"\0\0", chunk):
                self.apply(record)
            return
        stage, meta = window.stage, self.meta
        for member, state, held in zip(members, states, metas, strict=True):
            # a chunk's member says what its meta is, none too: taken where there is one or
            # memory holds one (meta.held is re-read: a reset replaces it)
            if stage(member, state) and (held or member in meta.held):
                meta.take(member.decode(), seq, held or None, self._newer)

    def _staged_window(self, name: bytes, instance: bytes, seq: bytes) -> HotWindow:
        """The window a staged record goes to, the name's newest staged seq (8 bytes, big-endian)
        raised to `seq`."""
        if seq > self._staged_seqs.get(name, b""):
            self._staged_seqs[name] = seq
        window = self._staging.get(instance)
        if window is None:
            window = self._staging[instance] = self.window(instance.decode())
        return window

    def finish_loading(self) -> None:
        self._fold_staged_seqs()
        self._staging.clear()
        for window in self.instances.values():
            window.finish_loading()
        self.ready = True

    @property
    def marker(self) -> int:
        """The board's newest marker (a sharded board's: the sum, once every shard has one)."""
        if len(self.markers) < self.shards:
            return -1
        return sum(self.markers.values())

    @property
    def target(self) -> int:
        return sum(self.targets.values())

    def caught_up(self) -> bool:
        """Each shard's marker reached the seq Redis had when replay started."""
        return all(self.markers.get(name, -1) >= seq for name, seq in self.targets.items() if seq > 0)

    def serves(self, window: str, period_start_ms: int) -> bool:
        """Whether memory holds the period of `window` starting at `period_start_ms` (0: total)."""
        since = self.since
        return since is None or period_start_ms >= since.get(window, 0)

    def members(self) -> int:
        return sum(len(window) for window in self.instances.values())

    def window(self, instance: str) -> HotWindow:
        found = self.instances.get(instance)
        if found is None:
            found = HotWindow(self.desc, self.mode, self.shards)
            found.loading = not self.ready
            for shard, seq in enumerate(self.floors):  # the board was emptied up to there
                if seq >= 0:
                    found.reset(seq, shard)
            self.instances[instance] = found
        return found

    def apply(self, record: Record) -> None:
        name = record.board
        if name not in self.names:
            return
        self.replayed += 1
        if record.kind is Kind.GONE:  # a deleted key: a board moved back to a count it had had
            self._gone(record)
            return
        self.seqs[name] = max(self.seqs.get(name, 0), record.seq)
        if not record.instance:  # a marker, a member's meta or a reset of the whole board
            self._board_level(record)
            return
        window = self.window(record.instance)
        if record.kind is Kind.RESET:
            if window.reset(record.seq, index_of(name)):
                self.version += 1
                if record.version == 1:
                    self._drop_orphan_meta()
            return
        if record.kind is Kind.DELETED:
            changed = window.delete(record.member, record.seq)
        else:
            changed = window.put(record.member, record.score, record.tie_ms, record.seq)
        if changed:
            self.version += 1
            # a format-1 member record carries the board's meta of the member (Redis' own)
            if record.version == 1 and (record.meta or record.member in self.meta):
                self.meta.take(record.member, record.seq, record.meta, self._newer)

    def _board_level(self, record: Record) -> None:
        name = record.board
        if record.kind is Kind.MARKER:
            if record.seq > self.markers.get(name, -1):  # answers' seq, and whether memory is
                self.markers[name] = record.seq  # settled (api/routes.py ETags), move with it
                self.version += 1
        elif record.kind is Kind.META:
            if self.meta.claim(record.member, record.seq, record.meta):
                self.version += 1
        elif record.seq > self.floors[shard := index_of(name)]:  # the whole board's reset
            self.floors[shard] = record.seq
            self.meta.reset(record.seq, shard)
            for window in self.instances.values():
                window.reset(record.seq, shard)
            self.version += 1

    def _gone(self, record: Record) -> None:
        """What a deleted key held is void: a marker's, or a member's state or delete (its key's
        records come before the deletion, the new layout's after)."""
        if not record.instance:
            if not record.member:
                self.markers.pop(record.board, None)
            elif self.meta.forget(record.member):
                self.version += 1
            return
        window = self.instances.get(record.instance)
        if record.member and window is not None and window.forget(record.member):
            self.version += 1

    def _newer(self, member: str, seq: int) -> bool:
        """Whether some window holds a state or a delete of the member newer than `seq`."""
        return any(window.member_seq(member) > seq for window in self.instances.values())

    def _drop_orphan_meta(self) -> None:
        windows = list(self.instances.values())
        self.meta.keep_only(lambda member: any(member in window for window in windows))

    def progress(self, started: float) -> dict[str, object]:
        return {
            "records_replayed": self.replayed,
            "target_seq": self.target,
            "seq": self.seq,
            "marker": self.marker,
            "ready": self.ready,
            "elapsed_s": round(time.monotonic() - started, 3),
        }


class HotBoards:
    def __init__(self, settings: Settings, boards: BoardsConfig, clock: Clock = system_ms) -> None:
        self._settings = settings
        self._clock = clock
        self._next_sweep = 0  # when periods past retention are next dropped from every board
        self._config = boards
        self.boards: dict[str, HotBoard] = {}
        for hot in boards.hot:
            board_type = boards.type_for(hot.board.split(":", 1)[0])
            assert board_type is not None  # the config loader checked it
            self.boards[hot.board] = HotBoard.of(hot.board, hot.windows, board_type)
        # every name in Redis of a hot board (each shard's), as record keys spell it
        self._by_name = {name.encode(): hot for hot in self.boards.values() for name in hot.names}
        self.ready = not self.boards
        # boards made hot by themselves (api/promoted.py): the loop's view (loading or in memory)
        # and the thread's (being loaded, kept in memory), what the loop asks of the thread, and
        # the boards not to try again before a time
        self.rates = ReadRates(
            settings.hot_promote_reads_per_s, settings.hot_idle_s, settings.hot_promote_max_boards
        )
        self.promoting = settings.hot_promote_reads_per_s > 0
        self.promoted: set[str] = set()
        self.refused: dict[str, float] = {}
        self.promotions = 0
        self.demotions: Counter[str] = Counter()
        self.on_promoted: list[Callable[[str], None]] = []  # as a board starts being served from memory
        self.on_change: list[Callable[[str], None]] = []  # a board in memory changed (api/live.py)
        self._requests: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._seen_seqs: dict[str, deque[tuple[float, int]]] = {}  # (when, Redis' seq) per promoted board
        self._loading: dict[str, promoted.Loading] = {}
        self._kept: dict[str, promoted.Kept] = {}
        self._partitions = 0
        self._pinned = frozenset(self.boards)  # the config's: the thread's own copy
        self._sampled = time.monotonic()
        self.reached_ends = False
        self.started = time.monotonic()
        self.ready_after_s: float | None = 0.0 if self.ready else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: str | None = None
        if self.boards or self.promoting:
            self._consumer().close()  # a bad RANKSTREAM_KAFKA_* setting stops the node now, in one line

    def hot_window(self, board: str, window: str) -> HotBoard | None:
        hot = self.boards.get(board)
        return hot if hot is not None and window in hot.windows else None

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.boards and not self.promoting:
            return
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hot-boards", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to end: it checks between its Kafka and Redis calls (see `stop`)."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the thread, waiting for it at most `timeout` seconds (at shutdown: what is left of
        the deadline). False if it is still blocked in a Kafka or Redis call (an unreachable broker
        holds list_topics up to 10 s): it is a daemon thread, so the process exits without it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(timeout, 0.0))
        return not self.running

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _consumer(self) -> Consumer:
        return kafka_consumer(
            self._settings,
            {
                "group.id": f"rankstream-api-{uuid.uuid4().hex[:8]}",  # never joins or commits
                "enable.auto.commit": False,
                # workers write update_cache in transactions: read only committed records, and
                # the end offsets recorded at start are then last stable offsets (an open
                # transaction of a killed worker can't hold readiness back)
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
            },
            defaults={"fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760},
        )

    def _targets(self) -> None:
        client = redis_client(self._settings)  # a thread of its own: not the event loop's pipe
        try:
            for hot in self.boards.values():
                names = shard_names(hot.board, hot.shards)
                seqs = [client.get(BoardKeys(self._settings.key_prefix, name).seq) for name in names]
                hot.targets = {name: int(seq or 0) for name, seq in zip(names, seqs, strict=True)}
        finally:
            client.close()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._replay_and_follow()
            except Exception as exc:  # noqa: BLE001 - Kafka/Redis trouble: retry, stay unready
                self.error = str(exc)
                _log.warning("hot-board replay failed, retrying", extra={"error": str(exc)})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10)
            else:
                return

    def _replay_and_follow(self) -> None:
        self._targets()
        consumer = self._consumer()
        topic = self._settings.topic_cache
        try:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise InfrastructureError(f"topic {topic} is missing: run `rankstream topics`")
            count = len(meta.partitions)
            wanted = sorted({partition_for(board, count) for board in self.boards})
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in wanted
            }
            self._partitions = count
            consumer.assign([TopicPartition(topic, p, -2) for p in wanted])  # -2: the beginning
            _log.info("hot-board replay started", extra={"boards": list(self.boards), "partitions": wanted})
            while not self._stop.is_set() and not self.ready:
                self._apply_batch(consumer.consume(BATCH, 0.05))  # replay: full batches win
                if self._caught_up(consumer, topic, ends):
                    self._finish()
            self._follow(consumer, set(wanted))
        finally:
            consumer.close()

    def _follow(self, consumer: Consumer, assigned: set[int]) -> None:
        """Hand each record to the event loop (or, of a board being loaded, apply it here), and
        between reads: load the boards the loop asked for, renew their registrations."""
        client = redis_client(self._settings) if self.promoting else None
        try:
            while not self._stop.is_set():
                if client is not None:
                    self._serve_requests(consumer, assigned, client)
                    self._load(client)
                    self._renew(client)
                records = self._decode(consume_available(consumer, BATCH, 0.0 if self._loading else 0.1))
                if self._loading:
                    records = self._route(records)
                if records and self._loop is not None:
                    self._loop.call_soon_threadsafe(self._apply_live, records)
                if self._loading:
                    self._finish_loaded()
        finally:
            if client is not None:
                client.close()

    # --- boards made hot by themselves: the thread's side (api/promoted.py) ---------------------
    def _serve_requests(self, consumer: Consumer, assigned: set[int], client: Store) -> None:
        while True:
            try:
                kind, board = self._requests.get_nowait()
            except queue.Empty:
                return
            if kind == "drop":
                self._loading.pop(board, None)
                self._kept.pop(board, None)
                self._unfollow(consumer, assigned, board)
            elif board not in self._loading and board not in self._kept:
                try:
                    self._begin(consumer, assigned, client, board)
                except (redis.RedisError, KafkaException) as exc:
                    _log.warning("could not make a board hot", extra={"board": board, "error": str(exc)})
                    self._post(self._refuse, board)

    def _begin(self, consumer: Consumer, assigned: set[int], client: Store, board: str) -> None:
        board_type = self._config.type_for(board.split(":", 1)[0])
        if board_type is None:  # a board nobody configured (read anyway: it answers empty)
            self._post(self._refuse, board)
            return
        partition = partition_for(board, self._partitions)
        if partition not in assigned:  # from where it ends now: what is written after counts
            topic = self._settings.topic_cache
            end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
            consumer.incremental_assign([TopicPartition(topic, partition, end)])
            assigned.add(partition)
        hot = HotBoard.of(board, tuple(w.name for w in board_type.promotable_windows()), board_type)
        self._loading[board] = promoted.start(
            client, self._config, self._settings.key_prefix, hot,
            now_ms=self._clock(), skew_s=self._settings.max_future_skew_s,
        )  # fmt: skip
        _log.info("loading a board read often", extra={"board": board})

    def _unfollow(self, consumer: Consumer, assigned: set[int], board: str) -> None:
        """Stop reading the board's partition if no board in memory or being loaded needs it."""
        partition = partition_for(board, self._partitions)
        needed = {*self._pinned, *self._loading, *self._kept} - {board}  # (self.boards is the loop's)
        if partition in assigned and all(partition_for(b, self._partitions) != partition for b in needed):
            consumer.incremental_unassign([TopicPartition(self._settings.topic_cache, partition)])
            assigned.discard(partition)

    def _load(self, client: Store) -> None:
        for board, loading in list(self._loading.items()):
            if loading.scanned:
                continue
            try:
                if promoted.step(loading, self._settings.hot_promote_max_members):
                    promoted.targets(client, self._settings.key_prefix, loading)
            except (redis.RedisError, promoted.TooBig) as exc:
                _log.warning("could not make a board hot", extra={"board": board, "error": str(exc)})
                del self._loading[board]
                self._post(self._refuse, board)

    def _route(self, records: list[Record]) -> list[Record]:
        """Apply the records of boards being loaded; the rest, for the event loop."""
        live: list[Record] = []
        for record in records:
            loading = self._loading.get(board_of(record.board))
            if loading is None:
                live.append(record)
            else:
                loading.hot.apply(record)
        return live

    def _finish_loaded(self) -> None:
        for board, loading in list(self._loading.items()):
            hot = loading.hot
            if loading.scanned and hot.caught_up():
                self._drop_expired(hot)
                hot.finish_loading()
                del self._loading[board]
                now = time.monotonic()
                self._kept[board] = promoted.Kept(loading.tokens, now, now + promoted.KEEP_ALIVE_S)
                self._post(self._activate, hot)

    def _renew(self, client: Store) -> None:
        now = time.monotonic()
        for board, kept in list(self._kept.items()):
            if kept.due > now:
                continue
            kept.due = now + promoted.KEEP_ALIVE_S
            try:
                alive = promoted.renew(client, self._settings.key_prefix, kept)
            except redis.RedisError as exc:
                if now - kept.renewed < promoted.UNCONFIRMED_S:
                    continue
                _log.warning(
                    "a board's registration could not be renewed", extra={"board": board, "error": str(exc)}
                )
                alive = False
            if alive:
                kept.renewed = now
            else:
                del self._kept[board]
                self._post(self._deactivate, board, "lapsed")

    def _post(self, action: Any, *args: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(action, *args)

    # --- boards made hot by themselves: the event loop's side -----------------------------------
    def tick(self) -> None:
        """Once a second: the boards to make hot, and those idle enough to drop."""
        if not self.promoting:
            return
        now = time.monotonic()
        elapsed, self._sampled = now - self._sampled, now
        wanted, idle = self.rates.sample(elapsed, set(self.boards) - self.promoted, self.promoted)
        for board in idle:
            self._deactivate(board, "idle")
        for board in wanted:
            if self.refused.get(board, 0.0) > now:
                continue
            self.refused.pop(board, None)
            self.promoted.add(board)
            self._requests.put(("promote", board))

    def checked(self, board: str, redis_seq: int) -> None:
        """Redis' seq of a board, read now. A board made hot by itself must reflect it within
        BEHIND_S (every write to it is published with a marker); one that does not is written
        unpublished (by a worker of an earlier release, say): it leaves memory, and is not made
        hot again for REFUSED_S."""
        hot = self.boards.get(board)
        if hot is None or hot.since is None:
            return
        now = time.monotonic()
        seen = self._seen_seqs.setdefault(board, deque())
        seen.append((now, redis_seq))
        while seen and now - seen[0][0] >= BEHIND_S:
            _, seq = seen.popleft()
            if hot.marker < seq:
                _log.warning("a board made hot by itself fell behind Redis: read from Redis again",
                             extra={"board": board, "seq": seq, "marker": hot.marker})  # fmt: skip
                self._deactivate(board, "behind")
                self._refuse(board)
                return

    def _activate(self, hot: HotBoard) -> None:
        if hot.board not in self.promoted:  # dropped while it loaded
            self._requests.put(("drop", hot.board))
            return
        self.boards[hot.board] = hot
        self.rates.promoted_now(hot.board)
        self.promotions += 1
        for action in self.on_promoted:
            action(hot.board)
        _log.info(
            "a board read often is served from memory", extra={"board": hot.board, "members": hot.members()}
        )

    def _deactivate(self, board: str, reason: str) -> None:
        if board not in self.promoted:
            return
        self.promoted.discard(board)
        self._seen_seqs.pop(board, None)
        if self.boards.pop(board, None) is not None:
            self.demotions[reason] += 1
            _log.info("a board made hot by itself left memory", extra={"board": board, "reason": reason})
        self._requests.put(("drop", board))

    def _refuse(self, board: str) -> None:
        self.promoted.discard(board)
        self.refused[board] = time.monotonic() + REFUSED_S
        if len(self.refused) > 10_000:
            self.refused.clear()

    def _decode(self, messages: list[Any]) -> list[Record]:
        records: list[Record] = []
        for message in messages:
            if message.error() is not None:
                continue
            key, value = message.key(), message.value()
            if value is None:
                gone = deleted_key(key)
                if gone is not None:
                    records.append(gone)
            elif value[0] in (CHUNK_V2, CHUNK_V3):  # (v3: a league division's)
                records += decode_chunk(key, value)
            else:
                records.append(decode(key, value))
        return records

    def _apply_batch(self, messages: list[Any]) -> None:
        """Replay: format-2 states and chunks go to their board undecoded (`HotBoard.stage`,
        `stage_chunk`), the rest as records, all in offset order (a deleted key voids what came
        before it, not what came after)."""
        by_name = self._by_name
        for message in messages:
            value = message.value()
            if value is not None and message.error() is None:
                if value[0] == STATE_V2:
                    name, instance, member = message.key().split(b"\0")
                    hot = by_name.get(name)
                    if hot is not None:
                        hot.stage(name, instance, member, value)
                    continue
                if value[0] == CHUNK_V2:
                    name, instance, _, _ = message.key().split(b"\0")
                    hot = by_name.get(name)
                    if hot is not None:
                        hot.stage_chunk(name, instance, value)
                    continue
            for record in self._decode([message]):
                hot = self.boards.get(board_of(record.board))
                if hot is not None:
                    hot.apply(record)

    def _caught_up(self, consumer: Consumer, topic: str, ends: dict[int, int]) -> bool:
        positions = consumer.position([TopicPartition(topic, p) for p in ends])
        reached = all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions)
        self.reached_ends = reached  # read what the topic held at start (boards may await a marker)
        return reached and all(hot.caught_up() for hot in self.boards.values())

    def _finish(self) -> None:
        for hot in self.boards.values():
            self._drop_expired(hot)
            hot.finish_loading()
        self.ready_after_s = time.monotonic() - self.started
        self.ready = True
        members = sum(len(w) for hot in self.boards.values() for w in hot.instances.values())
        _log.info("hot boards ready", extra={"seconds": round(self.ready_after_s, 3), "members": members})

    def _apply_live(self, records: list[Record]) -> None:
        touched: set[str] = set()
        for record in records:
            hot = self.boards.get(board_of(record.board))
            if hot is not None:
                # (a league's new division is no new period: the minute's sweep sees it)
                new_instance = (
                    record.instance
                    and record.instance not in hot.instances
                    and not is_division(record.instance)
                )
                hot.apply(record)
                touched.add(hot.board)
                if new_instance:
                    self._drop_expired(hot)  # a new period began: old ones past retention go
        for board in touched:
            for listener in self.on_change:
                listener(board)
        if self._clock() >= self._next_sweep:  # and, a minute apart, on boards where none begins
            self._next_sweep = self._clock() + SWEEP_MS
            for hot in self.boards.values():
                self._drop_expired(hot)

    def _drop_expired(self, hot: HotBoard) -> None:
        board_type = self._config.type_for(hot.board.split(":", 1)[0])
        assert board_type is not None
        now, tz = self._clock(), self._config.timezone
        for instance in list(hot.instances):
            if instance == TOTAL_INSTANCE:
                continue
            name, period_id = season_instance_of(instance).split(":", 1)  # (a league's division)
            try:
                window = board_type.window(name)
                period = parse_period(window, period_id, tz)
            except (KeyError, ValueError):  # a window or season the config no longer has
                del hot.instances[instance]
                continue
            if expire_at_ms(window, period, board_type.retention[name], tz) <= now:
                del hot.instances[instance]

    def status(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "ready_after_s": self.ready_after_s,
            "error": None if self.ready else self.error,
            "boards": {board: hot.progress(self.started) for board, hot in self.boards.items()},
        }
