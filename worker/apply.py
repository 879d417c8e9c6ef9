"""Applies validated events to Redis: one apply.lua call per board chunk, all chunks of a
batch in one pipelined round trip. Each event carries its position (source partition, offset,
array index) for the board's offset fence, and its id fingerprint for the id window. An erase or
reset (common/control.py) gets a call of its own, holding every instance it touches."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from common.boards import BoardsConfig, BoardType, Window, WindowKind
from common.control import parse_selector
from common.errors import InfrastructureError
from common.events import CONTROL_OPS, Op, UpdateEvent, ts_ceiling
from common.idwindow import LISTPACK_CAP, fingerprint
from common.league import seat_instance
from common.periods import (
    Period,
    PeriodCache,
    expire_at_ms,
    no_period_span,
    parse_period,
    previous_period,
    recent_periods,
)
from common.results import result_due_ms, result_key
from common.store import shardcount
from common.store.apply import (
    CLOSED_OP,
    DERIVED,
    SLOT_LOST,
    UNREPORTED,
    ApplyEvent,
    ApplyReply,
    ApplyRequest,
    ApplyScript,
    FenceSource,
    ForeignEpoch,
    Instance,
    PromotionChanged,
)
from common.store.encoding import MemberState, Status, tie_mode, window_packing
from common.store.keys import (
    TOTAL_INSTANCE,
    BoardKeys,
    results_due,
    rolling_boards,
    rolling_due,
    window_instance,
)
from common.store.shards import shard_names, shard_of
from common.store.slotmarks import mark_of
from common.store.topology import Store
from common.windows import MAX_INSTANCES_PER_CALL as WINDOW_INSTANCES_PER_CALL
from common.windows import SEASON_WINDOW
from worker.boardstate import DEFAULT_MAX_CELLS, BoardStates, decidable
from worker.faults import is_infrastructure
from worker.promotions import Promotions
from worker.rolling_slots import RollingSlots, results_of, unit_window
from worker.seats import Seats, Wanted, division, season_of

_log = logging.getLogger(__name__)
MAX_EVENTS_PER_CALL = 500  # bounds the time one script blocks Redis
# A board with rolling windows writes more instances per event, on boards that grow to millions:
# its apply.lua calls hold at most this many (event, instance) counts, ~0.5-0.9 ms of Redis on a
# million-member board (docs/internals/rolling-windows.md), so no call blocks Redis for a millisecond
ROLLING_COUNTS_PER_CALL = 48
# ... and the chunks the worker decides at most this many: a transaction's commands cost Redis a
# fraction of the script's per count, and each chunk costs round trips and a transaction's own
# commands (at 48 counts a chunk, Redis spent ~17 us more a rolling event than at 480: bench
# rolling's cost workload, 30k members). A chunk that goes to apply.lua after all is cut into
# calls of ROLLING_COUNTS_PER_CALL (Applier._pieces).
DECIDED_ROLLING_COUNTS_PER_CALL = 192
# the window mask is a Lua double: 53 exact bits (control ops excepted; common/windows.py)
MAX_INSTANCES_PER_CALL = WINDOW_INSTANCES_PER_CALL
# A league board's events spread over its divisions, each an instance: the chunks the worker
# decides (no mask to fit in a Lua double) hold this many instances at most, so a batch's events
# go in one transaction rather than one per 53 instances (~10x the transactions, and the id
# window's writes cut as thin); one that goes to apply.lua after all is cut into its calls
# (Applier._pieces)
DECIDED_INSTANCES_PER_CALL = 1024
PROMOTION_TRIES = 3  # calls a board's changing registration may refuse before the batch goes again


@dataclass(frozen=True, slots=True)
class Source:
    """A partition events come from, as the fences know it."""

    topic: str
    partition: int
    topic_id: str  # a recreated topic has a new id: its fences start over
    low_water: int  # the last offset committed (-1: none): rejections at or below it are forgotten

    @property
    def field(self) -> str:
        return f"{self.topic}:{self.partition}"


@dataclass(frozen=True, slots=True)
class Position:
    """Where an event sits in the stream: its message's source and offset, its array index."""

    source: Source
    offset: int
    index: int | None  # None: the message is one object


class EarlierFailure(Exception):
    """A redelivered event whose first delivery raised `original_class` (the fence remembers)."""

    def __init__(self, original_class: str) -> None:
        super().__init__(f"processing raised {original_class} when this event was first delivered")
        self.original_class = original_class


class PromotionUnsettled(InfrastructureError):
    """A board's registration by API nodes changed on each of PROMOTION_TRIES calls."""


class EpochMismatch(InfrastructureError):
    """A board's fence was written in another epoch of the Redis data set than the worker's."""

    def __init__(self, board: str, found: str, expected: str) -> None:
        if found == SLOT_LOST:
            why = f"board {board} has no fence and its slot's mark is gone: its Redis shard lost its data"
        else:
            why = f"board {board} was written in epoch {found}, Redis' epoch is {expected}"
        super().__init__(why)
        self.board = board


class Outcome(NamedTuple):  # one per event: a tuple is the cheapest immutable record
    event: UpdateEvent
    status: Status
    seq: int
    # instance -> state after the event (None: absent); only filled for hot boards
    states: dict[str, MemberState | None]
    # windows skipped because their period closed beyond late_grace, or its result was sealed
    late_windows: int
    meta: bytes | None = None  # the member's meta after the event; only filled for hot boards
    failed_as: str | None = None  # FAILED: the error class its first delivery raised
    # a RESET on a hot board: instance -> the seq of its latest reset (this one, or for a
    # redelivery the one Redis remembers), what hot nodes empty their memory of it up to
    resets: dict[str, int] | None = None
    shard: str = ""  # on a sharded board: the shard it was applied on (its name in Redis)
    also: tuple[Outcome, ...] = ()  # a sharded board's reset: its outcomes on the other shards


