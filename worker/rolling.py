"""Prepares each board's next rolling period while the current one runs (docs/internals/rolling-windows.md).

Period q+1 of `last_<N><unit>` is R[q] - B[q-N+1] + B[q+1] (worker/rolling_slots.py). Late in
bucket q (claim_lead_ms before its end: a twentieth of the bucket, more for a board whose walk
takes longer, at most a quarter) this walks every member of period q and of bucket q+1 and
derives its state in q+1; from the moment it claims the period, events write q+1 for the
members they touch too (before, they spare that write: the walk comes after them). So at the
boundary the next period is already whole: no job after it, no moment where it is wrong.

Which boards: the set `{rolling}:<unit>:<bucket>` (common/store/keys.py rolling_due) names every
board with a next period to prepare while that bucket is current. Events add their board
(worker/apply.py) when they put something in the next period or further ahead; this adds a board
whose prepared period holds members, so it is prepared again in the bucket after. A board that
empties drops out: nothing to carry.

How: per board and window, the marker `<board>:rp:<period>` is claimed ("busy:<owner>", with a
lease), the source period's members (through its tie index, statepage.lua: a member max_members
moves between its zsets meanwhile is not missed) and the entering bucket's (HSCAN) are walked,
and each page of members goes through apply.lua as op `derive` (the same formula as the events',
so a member an event writes meanwhile stays exact; a walk the boundary overtakes sends the rest
of its members as rebuilds from the buckets: _walk), the board is registered for the bucket
after, then the marker says "done". Every call is one page: a page of 12 members keeps each
well under a millisecond on a board of any size. On hot boards each page's states go to update_cache
(acknowledged) before the marker is set, so memory holds the next period whole at the boundary
too. A set is walked while its bucket is current and the one before it (a worker that was down
through a bucket's claim catches up: until it has, that board's period lacks the members
nobody touched; each derive writes the exact state, so the catch-up heals it)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis

from common.boards import BoardsConfig, BoardType, Window, split_board
from common.clock import Clock
from common.idwindow import LISTPACK_CAP
from common.periods import Period, parse_period
from common.store import scan
from common.store.apply import (
    DERIVED,
    ApplyEvent,
    ApplyRequest,
    ApplyScript,
    ForeignEpoch,
    Instance,
    PromotionChanged,
    Rolling,
)
from common.store.encoding import MemberState, text, tie_mode
from common.store.keys import (
    BoardKeys,
    bucket_instance,
    rolling_boards,
    rolling_due,
    rolling_ready,
    rolling_since,
    window_instance,
)
from common.store.shards import board_of
from common.store.topology import Store
from worker.metrics import WorkerMetrics
from worker.passes import PassThread
from worker.publisher import CachePublisher
from worker.rolling_slots import RollingSlots, unit_window

_log = logging.getLogger(__name__)
T = TypeVar("T")
# members per derive call: ~30 us of Redis a member on a big board. Measured on a 100k-member
# rolling board, interleaved: page 25 calls p50 0.63-0.91 ms, p99 2.3-2.5 ms; page 12 p50
# 0.34-0.43 ms, p99 0.84-0.85 ms at the same Redis CPU a member (36-51 vs 42-46 us); page 8 costs
# more (51-66 us)
PAGE = 12
# A board's next period is claimed this share of a bucket before it begins, or earlier for a big
# board: its walk's expected time (WALK_US a member: 35-69 s per 1M members measured on this
# box, alone) LEAD_SAFETY times over, but never earlier than LEAD_MAX. Until the claim events
# spare the write to it (apply.lua: the walk, which comes after, derives every member anyway);
# after it every event writes it too, which costs a rolling window about 1.7x (bench rolling
# `rolling_cost_vs_calendar_preparing`): the shorter that stretch, the cheaper the window.
LEAD_MIN = 0.05
LEAD_MAX = 0.25
WALK_US = 70
LEAD_SAFETY = 4
LEASE_MS = 120_000  # a claim a crashed worker left is taken over after this
# a walk stops deriving at its source period's end, or this long before the source's late grace
# ends if the grace is shorter: what the workers' clocks may differ by, and a call take (_walk)
CLOCK_MARGIN_MS = 1_000
RENEW_S = 5.0  # a claim held is renewed this often
DONE = b"done"


def claim_lead_ms(bucket_ms: int, members: int) -> int:
    """How long before its period begins a board's next period of `members` is claimed, with
    buckets of `bucket_ms` (LEAD_MIN, LEAD_MAX, WALK_US, LEAD_SAFETY above)."""
    walk_ms = members * WALK_US * LEAD_SAFETY // 1000
    return min(int(bucket_ms * LEAD_MAX), max(int(bucket_ms * LEAD_MIN), walk_ms))


class PrepareError(Exception):
    """A page could not be derived: the period is left unfinished, the next pass retries it."""


@dataclass
class PrepareStats:
    periods: int = 0  # periods prepared whole
    members: int = 0  # members derived
    calls: int = 0  # Redis calls that derived them
    overtaken: int = 0  # walks that reached their period's start unfinished (the rest rebuilt)


class RollingPreparer:
    def __init__(
        self,
        client: Store,
        boards: BoardsConfig,
        key_prefix: str,
        *,
        clock: Clock,
        epoch: Callable[[], str],
        owner: str,
        publisher: CachePublisher | None = None,
        page: int = PAGE,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self._client = client
        self._boards = boards
        self._prefix = key_prefix
        self._clock = clock
        self._epoch = epoch
        self._owner = owner
        self._publisher = publisher
        self._page = page
        self._slots = RollingSlots(boards.timezone)
        self._script = ApplyScript()
        self._done: set[tuple[str, str, str]] = set()  # (unit, bucket, board) prepared whole
        self._clean: dict[str, int] = {}  # due set -> its size when a pass found all of it done
        self._claims: dict[tuple[str, str, str], int] = {}  # (board, window, bucket) -> claimed at
        # each unit's windows (one per name: types share them)
        windows = {w.name: w for t in boards.types.values() for w in t.rolling}
        self._windows: dict[str, list[Window]] = {}
        for window in sorted(windows.values(), key=lambda w: w.name):
            self._windows.setdefault(window.rolling_unit or "", []).append(window)
        self._units = {u: unit_window(u) for u in sorted(self._windows)}
        self.stats = PrepareStats()

    def step(self) -> bool:
        """One pass; False when nothing is left to do for now. Per unit: the period that began
        with this bucket for each board due in the bucket before (done then, normally; rebuilt
        from its buckets now if nobody prepared it), after an outage every board with events in
        the window, and late in the bucket the next period of each board due now (claim_lead_ms
        before its end, by the board's size)."""
        now = self._clock()
        pending = False
        if len(self._done) > 1_000_000:
            self._done.clear()
        if len(self._claims) > 1_000_000:
            self._claims.clear()
        for unit, window in self._units.items():
            cur = self._slots.bucket_at(window, now)
            previous = self._slots.shift(window, cur, -1)
            pending |= self._pass(unit, previous, now, rebuild=True) is True
            ready = rolling_ready(self._prefix, unit, cur.id)
            if (unit, cur.id, "") not in self._done and not self._client.exists(ready):
                # the first bucket any worker prepares in: nothing was prepared before, nothing missed
                first = self._since(unit, cur) >= cur.start_ms
                if not first and self._catch_up(unit, cur, now):
                    pending = True
                else:
                    self._mark_ready(ready, window, cur)
                    self._done.add((unit, cur.id, ""))
            if now >= cur.end_ms - int((cur.end_ms - cur.start_ms) * LEAD_MAX):  # the earliest claim
                left = self._pass(unit, cur, now, rebuild=False)
                if left:
                    pending = True
                elif left is False:  # every board due now has its next period: no catch-up after the boundary
                    following = self._slots.shift(window, cur, 1)
                    self._mark_ready(rolling_ready(self._prefix, unit, following.id), window, following)
        return pending

    def _since(self, unit: str, cur: Period) -> int:
        """The start of the first bucket in which a worker prepared periods of this unit (set now
        if none did): a catch-up is for periods a running service failed to prepare."""
        key = rolling_since(self._prefix, unit)
        self._client.set(key, cur.start_ms, nx=True)
        return int(self._client.get(key) or cur.start_ms)

    def _mark_ready(self, key: str, window: Window, bucket: Period) -> None:
        self._client.set(key, 1, pxat=self._slots.shift(window, bucket, 2).start_ms)

    def _pass(self, unit: str, bucket: Period, now: int, *, rebuild: bool) -> bool | None:
        """Prepare the period after `bucket` for every board due in it; True if some is left,
        None if only boards whose claim has not come are (nothing to do before it)."""
        key = rolling_due(self._prefix, unit, bucket.id)
        size = int(self._client.scard(key))
        if self._clean.get(key) == size:
            return False  # every board in it done, none added since
        left, waiting, claim_in = False, False, None if rebuild else bucket
        for raw in self._client.sscan_iter(key, count=500):
            done = self._board(text(raw), unit, bucket.id, now, rebuild=rebuild, claim_in=claim_in)
            left |= done is False
            waiting |= done is None
        if left:
            return True
        if waiting:
            return None
        if len(self._clean) > 64:
            self._clean.clear()
        self._clean[key] = size
        return False

    def _catch_up(self, unit: str, cur: Period, now: int) -> bool:
        """Nobody finished preparing the period `cur` begins (the workers were down from the
        claim to the end of the bucket before, or longer): rebuild it from the buckets for every board
        with events in the window. True if some is left."""
        left = False
        for window in self._windows[unit]:
            oldest, previous = (
                self._slots.shift(window, cur, 1 - window.count),
                self._slots.shift(window, cur, -1),
            )
            key = rolling_boards(self._prefix, window.name)
            self._client.zremrangebyscore(key, "-inf", f"({oldest.start_ms}")  # nothing left in the window
            for raw, _ in self._client.zscan_iter(key, count=500):
                if not self._board(text(raw), unit, previous.id, now, rebuild=True, only=window.name):
                    left = True
        return left

    def _board(
        self,
        board: str,
        unit: str,
        bucket_id: str,
        now: int,
        *,
        rebuild: bool,
        only: str = "",
        claim_in: Period | None = None,
    ) -> bool | None:
        """The period after `bucket_id` of each of the board's rolling windows of `unit` (or of
        window `only`); True when every one is done (by us or another worker). A board that fails
        is counted and left for the next pass; the others go on. None when no window failed but
        the claim of some has not come yet. `claim_in`: the bucket whose end the claim counts
        back from, by the board's size (_claim_at); None: claimed now (a rebuild, a catch-up)."""
        if (unit, bucket_id, board) in self._done:
            return True
        parts = split_board(board_of(board))  # each shard of a sharded board is prepared alone
        board_type = None if parts is None else self._boards.type_for(parts[0])
        if board_type is None:
            return True  # no longer in the config: nothing to prepare
        complete, waiting = True, False
        for window in board_type.rolling:
            if window.rolling_unit != unit or (only and window.name != only):
                continue
            try:
                source = parse_period(window, bucket_id, self._boards.timezone)
                if claim_in is not None and now < self._claim_at(board, window, source, claim_in):
                    waiting = True  # not yet: events spare the write to it meanwhile
                elif not self._prepare(board, board_type, window, source, now=now, rebuild=rebuild):
                    complete = False
            except (PrepareError, redis.ResponseError) as exc:
                _log.warning("rolling period not prepared", extra={"board": board, "error": str(exc)})
                if self.metrics is not None:
                    self.metrics.rolling_failures.inc()
                complete = False
        if not complete:
            return False
        if waiting:
            return None
        if not only:
            self._done.add((unit, bucket_id, board))
        return True

    def _claim_at(self, board: str, window: Window, source: Period, bucket: Period) -> int:
        """When the period after `source` is claimed: claim_lead_ms before `bucket` ends, by its
        members (period q's and the entering bucket's, read once per board and bucket)."""
        cached = (board, window.name, bucket.id)
        at = self._claims.get(cached)
        if at is None:
            keys = BoardKeys(self._prefix, board)
            instance = window_instance(window.name, source.id)
            entering = bucket_instance(window.name, self._slots.shift(window, source, 1).id)
            pipe = self._client.pipeline(transaction=False)
            pipe.zcard(keys.rank(instance))
            pipe.zcard(keys.overflow(instance))
            pipe.hlen(keys.state(instance))
            pipe.hlen(keys.bucket(entering))
            members = sum(int(n) for n in pipe.execute())
            lead = claim_lead_ms(bucket.end_ms - bucket.start_ms, members)
            at = self._claims[cached] = bucket.end_ms - lead
        return at

    def _prepare(
        self, board: str, board_type: BoardType, window: Window, source: Period, *, now: int, rebuild: bool
    ) -> bool:
        """Prepare period q+1 (q = `source`) of one board: derive it from q, or rebuild it from
        its buckets when catching up (q may lack late events then: it had closed)."""
        keys = BoardKeys(self._prefix, board)
        target = self._slots.shift(window, source, 1)
        derived, _ = self._slots.derived(board_type, window, source)
        if now >= derived.expire_at_ms:
            return True  # expired before anyone prepared it (a worker down for its retention)
        marker = keys.prepared(derived.name)
        claim = f"busy:{self._owner}".encode()
        if not self._client.set(marker, claim, nx=True, px=LEASE_MS):
            held = self._client.get(marker)
            if held != claim:
                return held == DONE  # done, or another worker holds it: look again next pass
        walk = self._rebuild if rebuild else self._walk
        published = False
        renewed = time.monotonic()
        for call, op, page in walk(keys, board_type, window, source):
            rebuild = rebuild or op == "rebuild"  # a walk the boundary overtook rebuilds
            published |= self._derive(keys, board_type, call, page, window=window.name, op=op)
            if time.monotonic() - renewed > RENEW_S:
                self._client.pexpire(marker, LEASE_MS)
                renewed = time.monotonic()
        if self._publisher is not None and published:
            self._publisher.flush(30.0)  # in update_cache before the marker says so
        if self._client.exists(keys.rank(derived.name)):  # it carries members: prepare its successor
            # registered before the marker says done: a worker stopped between the two would
            # otherwise leave a period nobody prepares, and whoever reads the due set once the
            # marker is done finds the board there
            due = rolling_due(self._prefix, window.rolling_unit or "", target.id)
            self._client.sadd(due, board)
            self._client.pexpireat(due, self._slots.shift(window, target, 2).start_ms)
        if self._client.get(marker) != claim:  # the lease lapsed meanwhile: events may have skipped it
            raise PrepareError(f"lost the claim on {derived.name} of {board}: walking it again")
        self._client.set(marker, DONE, pxat=derived.expire_at_ms)
        self.stats.periods += 1
        if self.metrics is not None:
            self.metrics.rolling_prepared.inc()
        _log.info(
            "rolling period prepared", extra={"board": board, "instance": derived.name, "rebuilt": rebuild}
        )
        return True

    def _walk(
        self, keys: BoardKeys, board_type: BoardType, window: Window, source: Period
    ) -> Iterator[tuple[list[Instance], str, list[str]]]:
        """Pages to derive into period q+1: the members of q (through its tie index: one
        max_members moves between its rank and overflow zsets meanwhile is still visited), then
        those of bucket q+1. The formula holds while q counts every event of the buckets it
        shares with q+1, so only until q's late grace ends: an event later than that counts in
        its bucket and in q+1, not in q. A walk the boundary overtakes (a big board, a slow
        worker) sends the rest of its pages as rebuilds, each member summed from q+1's buckets;
        what it derived before stays exact (events since wrote q+1 as they would). It switches at
        q's end, a grace before any event can miss q (CLOCK_MARGIN_MS before, if the grace is
        shorter): the workers' clocks must agree within that."""
        derived, deps = self._slots.derived(board_type, window, source)
        call = [derived, *deps]
        switch_at = source.end_ms + min(0, board_type.late_grace_ms - CLOCK_MARGIN_MS)
        found = scan.member_pages(
            self._client, keys, window_instance(window.name, source.id), tie_mode(board_type), 4 * self._page
        )
        entering = keys.bucket(bucket_instance(window.name, self._slots.shift(window, source, 1).id))
        fields = scan.hash_field_pages(self._client, entering, 4 * self._page)
        members = itertools.chain.from_iterable(itertools.chain(found, fields))
        for page in _pages(members, self._page):
            if self._clock() >= switch_at:  # read right before the page's call
                self.stats.overtaken += 1
                _log.warning(
                    "rolling walk overtaken by its period's start: rebuilding the rest from its buckets",
                    extra={"board": keys.board, "instance": derived.name},
                )
                rest = itertools.chain(page, members)  # _pages holds nothing beyond the page
                yield from _rebuild_pages(self._rebuild_call(board_type, window, source), window, rest)
                return
            yield call, "derive", page

    def _rebuild(
        self, keys: BoardKeys, board_type: BoardType, window: Window, source: Period
    ) -> Iterator[tuple[list[Instance], str, list[str]]]:
        """Pages to rebuild period q+1 from its N buckets: every member of any of them."""
        call = self._rebuild_call(board_type, window, source)
        members: set[str] = set()
        for bucket in call[1:]:
            for fields in scan.hash_field_pages(self._client, keys.bucket(bucket.name), 500):
                members.update(fields)
        yield from _rebuild_pages(call, window, sorted(members))

    def _rebuild_call(self, board_type: BoardType, window: Window, source: Period) -> list[Instance]:
        """Period q+1 and its N buckets, as op `rebuild` reads them."""
        derived, _ = self._slots.derived(board_type, window, source)
        buckets = self._slots.buckets_before(board_type, window, self._slots.shift(window, source, 1))
        return [derived._replace(rolling=Rolling(DERIVED, window.name)), *buckets]

    def _derive(
        self,
        keys: BoardKeys,
        board_type: BoardType,
        call: list[Instance],
        members: list[str],
        *,
        window: str,
        op: str,
    ) -> bool:
        """One page: apply.lua derives (or rebuilds) each member's state in the period call[0];
        whether the states were published (the window is hot, by the config or because an API
        node registered the board: worker/promotions.py, whose belief the call checks)."""
        promotions = self._publisher.promotions if self._publisher is not None else None
        promoted = promotions is not None and promotions.believed(keys.board)
        hot = window in (
            promotions.windows(keys.board) if promotions else self._boards.hot_windows(keys.board)
        )
        request = ApplyRequest(
            keys=keys,
            instances=call,
            mode=tie_mode(board_type),
            desc=board_type.order.value == "desc",
            max_members=board_type.max_members or 0,
            want_state=hot,
            epoch=self._epoch(),
            id_window_s=1,
            listpack_cap=LISTPACK_CAP,  # the tie index's buckets split as the worker's do
            legacy_ttl_ms=0,
            sources=[],
            events=[ApplyEvent(op, m, 0.0, 0, "", 1, 0, 0, b"") for m in members],
            score_range=board_type.score_range,
            promoted=promoted,
        )
        (reply,) = self._script.run_many(self._client, [request])
        if isinstance(reply, PromotionChanged) and promotions is not None:  # learnt: the page again
            promotions.learn(keys.board, reply.promoted)
            return self._derive(keys, board_type, call, members, window=window, op=op)
        self.stats.calls += 1
        self.stats.members += len(members)
        if self.metrics is not None:
            self.metrics.rolling_derived.inc(len(members))
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, ForeignEpoch):  # not ours (yet: the worker has not read Redis' epoch)
            raise PrepareError(f"board {keys.board} belongs to epoch {reply.found}, not {request.epoch}")
        if isinstance(reply, PromotionChanged):
            raise PrepareError(f"board {keys.board}: registered by an API node, and no publisher")
        if hot and self._publisher is not None:
            rows: list[tuple[str, MemberState | None, bytes | None, int]] = [
                (m, got.states[0], got.meta, got.seq) for m, got in zip(members, reply, strict=True)
            ]
            self._publisher.publish_states(keys.board, call[0].name, rows)
            return True
        return False


def _rebuild_pages(
    call: list[Instance], window: Window, members: Iterable[str]
) -> Iterator[tuple[list[Instance], str, list[str]]]:
    for page in _pages(members, max(1, 200 // window.count)):  # each member reads every bucket
        yield call, "rebuild", page


def _pages(items: Iterable[T], size: int) -> Iterator[list[T]]:
    page: list[T] = []
    for item in items:
        page.append(item)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


class PreparerThread(PassThread):
    """Runs the preparer beside the worker loop: a pass every `interval_s` (sooner never: a
    pass walks only what is due and not done)."""

    def __init__(self, preparer: RollingPreparer, interval_s: float = 1.0) -> None:
        self.preparer = preparer

        def failed() -> None:
            if preparer.metrics is not None:
                preparer.metrics.rolling_failures.inc()

        def once() -> bool:
            preparer.step()
            return False  # the next pass a whole interval later

        super().__init__("rolling-preparer", once, failed, interval_s)
