"""Prepares each board's next rolling period while the current one runs (README "Rolling windows").

Period q+1 of `last_<N><unit>` is R[q] - B[q-N+1] + B[q+1] (worker/rolling_slots.py). In the
last quarter of bucket q (PREPARE_FROM) this walks every member of period q and of bucket q+1
and derives its state in q+1; from the moment it claims the period, events write q+1 for the
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
so a member an event writes meanwhile stays exact), then the marker says "done". Every call is
one page: a page of 25 members keeps each under a millisecond on a board of any size. On hot boards
each page's states go to update_cache (acknowledged) before the marker is set, so memory holds the
next period whole at the boundary too. A set is walked while its bucket is current and the one
before it (a worker that was down through a bucket's last quarter catches up: until it has, that
board's period lacks the members nobody touched; each derive writes the exact state, so the
catch-up heals it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar, cast

import redis

from common.boards import BoardsConfig, BoardType, Window, split_board
from common.clock import Clock
from common.periods import parse_period
from common.store import scan
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript, ForeignEpoch, Instance
from common.store.encoding import MemberState, text, tie_mode
from common.store.keys import BoardKeys, bucket_instance, rolling_due, window_instance
from worker.metrics import WorkerMetrics
from worker.publisher import CachePublisher
from worker.rolling_slots import RollingSlots, unit_window

_log = logging.getLogger(__name__)
T = TypeVar("T")
PAGE = 25  # members per derive call: under 1 ms of Redis each (~30 us a member on a big board)
# a period is prepared from when this share of the bucket before it has passed: until then events
# spare the write to it (apply.lua: the walk, which comes after, derives every member anyway)
PREPARE_FROM = 0.75
LEASE_MS = 120_000  # a claim a crashed worker left is taken over after this
DONE = b"done"


@dataclass
class PrepareStats:
    periods: int = 0  # periods prepared whole
    members: int = 0  # members derived
    calls: int = 0  # Redis calls that derived them


class RollingPreparer:
    def __init__(
        self,
        client: redis.Redis,
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
        units = {w.rolling_unit for t in boards.types.values() for w in t.rolling}
        self._units = {u: unit_window(u) for u in sorted(u for u in units if u is not None)}
        self.stats = PrepareStats()

    def step(self) -> bool:
        """One pass over every due set (the previous bucket's first); False when all is done."""
        now = self._clock()
        pending = False
        for unit, window in self._units.items():
            cur = self._slots.bucket_at(window, now)
            if len(self._done) > 1_000_000:
                self._done.clear()
            previous = self._slots.shift(window, cur, -1)
            ready = now >= cur.start_ms + int((cur.end_ms - cur.start_ms) * PREPARE_FROM)
            for bucket in (previous, cur) if ready else (previous,):
                key = rolling_due(self._prefix, unit, bucket.id)
                size = int(self._client.scard(key))
                if self._clean.get(key) == size:
                    continue  # every board in it done, none added since
                left = False
                for raw in self._client.sscan_iter(key, count=500):
                    board = text(raw)
                    if (unit, bucket.id, board) in self._done:
                        continue
                    # the current period first, if it still had to be prepared (catching up)
                    after = previous.id if bucket is cur else None
                    if self.prepare_board(board, unit, bucket.id, now, after):
                        self._done.add((unit, bucket.id, board))
                    else:
                        left = True
                if left:
                    pending = True
                else:
                    if len(self._clean) > 64:
                        self._clean.clear()
                    self._clean[key] = size
        return pending

    def prepare_board(
        self, board: str, unit: str, bucket_id: str, now: int, after: str | None = None
    ) -> bool:
        """Prepare the period after `bucket_id` of each of the board's rolling windows of `unit`;
        True when every one is done (by us or another worker). `after`: the bucket before, whose
        due set names the board if the period after it (the source) must be prepared first."""
        parts = split_board(board)
        board_type = None if parts is None else self._boards.type_for(parts[0])
        if board_type is None:
            return True  # no longer in the config: nothing to prepare
        complete = True
        for window in board_type.rolling:
            if window.rolling_unit != unit:
                continue
            if after is not None and not self._source_ready(board, board_type, window, after, now):
                complete = False  # catching up: the source is prepared first
            elif not self._prepare(board, board_type, window, bucket_id, now):
                complete = False
        return complete

    def _source_ready(self, board: str, board_type: BoardType, window: Window, after: str, now: int) -> bool:
        """Whether the period after `after` (the source) is whole: prepared, or never due."""
        keys = BoardKeys(self._prefix, board)
        if not self._client.sismember(rolling_due(self._prefix, window.rolling_unit or "", after), board):
            return True
        source = parse_period(window, after, self._boards.timezone)
        derived, _ = self._slots.derived(board_type, window, source)
        return now >= derived.expire_at_ms or self._client.get(keys.prepared(derived.name)) == DONE

    def _prepare(self, board: str, board_type: BoardType, window: Window, bucket_id: str, now: int) -> bool:
        tz = self._boards.timezone
        keys = BoardKeys(self._prefix, board)
        source = parse_period(window, bucket_id, tz)
        derived, deps = self._slots.derived(board_type, window, source)
        if now >= derived.expire_at_ms:
            return True  # expired before anyone prepared it (a worker down for its retention)
        marker = keys.prepared(derived.name)
        state = self._client.get(marker)
        if state == DONE:
            return True
        if not self._client.set(marker, f"busy:{self._owner}", nx=True, px=LEASE_MS):
            held = self._client.get(marker)
            if held != f"busy:{self._owner}".encode():
                return held == DONE  # another worker holds it: look again next pass
        hot = window.name in self._boards.hot_windows(board)
        call = [derived, *deps]
        # the source's members through its tie index: one max_members moves between its rank and
        # overflow zsets meanwhile is still visited
        members = scan.member_pages(
            self._client, keys, window_instance(window.name, source.id), tie_mode(board_type), 4 * self._page
        )
        for page in _pages((m for found in members for m in found), self._page):
            self._derive(keys, board_type, call, page, hot)
            self._client.pexpire(marker, LEASE_MS)
        entering = keys.bucket(bucket_instance(window.name, self._slots.shift(window, source, 1).id))
        fields = (text(cast("tuple[bytes, bytes]", item)[0]) for item in self._client.hscan_iter(entering))
        for page in _pages(fields, self._page):
            self._derive(keys, board_type, call, page, hot)
        if self._publisher is not None and hot:
            self._publisher.flush(30.0)  # in update_cache before the marker says so
        self._client.set(marker, DONE, pxat=derived.expire_at_ms)
        self.stats.periods += 1
        if self.metrics is not None:
            self.metrics.rolling_prepared.inc()
        if self._client.exists(keys.rank(derived.name)):  # it carries members: prepare its successor
            following = self._slots.shift(window, source, 1)
            due = rolling_due(self._prefix, window.rolling_unit or "", following.id)
            self._client.sadd(due, board)
            self._client.pexpireat(due, self._slots.shift(window, following, 2).start_ms)
        _log.info("rolling period prepared", extra={"board": board, "instance": derived.name})
        return True

    def _derive(
        self, keys: BoardKeys, board_type: BoardType, call: list[Instance], members: list[str], hot: bool
    ) -> None:
        """One page: apply.lua derives each member's state in the prepared period (call[0])."""
        if not members:
            return
        request = ApplyRequest(
            keys=keys,
            instances=call,
            mode=tie_mode(board_type),
            desc=board_type.order.value == "desc",
            max_members=board_type.max_members or 0,
            want_state=hot,
            epoch=self._epoch(),
            id_window_s=1,
            listpack_cap=128,
            legacy_ttl_ms=0,
            sources=[],
            events=[ApplyEvent("derive", m, 0.0, 0, "", 1, 0, 0, b"") for m in members],
            score_range=board_type.score_range,
        )
        (reply,) = self._script.run_many(self._client, [request])
        self.stats.calls += 1
        self.stats.members += len(members)
        if self.metrics is not None:
            self.metrics.rolling_derived.inc(len(members))
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, ForeignEpoch):
            return  # the board belongs to another epoch of the data set: the worker stops on it
        if hot and self._publisher is not None:
            rows: list[tuple[str, MemberState | None, bytes | None, int]] = [
                (m, got.states[0], got.meta, got.seq) for m, got in zip(members, reply, strict=True)
            ]
            self._publisher.publish_states(keys.board, call[0].name, rows)


def _pages(items: Iterable[T], size: int) -> Iterator[list[T]]:
    page: list[T] = []
    for item in items:
        page.append(item)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


class PreparerThread:
    """Runs the preparer beside the worker loop: a pass every `interval_s` (sooner never: a
    pass walks only what is due and not done)."""

    def __init__(self, preparer: RollingPreparer, interval_s: float = 1.0) -> None:
        self.preparer = preparer
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rolling-preparer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.preparer.step()
            except Exception as exc:  # noqa: BLE001 - Redis or Kafka away: the next pass retries
                _log.warning("rolling preparation failed, retrying", extra={"error": repr(exc)})
                if self.preparer.metrics is not None:
                    self.preparer.metrics.rolling_failures.inc()
            self._stop.wait(self._interval)