_FOREVER = 2**62
_SEATING = frozenset({Op.INCR, Op.SET, Op.BEST})  # the ops that seat a member in a league season


class _Slot(NamedTuple):
    instance: Instance
    late_after: int  # ms: from then on the instance takes no event
    period: Period | None  # its period, when the type emits the window's results (else None)
    window: str
    # ms: before then it takes no event either: a league's season, until it begins by the clock
    # (its first seat seals the season before it: docs/leagues.md)
    opens_at: int = 0


@dataclass(frozen=True, slots=True)
class _Slots:
    start_ms: int  # valid for event times in [start_ms, end_ms)
    end_ms: int
    slots: list[_Slot]


class _Counted(NamedTuple):
    pairs: list[Instance]  # the instances an event counts in
    deps: tuple[Instance, ...]  # in its call too: what its derived rolling periods read
    late: int  # windows it missed because their period closed beyond late_grace
    # its board's marks for worker/rolling.py: ("due", unit, bucket): a next period to prepare in
    # that bucket; ("board", window, bucket): the newest bucket holding an event (a catch-up's list)
    dues: tuple[tuple[str, str, Period], ...]
    # for worker/results.py: ("result", window, period), a period whose result it makes due
    results: tuple[tuple[str, str, Period], ...] = ()


class _Taking(NamedTuple):
    slots: _Slots
    instances: list[Instance]  # those still taking events now
    late: int  # how many no longer do
    dues: tuple[tuple[str, str, Period], ...]  # ("result", window, period) of those taking events


@dataclass
class _Memo:
    """Per batch (`now` is fixed in it): events sharing their periods share their lists."""

    slots: dict[int, _Taking] = field(default_factory=dict)
    rolling: dict[tuple[int, str, tuple[str, ...]], _Counted] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failure:
    """An event whose processing raised something other than an infrastructure fault."""

    event: UpdateEvent
    error: BaseException


class _Entry(NamedTuple):
    event: UpdateEvent
    ts: int
    mask: int  # bit i: the event counts in the chunk's i-th instance
    names: tuple[str, ...]  # the instances it counts in
    late: int  # windows it missed because their period closed beyond late_grace
    position: Position | None
    closed: bool = False  # its board type's activity has ended: recorded, dead-lettered
    wide: bool = False  # a delete on a board with rolling windows: alone, every instance of its call
    join: int = 0  # its member's seat order in a league division among its instances (worker/seats.py)


@dataclass
class _Chunk:
    """The events of one board that go into one apply.lua call."""

    board: str
    board_type: BoardType
    # an erase or reset: alone in its call, which holds every instance it touches (more than
    # MAX_INSTANCES_PER_CALL may be: apply.lua ignores a control op's mask)
    control: bool = False
    rolling_counts: int = ROLLING_COUNTS_PER_CALL  # at most, on a board with rolling windows
    max_instances: int = MAX_INSTANCES_PER_CALL
    instances: dict[str, tuple[int, Instance]] = field(default_factory=dict)  # name -> (bit, instance)
    events: list[_Entry] = field(default_factory=list)
    counts: int = 0  # (event, instance) pairs: the instances each event counts in, summed
    sources: dict[str, tuple[int, Source]] = field(default_factory=dict)  # field -> (number, source)
    # id(pairs) -> (pairs, mask, names): consecutive events share one `pairs` list (Applier's
    # memo), so their mask is computed once; holding `pairs` keeps its id from being reused
    _masks: dict[int, tuple[list[Instance], int, tuple[str, ...]]] = field(default_factory=dict)

    def fits(self, pairs: list[Instance], control: bool = False, deps: Sequence[Instance] = ()) -> bool:
        if self.control or control or len(self.events) >= MAX_EVENTS_PER_CALL:
            return False
        if self.board_type.rolling and self.events and self.counts + len(pairs) > self.rolling_counts:
            return False
        if id(pairs) in self._masks:
            return True
        new = len({inst.name for inst in (*pairs, *deps) if inst.name not in self.instances})
        return len(self.instances) + new <= self.max_instances

    def add(
        self,
        event: UpdateEvent,
        ts: int,
        pairs: list[Instance],
        late: int,
        position: Position | None,
        *,
        closed: bool = False,
        deps: Sequence[Instance] = (),
        wide: bool = False,
        join: int = 0,
    ) -> None:
        known = self._masks.get(id(pairs))
        if known is None:
            mask = 0
            for inst in pairs:
                bit, _ = self.instances.setdefault(inst.name, (len(self.instances), inst))
                mask |= 1 << bit
            for inst in deps:  # in the call, not counting the event: what a derived period reads
                self.instances.setdefault(inst.name, (len(self.instances), inst))
            known = self._masks[id(pairs)] = (pairs, mask, tuple(inst.name for inst in pairs))
        if position is not None:
            source = position.source
            self.sources.setdefault(source.field, (len(self.sources) + 1, source))
        self.events.append(_Entry(event, ts, known[1], known[2], late, position, closed, wide, join))
        self.counts += len(known[2])

    def instances_of(self, entry: _Entry) -> tuple[list[Instance], list[Instance]]:
        """An entry's instances here, and those its derived rolling periods read (`add`'s pairs
        and deps): to add it to another chunk of the board."""
        pairs = [self.instances[n][1] for n in entry.names]
        return pairs, [self.instances[n][1] for n in _derived_inputs(pairs) if n in self.instances]

    def add_entry(self, entry: _Entry, pairs: list[Instance], deps: Sequence[Instance]) -> None:
        """An entry of another chunk of the board, with its instances there (`instances_of`)."""
        self.add(
            entry.event, entry.ts, pairs, entry.late, entry.position, closed=entry.closed, deps=deps,
            wide=entry.wide, join=entry.join,
        )  # fmt: skip

    def where(self, position: Position | None) -> int:
        """apply.lua's `where`: source number * 1000 + array index + 1 (0: no position)."""
        if position is None:
            return 0
        number, _ = self.sources[position.source.field]
        return number * 1000 + (0 if position.index is None else position.index + 1)


class Applier:
    """Turns events into apply.lua calls. `now_ms` decides which periods are closed."""

    def __init__(
        self,
        client: Store,
        boards: BoardsConfig,
        key_prefix: str,
        id_window_s: int,
        *,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        epoch: str = "unmanaged",
        state_cells: int = DEFAULT_MAX_CELLS,
    ) -> None:
        self._client = client
        self._boards = boards
        self._prefix = key_prefix
        self._window_s = id_window_s
        self._now_ms = now_ms
        # what worker/sources.py learns from Redis before each batch
        self._epoch = epoch  # the Redis data set's epoch, written into and checked against fences
        self.slot_marks = False  # a cluster's slots are marked: a board without a fence checks its own
        self.legacy_ttl_ms = 0  # > 0 while adopting the previous release's boards (its id records)
        self.listpack_cap = LISTPACK_CAP
        # new general window instances get a tie index; off (RANKSTREAM_TIE_INDEX) and while
        # adopting, a state hash, which workers of earlier releases also read and write
        self.tie_index = True
        # the latest accepted event time is now plus this (common/events.py): the newest period
        # an erase or reset must reach
        self.max_future_skew_s = 86_400
        self._periods = PeriodCache(boards.timezone)
        self._slot_cache: dict[str, _Slots] = {}
        self._rolling = RollingSlots(boards.timezone)
        self._registered: set[tuple[str, str, str]] = set()  # (key, board, bucket) written this process
        self._shards_recorded: set[str] = set()  # board types whose shard count this process checked
        # the boards API nodes registered, as far as this worker knows (shared with its publisher
        # and its rolling preparer: worker/main.py)
        self.promotions = Promotions(boards)
        self._script = ApplyScript()
        # the boards' state for deciding in the worker (worker/boardstate.py); None: apply.lua decides
        self.states = BoardStates(state_cells) if state_cells > 0 else None
        self.seats = Seats(key_prefix)  # league seats (worker/seats.py)
        self._leagues = any(t.league is not None for t in boards.types.values())

    @property
    def epoch(self) -> str:
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: str) -> None:
        """Another data set in Redis (worker/sources.py): what the worker kept of the old one goes."""
        if epoch != self._epoch:
            self.seats.clear()
            if self.states is not None:
                self.states.drop_all()
        self._epoch = epoch

    def _slots(self, board_type: BoardType, ts: int) -> _Slots:
        """The instances an event of `board_type` at `ts` counts in. Consecutive events share
        them until one of their periods ends, so they are computed once per period change."""
        cached = self._slot_cache.get(board_type.name)
        if cached is not None and cached.start_ms <= ts < cached.end_ms:
            return cached
        start, end = 0, _FOREVER
        slots: list[_Slot] = []
        for window in board_type.windows:
            if window.kind is WindowKind.TOTAL:
                packing = window_packing(board_type, window, 0)
                slots.append(_Slot(Instance(TOTAL_INSTANCE, 0, packing), _FOREVER, None, window.name))
            elif window.periodic and window.kind is not WindowKind.ROLLING:
                period = self._periods.at(window, ts)
                tz = self._boards.timezone
                if period is None:  # between two seasons: the window takes nothing until the next
                    gap_from, gap_until = no_period_span(window, ts, tz)
                    start, end = max(start, gap_from), min(end, gap_until)
                    continue
                expire = expire_at_ms(window, period, board_type.retention[window.name], tz)
                # a period whose keys already expired can't take the event either: PEXPIREAT in
                # the past would delete the whole period (retention 1 with a late grace did)
                late_after = min(period.end_ms + board_type.late_grace_ms, expire)
                # a period whose result is emitted may be sealed: apply.lua reads its marker, by
                # Redis' word rather than this clock's (sealed early by an emitter whose clock leads)
                emits = results_of(board_type, window)
                instance = _period_instance(board_type, window, period, expire)._replace(sealable=emits)
                # a league's season: its end emits its divisions' records (common/league_results.py)
                league = board_type.league is not None and window.kind is WindowKind.SEASON
                opens = period.start_ms if league else 0
                ends = period if emits or league else None
                slots.append(_Slot(instance, late_after, ends, window.name, opens))
                start, end = max(start, period.reuse_from), min(end, period.reuse_until)
            # rolling windows depend on the clock too: _instances
        cached = _Slots(start, end, slots)
        self._slot_cache[board_type.name] = cached
        return cached

    def _instances(self, board_type: BoardType, ts: int, now: int, memo: _Memo) -> _Counted:
        """The instances the event counts in, those its derived rolling periods read, and how
        many closed periods it missed. Events that share their periods and buckets get the same
        lists (`memo`, per batch: `now` is fixed in it)."""
        slots = self._slots(board_type, ts)
        known = memo.slots.get(id(slots))
        if known is None or known.slots is not slots:
            known = memo.slots[id(slots)] = _taking(slots, now)
        if not board_type.rolling:
            return _Counted(known.instances, (), known.late, (), known.dues)
        buckets = tuple(self._rolling.bucket_at(w, ts).id for w in board_type.rolling)
        key = (id(slots), board_type.name, buckets)
        counted = memo.rolling.get(key)
        if counted is None:
            pairs, deps, dues, results = list(known.instances), [], [], list(known.dues)
            for window in board_type.rolling:
                plan = self._rolling.for_event(board_type, window, ts, now)
                pairs += plan.counted
                deps += plan.deps
                assert window.rolling_unit is not None
                dues += [("due", window.rolling_unit, due) for due in plan.dues]
                if plan.bucket is not None:
                    dues.append(("board", window.name, plan.bucket))
                    if results_of(board_type, window):
                        held = self._rolling.holders(board_type, window, plan.bucket, now)
                        results += [("result", window.name, period) for period in held]
            counted = memo.rolling[key] = _Counted(
                pairs, tuple(deps), known.late, tuple(dues), tuple(results)
            )
        return counted

    def _wide_delete(self, board_type: BoardType, ts: int, now: int, memo: _Memo) -> list[Instance]:
        """A delete on a board with rolling windows: its calendar instances, and every period
        still taking events and every live bucket of its rolling windows."""
        counted = self._instances(board_type, ts, now, memo)
        latest = ts_ceiling(self.max_future_skew_s, now)
        rolling = [
            inst for w in board_type.rolling for inst in self._rolling.for_delete(board_type, w, now, latest)
        ]
        return [inst for inst in counted.pairs if inst.rolling is None] + rolling

    def _register(self, board_type: BoardType, board: str, dues: Sequence[tuple[str, str, Period]]) -> None:
        """Tell worker/rolling.py which boards have a next rolling period to prepare (a set per
        unit and bucket, expiring after the bucket after it), and each window's newest bucket
        holding an event of the board (GT: a late event doesn't lower it); tell worker/results.py
        which periods have a result due (NX: when is fixed). Once per process."""
        pipe = None
        added: list[tuple[str, str, str]] = []
        for kind, name, bucket in dues:
            if kind == "due":
                key, member = rolling_due(self._prefix, name, bucket.id), bucket.id
            elif kind == "board":
                key, member = rolling_boards(self._prefix, name), bucket.id
            else:
                key, member = results_due(self._prefix), result_key(board, name, bucket.id)
            if (key, board, member) in self._registered:
                continue
            added.append((key, board, member))
            if pipe is None:
                pipe = self._client.pipeline(transaction=False)
            if kind == "due":
                pipe.sadd(key, board)
                pipe.pexpireat(key, self._rolling.shift(unit_window(name), bucket, 2).start_ms)
            elif kind == "board":
                pipe.zadd(key, {board: bucket.start_ms}, gt=True)
            else:
                pipe.zadd(key, {member: result_due_ms(board_type, bucket)}, nx=True)
        if pipe is not None:
            pipe.execute()  # remembered once it is in Redis: a batch retried registers again
            if len(self._registered) > 200_000:
                self._registered.clear()
            self._registered.update(added)

    def _control_instances(self, board_type: BoardType, event: UpdateEvent, now: int) -> list[Instance]:
        """What an erase or reset touches: an erase and a whole-board reset every instance that
        may hold data now (total, and each period that has not expired and starts no later than
        the latest accepted event time), a window's reset that window's, a period's that one."""
        window_name, period_id = (None, None) if event.op is Op.ERASE else parse_selector(event.member)
        tz = self._boards.timezone
        latest = ts_ceiling(self.max_future_skew_s, now)
        out: list[Instance] = []
        for window in board_type.windows:
            if window_name is not None and window.name != window_name:
                continue
            if window.kind is WindowKind.ROLLING:
                retention = board_type.retention[window.name]
                periods = recent_periods(window, retention, now, latest, tz)
                out += self._rolling.for_control(board_type, window, periods, now, latest)
            elif window.kind is WindowKind.TOTAL:
                out.append(Instance(TOTAL_INSTANCE, 0, window_packing(board_type, window, 0)))
            elif window.periodic:
                retention = board_type.retention[window.name]
                if period_id is None:
                    periods = recent_periods(window, retention, now, latest, tz)
                else:
                    named = parse_period(window, period_id, tz)
                    periods = [(named, expire_at_ms(window, named, retention, tz))]
                out += [_period_instance(board_type, window, period, expire) for period, expire in periods]
        return out

    def _chunks(
        self,
        events: Sequence[tuple[UpdateEvent, int]],
        positions: Sequence[Position | None],
        failures: list[Failure],
        now: int,
    ) -> list[_Chunk]:
        """Board chunks in stream order; an event whose windows can't even be computed fails alone."""
        open_chunks: dict[str, _Chunk] = {}
        chunks: list[_Chunk] = []
        memo = _Memo()
        dues: dict[str, tuple[BoardType, set[tuple[str, str, Period]]]] = {}
        decided = self.states is not None
        rolling_counts = DECIDED_ROLLING_COUNTS_PER_CALL if decided else ROLLING_COUNTS_PER_CALL
        self._seat(events, now, memo)
        # events in one division share a list (keyed by their instances' list, held alive)
        divisions: dict[tuple[int, str], tuple[list[Instance], list[Instance]]] = {}
        for (event, ts), position in zip(events, positions, strict=True):
            deps: tuple[Instance, ...] = ()
            wide = False
            try:
                board_type = self._boards.type_for(event.board_type)
                assert board_type is not None  # the parser resolved it
                names = self._shards_of(board_type, event)
                control = event.op in CONTROL_OPS
                if control:  # an activity's end does not stop an erase or reset
                    closed, late = False, 0
                    pairs = self._control_instances(board_type, event, now)
                else:
                    ends = board_type.ends_at_ms
                    closed = ends is not None and (ts >= ends or now >= ends + board_type.late_grace_ms)
                    # its instances all the same: a redelivery reports the member's state there
                    counted = self._instances(board_type, ts, now, memo)
                    pairs, deps, late = counted.pairs, counted.deps, 0 if closed else counted.late
                    if counted.dues:  # the rolling preparer walks each shard of a board
                        for board in names:
                            dues.setdefault(board, (board_type, set()))[1].update(counted.dues)
                    # results due (worker/results.py), registered before the apply: by the first
                    # delivery's clock, so a retry judging them late later can't lose them (an
                    # event the script then refuses leaves a period with no member: members 0)
                    if counted.results and not closed and event.op is not Op.DELETE:
                        dues.setdefault(event.board, (board_type, set()))[1].update(counted.results)
                    wide = event.op is Op.DELETE and bool(board_type.rolling) and not closed
                    if wide:
                        pairs, deps = self._wide_delete(board_type, ts, now, memo), ()
            except Exception as exc:  # noqa: BLE001 - whatever it is, it is this event's alone
                failures.append(Failure(event, exc))
                continue
            # (Redis' answers: a fault there is the batch's, not the event's)
            pairs, join = self._in_league(board_type, event, pairs, divisions)
            if board_type.shards > 1 and board_type.name not in self._shards_recorded:
                # at its boards' first write (an unsharded type's data tells its count itself)
                shardcount.record(self._client, self._prefix, board_type.name, board_type.shards)
                self._shards_recorded.add(board_type.name)
            alone = control or wide
            for board in names:
                chunk = open_chunks.get(board)
                if chunk is None or not chunk.fits(pairs, alone, deps):
                    chunk = _Chunk(board, board_type, control=alone, rolling_counts=rolling_counts,
                                   max_instances=_max_instances(board_type, decided))  # fmt: skip
                    open_chunks[board] = chunk
                    chunks.append(chunk)
                chunk.add(event, ts, pairs, late, position, closed=closed, deps=deps, wide=wide, join=join)
        for board, (board_type, board_dues) in dues.items():
            ordered = sorted(board_dues, key=lambda due: (due[0], due[1], due[2].start_ms))
            self._register(board_type, board, ordered)
        return chunks

    def _seat(self, events: Sequence[tuple[UpdateEvent, int]], now: int, memo: _Memo) -> None:
        """Seat, in stream order, the members whose first event of a league season is in the
        batch (an incr, set or best its season still takes, on a board still open)."""
        wanted: dict[tuple[str, str], tuple[Wanted, dict[str, None]]] = {}
        for event, ts in events:
            found = self._league_season(event, ts, now, memo) if event.op in _SEATING else None
            if found is None:
                continue
            board_type, season = found
            ends = board_type.ends_at_ms
            if ends is not None and (ts >= ends or now >= ends + board_type.late_grace_ms):
                continue
            if not self.seats.seats(event.board, season.name, event.member):
                continue
            key = (event.board, season.name)
            if key not in wanted:
                wanted[key] = (self._wanted(event.board, board_type, season, ts), {})
            wanted[key][1][event.member] = None
        self.seats.take(self._client, [w._replace(members=list(members)) for w, members in wanted.values()])

    def _season_change(self, events: Sequence[tuple[UpdateEvent, int]], now: int) -> int:
        """Where a batch is cut (0: nowhere): at the first event that seats a member in a league
        season after an event of the same board counted in another of its seasons. A seat seals
        the season before its own, and the member's latest earlier one (place.lua), and every
        seat of a batch is taken before its events are applied: so every event of another
        season that comes before a seat in the stream is applied first."""
        if not self._leagues:
            return 0
        memo = _Memo()
        seen: dict[str, set[str]] = {}  # board -> the league seasons its events counted in so far
        for k, (event, ts) in enumerate(events):
            found = self._league_season(event, ts, now, memo) if event.op not in CONTROL_OPS else None
            if found is None:
                continue
            season = found[1]
            before = seen.setdefault(event.board, set())
            seats = event.op in _SEATING and self.seats.seats(event.board, season.name, event.member)
            if seats and k > 0 and before - {season.name}:
                return k
            before.add(season.name)
        return 0

    def _league_season(
        self, event: UpdateEvent, ts: int, now: int, memo: _Memo
    ) -> tuple[BoardType, Instance] | None:
        """The event's league type and the season instance it counts in; None for another type,
        a time no season takes now, or an event whose windows can't be computed (the main loop
        dead-letters it)."""
        board_type = self._boards.type_for(event.board_type)
        if board_type is None or board_type.league is None:
            return None
        try:
            season = season_of(self._instances(board_type, ts, now, memo).pairs)
        except Exception:  # noqa: BLE001 - the main loop dead-letters it
            return None
        return None if season is None else (board_type, season)

    def _wanted(self, board: str, board_type: BoardType, season: Instance, ts: int) -> Wanted:
        """A league season to seat members in, and the seasons before it still kept, newest
        first: the first is sealed by the first seat, and a returning member's tier comes from
        the latest they sat in."""
        window = board_type.window(SEASON_WINDOW)
        tz = self._boards.timezone
        retention = board_type.retention[window.name]
        period = self._periods.at(window, ts)
        earlier: list[tuple[str, int]] = []
        while period is not None and len(earlier) < retention - 1:
            period = previous_period(window, period, tz)
            if period is not None:
                expire = expire_at_ms(window, period, retention, tz)
                earlier.append((window_instance(window.name, period.id), expire))
        return Wanted(board, board_type, season, earlier, [])

    def _in_league(
        self,
        board_type: BoardType,
        event: UpdateEvent,
        pairs: list[Instance],
        memo: dict[tuple[int, str], tuple[list[Instance], list[Instance]]],
    ) -> tuple[list[Instance], int]:
        """An event of a league type counts in its member's division, not in the season (not at
        all if the member has no seat: a delete before any event of the season); and its join."""
        if board_type.league is None:
            return pairs, 0
        if event.op in CONTROL_OPS:
            return self._league_control(board_type, event, pairs), 0
        season = season_of(pairs)
        if season is None:
            return pairs, 0
        league = board_type.league
        assert league is not None
        seat = self.seats.get(event.board, season.name, event.member)
        if seat is None and event.op is Op.DELETE:
            seat = self.seats.lookup(self._client, event.board, season.name, [event.member])[0]
        name = "" if seat is None else seat_instance(league, season.name, seat)
        known = memo.get((id(pairs), name))  # (holding `pairs`: its id is not reused meanwhile)
        if known is None:
            rest = [inst for inst in pairs if inst is not season]
            known = memo[(id(pairs), name)] = (
                pairs,
                rest if seat is None else [*rest, division(league, season, seat)],
            )
        return known[1], 0 if seat is None else seat.order

    def _league_control(
        self, board_type: BoardType, event: UpdateEvent, pairs: list[Instance]
    ) -> list[Instance]:
        """An erase reaches its member's divisions, a reset every division of the seasons it
        empties (their seats stay: a division never takes more members than its size)."""
        league = board_type.league
        assert league is not None
        out: list[Instance] = []
        for inst in pairs:
            if season_of([inst]) is None:
                out.append(inst)
            elif event.op is Op.ERASE:  # (a sealed season too: an erase reaches every period)
                (seat,) = self.seats.lookup(self._client, event.board, inst.name, [event.member])
                if seat is not None:
                    out.append(division(league, inst, seat)._replace(sealable=False))
            else:
                out += self.seats.divisions(self._client, event.board, board_type, inst)
        return out

    def _shards_of(self, board_type: BoardType, event: UpdateEvent) -> tuple[str, ...]:
        """Where the event goes in Redis: its board, or on a sharded board its member's shard (a
        reset: every shard)."""
        shards = board_type.shards
        if shards == 1:
            return (event.board,)
        if event.op is Op.RESET:
            return shard_names(event.board, shards)
        return (shard_of(event.board, shards, event.member),)

    def _request(self, chunk: _Chunk, want_state: bool) -> ApplyRequest:
        keys = BoardKeys(self._prefix, chunk.board)
        board_type = chunk.board_type
        legacy = self.legacy_ttl_ms > 0
        promoted = self.promotions.believed(chunk.board)
        events = []
        for entry in chunk.events:
            event, position = entry.event, entry.position
            events.append(
                ApplyEvent(
                    # a wide delete is an erase to the script: every instance of its call
                    op=CLOSED_OP if entry.closed else (Op.ERASE.value if entry.wide else event.op.value),
                    member=event.member,
                    score=event.score,
                    tie_ms=entry.ts,
                    meta=event.meta.decode() if event.meta is not None else "",
                    # a control op reaches every instance of its call: a mask of thousands of
                    # bits would only slow (or, packed by hiredis, crash) the call
                    mask=0 if chunk.control else entry.mask,
                    offset=0 if position is None else position.offset,
                    where=chunk.where(position),
                    fingerprint=fingerprint(event.id),
                    join=entry.join,
                    legacy_key=keys.legacy_id(event.id) if legacy else "",
                )
            )
        return ApplyRequest(
            keys=keys,
            instances=[inst for _, inst in chunk.instances.values()],
            mode=tie_mode(board_type),
            desc=board_type.order.value == "desc",
            max_members=board_type.max_members or 0,
            want_state=want_state or promoted,
            promoted=promoted,
            epoch=self.epoch,
            id_window_s=self._window_s,
            listpack_cap=self.listpack_cap,
            legacy_ttl_ms=self.legacy_ttl_ms,
            sources=[FenceSource(s.field, s.topic_id, s.low_water) for _, s in chunk.sources.values()],
            events=events,
            ids=[entry.event.id for entry in chunk.events],
            score_range=board_type.score_range,
            tie_index=self.tie_index and not legacy,
            slot_mark=mark_of(keys) if self.slot_marks else "",
        )

    def apply(
        self, events: Sequence[tuple[UpdateEvent, int]], positions: Sequence[Position | None] | None = None
    ) -> list[Outcome]:
        """Apply and return the outcomes; raise the first failure (for callers that own the data)."""
        outcomes, failures = self.apply_isolated(events, positions)
        if failures:
            raise failures[0].error
        return outcomes

    def apply_isolated(
        self, events: Sequence[tuple[UpdateEvent, int]], positions: Sequence[Position | None] | None = None
    ) -> tuple[list[Outcome], list[Failure]]:
        """Apply (event, effective ts) pairs, at their stream positions (None: no fence, for
        callers outside the stream). Outcomes come back per board in stream order; failures are
        events that raised something other than an infrastructure fault (those propagate: the
        caller rewinds and retries the batch)."""
        if positions is None:
            positions = [None] * len(events)
        outcomes: list[Outcome] = []
        failures: list[Failure] = []
        start = 0
        while start < len(events):  # a league's season change cuts the batch (_season_change)
            now = self._now_ms()
            stop = start + (self._season_change(events[start:], now) or len(events) - start)
            got, failed = self._apply_part(events[start:stop], positions[start:stop], now)
            outcomes += got
            failures += failed
            start = stop
        return outcomes, failures

    def _apply_part(
        self, events: Sequence[tuple[UpdateEvent, int]], positions: Sequence[Position | None], now: int
    ) -> tuple[list[Outcome], list[Failure]]:
        """apply_isolated's work on a batch (or the part of it a season change cut off)."""
        failures: list[Failure] = []
        outcomes: list[Outcome] = []
        chunks = self._chunks(events, positions, failures, now)
        for round_ in _rounds(chunks):
            wants = [bool(self._boards.hot_windows(chunk.board)) for chunk in round_]
            requests = [self._request(c, w) for c, w in zip(round_, wants, strict=True)]
            decided = self._decided(requests)
            for k, reply in enumerate(decided):  # the board's registration changed: apply.lua's
                if isinstance(reply, PromotionChanged):
                    requests[k], decided[k] = self._learned(requests[k], reply), None
            got: list[list[Outcome]] = [[] for _ in round_]
            # what the worker did not decide goes to apply.lua, in calls it may take
            rest = [k for k, reply in enumerate(decided) if reply is None]
            pieces = {k: self._pieces(round_[k], requests[k], wants[k]) for k in rest}
            for j in range(max((len(p) for p in pieces.values()), default=0)):
                batch = [(k, p[j]) for k, p in pieces.items() if j < len(p)]
                replies = self._run([req for _, (_, req) in batch])
                for (k, (piece, _)), reply in zip(batch, replies, strict=True):
                    got[k] += self._outcomes(piece, wants[k], reply, failures)
            for k, done in enumerate(decided):
                if done is not None:
                    got[k] = self._outcomes(round_[k], wants[k], done, failures)
            for chunk_outcomes in got:
                outcomes += chunk_outcomes
        if any(c.control and c.board != c.events[0].event.board for c in chunks):
            return _one_per_event(outcomes), list({id(f.event): f for f in failures}.values())
        return outcomes, failures

    def _run(self, requests: list[ApplyRequest]) -> list[ApplyReply | Exception]:
        """apply.lua's replies; a call refused because its board's registration by an API node
        is not what it believed (worker/promotions.py) goes again, knowing it."""
        replies = self._script.run_many(self._client, requests)
        for _ in range(PROMOTION_TRIES):
            again = [i for i, reply in enumerate(replies) if isinstance(reply, PromotionChanged)]
            if not again:
                break
            for i in again:
                requests[i] = self._learned(requests[i], cast(PromotionChanged, replies[i]))
            for i, reply in zip(again, self._script.run_many(self._client, [requests[i] for i in again]),
                                strict=True):  # fmt: skip
                replies[i] = reply
        return replies

    def _learned(self, request: ApplyRequest, found: PromotionChanged) -> ApplyRequest:
        """What a refusal taught of the board's registration, and the request again knowing it
        (its states reported while the board is registered)."""
        self.promotions.learn(request.keys.board, found.promoted)
        return dataclasses.replace(
            request, promoted=found.promoted, want_state=request.want_state or found.promoted
        )

    def _outcomes(
        self, chunk: _Chunk, want: bool, reply: ApplyReply | Exception, failures: list[Failure]
    ) -> list[Outcome]:
        try:
            return _decode(chunk, want, reply, self.epoch)
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            # apply.lua writes nothing before its last decision, so a failed call left no
            # trace: re-apply its events one by one, in order, to find the bad ones
            return self._narrow(chunk, want, failures)

    def _decided(self, requests: list[ApplyRequest]) -> list[ApplyReply | Exception | None]:
        """The replies of the chunks the worker decided (worker/boardstate.py); None for the rest
        (apply.lua's: what the worker kept of their boards is stale then)."""
        results: list[ApplyReply | Exception | None] = [None] * len(requests)
        states = self.states
        if states is None:
            return results
        chosen = [i for i, req in enumerate(requests) if decidable(req)]
        for i, reply in zip(chosen, states.apply(self._client, [requests[i] for i in chosen]), strict=True):
            results[i] = reply
        for i, got in enumerate(results):
            if got is None:
                states.drop(requests[i].keys.board)
        return results

    def _pieces(self, chunk: _Chunk, request: ApplyRequest, want: bool) -> list[tuple[_Chunk, ApplyRequest]]:
        """A chunk in apply.lua's calls: itself, or one that holds more than an apply.lua call
        may (a rolling board's, past ROLLING_COUNTS_PER_CALL; a league's, past
        MAX_INSTANCES_PER_CALL divisions), cut into calls, in order."""
        rolling = chunk.board_type.rolling and chunk.counts > ROLLING_COUNTS_PER_CALL
        if chunk.control or not (rolling or len(chunk.instances) > MAX_INSTANCES_PER_CALL):
            return [(chunk, request)]
        out: list[_Chunk] = []
        for entry in chunk.events:
            pairs, deps = chunk.instances_of(entry)
            if not out or not out[-1].fits(pairs, entry.wide, deps):
                out.append(_Chunk(chunk.board, chunk.board_type, control=chunk.control))
            out[-1].add_entry(entry, pairs, deps)
        return [(piece, self._request(piece, want)) for piece in out]

    def _narrow(self, chunk: _Chunk, want: bool, failures: list[Failure]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for entry in chunk.events:
            single = _Chunk(chunk.board, chunk.board_type, control=chunk.control)
            single.add_entry(entry, *chunk.instances_of(entry))
            try:
                (reply,) = self._run([self._request(single, want)])
                outcomes += _decode(single, want, reply, self.epoch)
            except Exception as exc:
                if is_infrastructure(exc):
                    raise
                failures.append(Failure(entry.event, exc))
                try:
                    self._remember_failure(chunk, entry, type(exc).__name__)
                except Exception as marker_exc:
                    if is_infrastructure(marker_exc):
                        raise
                    # the board itself is broken (e.g. a foreign key in its place): the event is
                    # dead-lettered now; a redelivery would fail (and be dead-lettered) again
                    _log.error(
                        "could not record a failed event in its fence", extra={"error": repr(marker_exc)}
                    )
        return outcomes

    def _remember_failure(self, chunk: _Chunk, entry: _Entry, error_class: str) -> None:
        """Record in the board's fence that the event at this position failed (before any later
        event moves the fence past it), so a redelivery dead-letters it again."""
        if entry.position is None:
            return
        marker = _Chunk(chunk.board, chunk.board_type)
        failed = entry.event._replace(op=Op.FAILED_MARKER, member=error_class, meta=None)
        marker.add(failed, entry.ts, [], entry.late, entry.position)
        (reply,) = self._run([self._request(marker, False)])
        _decode(marker, False, reply, self.epoch)  # raises what the call raised


def _max_instances(board_type: BoardType, decided: bool) -> int:
    """The instances a chunk of the type holds at most: a league's more while the worker decides."""
    return DECIDED_INSTANCES_PER_CALL if decided and board_type.league is not None else MAX_INSTANCES_PER_CALL


def _taking(slots: _Slots, now: int) -> _Taking:
    """The slots' instances still taking events at `now`, and the results they make due."""
    out: list[Instance] = []
    dues: list[tuple[str, str, Period]] = []
    for instance, late_after, period, window, opens_at in slots.slots:
        if now >= late_after or now < opens_at:
            continue
        if period is not None:
            dues.append(("result", window, period))
        out.append(instance)
    return _Taking(slots, out, len(slots.slots) - len(out), tuple(dues))


def _period_instance(board_type: BoardType, window: Window, period: Period, expire: int) -> Instance:
    """The instance of one period of a window, expiring at `expire`, packed as its type packs."""
    packing = window_packing(board_type, window, period.start_ms)
    return Instance(window_instance(window.name, period.id), expire, packing)


def _derived_inputs(pairs: Sequence[Instance]) -> list[str]:
    """The instances the derived rolling periods among `pairs` read."""
    return [
        name
        for inst in pairs
        if inst.rolling is not None and inst.rolling.role == DERIVED
        for name in (inst.rolling.source, inst.rolling.leaving, inst.rolling.entering)
    ]


def _one_per_event(outcomes: list[Outcome]) -> list[Outcome]:
    """A sharded board's reset is applied on each of its shards: one outcome for it, applied
    if any shard applied it (the others had it already: a redelivery)."""
    at: dict[int, int] = {}
    out: list[Outcome] = []
    for outcome in outcomes:
        kept = at.get(id(outcome.event))
        if kept is None:
            at[id(outcome.event)] = len(out)
            out.append(outcome)
            continue
        first = out[kept]
        if outcome.status is Status.APPLIED and first.status is not Status.APPLIED:
            outcome, first = first, outcome  # noqa: PLW2901 - the applied one leads, the other follows
        out[kept] = first._replace(also=(*first.also, outcome))
    return out


def _rounds(chunks: list[_Chunk]) -> list[list[_Chunk]]:
    """At most one chunk per board per round trip: a board's later chunk never runs before an
    earlier one has been narrowed, so a board's events are applied in stream order."""
    rounds: list[list[_Chunk]] = []
    depth: dict[str, int] = {}
    for chunk in chunks:
        level = depth.get(chunk.board, 0)
        depth[chunk.board] = level + 1
        if level == len(rounds):
            rounds.append([])
        rounds[level].append(chunk)
    return rounds


def _decode(chunk: _Chunk, want: bool, reply: ApplyReply | Exception, epoch: str) -> list[Outcome]:
    """The outcomes of one call; the call's error reply, if it failed, is raised here."""
    if isinstance(reply, Exception):
        raise reply
    if isinstance(reply, ForeignEpoch):
        raise EpochMismatch(chunk.board, reply.found, epoch)
    if isinstance(reply, PromotionChanged):  # still, after PROMOTION_TRIES: the batch goes again
        raise PromotionUnsettled(f"board {chunk.board}: its registration by API nodes keeps changing")
    outcomes: list[Outcome] = []
    for entry, got in zip(chunk.events, reply, strict=True):
        states: dict[str, MemberState | None] = {}
        resets = None
        if want or got.states or got.resets:  # a registered board's too (worker/promotions.py)
            names = sorted(entry.names, key=lambda n: chunk.instances[n][0])
            states = {n: st for n, st in zip(names, got.states, strict=True) if st is not UNREPORTED}
            if got.resets:
                resets = {name: seq for name, seq in zip(names, got.resets, strict=True) if seq > 0}
        if chunk.control and got.status is Status.APPLIED and entry.event.op in CONTROL_OPS:
            event = entry.event
            _log.info(
                "%s applied",
                event.op.value,
                extra={"board": chunk.board, "op": event.op.value,
                       "member" if event.op is Op.ERASE else "selector": event.member,
                       "instances": len(chunk.instances), "seq": got.seq},
            )  # fmt: skip
        outcomes.append(
            Outcome(
                entry.event,
                got.status,
                got.seq,
                states,
                entry.late + got.sealed,
                got.meta,
                got.failed_as,
                resets,
                chunk.board if chunk.board != entry.event.board else "",
            )
        )
    return outcomes
