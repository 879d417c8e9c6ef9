"""Warm boards at memory speed, never stale beyond a bound: the answers of non-hot boards, kept
in memory and dropped when the board changes (seed 003's two-level cache).

How a node learns that a board changed:
- **Notifications.** apply.lua publishes "<seq before> <seq after> <board>" on `<prefix>changes`
  in the same script as the writes (common/store/keys.py), so a change and its notice are one
  atomic step. Why Redis pub/sub: it is already there, and it reaches every node within a
  millisecond of the write. Keyspace notifications need a server setting and send one message
  per key written (a dozen per call). A Kafka topic adds the producer's linger and a consumer
  per node.
- **Generations.** Each cached answer carries the stamp (connection epoch, board generation)
  taken *before* its read was sent. A notice bumps the board's generation, so an answer read
  before the change, even one still in flight when the notice arrives, no longer matches and
  is never served. Every notice drops the whole board, so a gap in the board's seq (a lost
  notice followed by another) is already covered by the next notice. Gaps are counted.
- **Reconnects.** Pub/sub is fire-and-forget. While the subscription is down nothing is served
  from or stored in the cache. A new subscription starts a new epoch, which drops everything.
- **The safety net.** A notice can still be missed with the connection up: a writer that does
  not publish, such as a previous release's worker during a rolling upgrade. So every
  `warm_check_s` the node reads the seq of each board it holds answers of (one pipelined GET
  per board) and drops a board whose seq moved. This bounds staleness by `warm_check_s` (1 s)
  whatever is lost. It is a check, not a TTL: an unchanged board stays warm.
- **Time.** An answer whose period was chosen by the clock (no `period=`/`at=`) is kept only
  until that period ends. Any answer is kept only until its period's retention ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
from cachetools import Cache, LRUCache

from common.clock import Clock
from common.store.keys import BoardKeys
from common.store.pipe import Pipe
from common.store.shards import board_of, is_shard, shard_names
from common.store.subscription import Subscription

_log = logging.getLogger(__name__)
MAX_TRACKED_BOARDS = 1_000_000  # generations kept; beyond, a new epoch drops everything (rare)
CHECKS_MISSED = 3  # no successful seq check for this many intervals: nothing is served or kept
RECONNECT_S = (0.05, 1.0)  # the change feed's first and longest wait between attempts

Stamp = tuple[int, int]
ANSWER_OVERHEAD = 560  # bytes an answer costs besides its body and key (entry, LRU links, its
# headers: a dict of 184 B and an ETag of 75), about


def _size(answer: Answer) -> int:
    return len(answer.body) + len(answer.key) + ANSWER_OVERHEAD


class _Answers(LRUCache[str, "Answer"]):
    """The LRU of answers, with the keys of each board's (so a board's answers are dropped the
    moment it changes, and boards no longer held are found, without walking the answers, which
    would also reorder the LRU)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, getsizeof=_size)
        self.per_board: dict[str, set[str]] = {}

    def __setitem__(self, key: str, value: Answer) -> None:
        old = self.get(key)
        super().__setitem__(key, value)
        if old is not None:
            self._gone(old.board, key)
        self.per_board.setdefault(value.board, set()).add(key)

    def __delitem__(self, key: str) -> None:
        board = Cache.__getitem__(self, key).board  # the base class's: no reordering
        super().__delitem__(key)
        self._gone(board, key)

    def clear(self) -> None:
        super().clear()
        self.per_board.clear()

    def drop_board(self, board: str) -> None:
        """Every answer of `board`: a stale answer is never served again, so it must not hold
        memory until the LRU reaches it (the memory would grow with the changes seen, up to the
        cap, instead of with the answers worth keeping)."""
        for key in list(self.per_board.get(board, ())):
            del self[key]

    def _gone(self, board: str, key: str) -> None:
        keys = self.per_board[board]
        keys.discard(key)
        if not keys:
            del self.per_board[board]


async def _join(pending: asyncio.Future[Answer]) -> Answer | None:
    """The answer of a read in flight; None if its reader was cancelled (read it directly)."""
    try:
        return await asyncio.shield(pending)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if pending.cancelled() and task is not None and not task.cancelling():
            return None
        raise


@dataclass(frozen=True, slots=True)
class Answer:
    key: str  # the request's path and query
    body: bytes
    board: str
    stamp: Stamp
    until_ms: int  # served while the clock is before this
    seq: int
    headers: dict[str, str]  # its HTTP headers (api/httpcache.py)


class WarmCache:
    """Answers (serialised bodies) by request, valid while their stamp is current; at most
    `max_bytes` of bodies (least recently used go first)."""

    def __init__(self, max_bytes: int, clock: Clock) -> None:
        self.enabled = max_bytes > 0
        self._answers = _Answers(max(max_bytes, 1))
        # boards with answers kept or being read: their generation (a board never read has none)
        self._generations: dict[str, int] = {}
        self._low_seq: dict[str, int] = {}  # per board: the lowest seq of an answer kept
        self._loading: dict[tuple[str, Stamp, int], tuple[str, asyncio.Future[Answer]]] = {}
        self._clock = clock
        self.epoch = 0
        self.live = False  # the change feed is subscribed: only then is anything served or kept
        # and the seq check succeeded lately (a partition that stalls the check, with the feed's
        # socket half open, must not serve kept answers unchecked): set by the check
        self.checked_until = math.inf
        self.hits = self.misses = self.coalesced = self.gaps = self.checks_dropped = 0

    def get(self, key: str) -> Answer | None:
        if not self.live or time.monotonic() > self.checked_until:
            return None
        found = self._answers.get(key)
        if found is None:
            return None
        if found.stamp != (self.epoch, self._generations.get(found.board, 0)) or (
            self._clock() >= found.until_ms
        ):
            del self._answers[key]
            return None
        self.hits += 1
        return found

    @property
    def size(self) -> int:
        return len(self._answers)

    @property
    def size_bytes(self) -> int:
        return int(self._answers.currsize)

    def stamp(self, board: str) -> Stamp | None:
        """Taken before a read is sent; None while no change feed is live (nothing is kept)."""
        if not self.live or not self.enabled or time.monotonic() > self.checked_until:
            return None
        return self.epoch, self._generations.setdefault(board, 0)

    async def load(
        self,
        key: str,
        board: str,
        until_ms: int,
        read: Callable[[], Awaitable[tuple[bytes, int]]],
        headers: Callable[[int], dict[str, str]],
    ) -> Answer | None:
        """Read (body, seq) once for every identical request in flight with the same stamp and
        keep it, with its HTTP `headers(seq)`, if the stamp is still current; None: not
        cacheable now (read it directly)."""
        stamp = self.stamp(board)
        if stamp is None:
            return None
        if len(self._generations) > MAX_TRACKED_BOARDS:
            self.new_epoch()  # rare: more boards read than a node can track at once
            stamp = (self.epoch, self._generations.setdefault(board, 0))
        loading = (key, stamp, until_ms)  # the period too: a clock-chosen request joins its own
        pending = self._loading.get(loading)
        if pending is not None:
            self.coalesced += 1
            return await _join(pending[1])
        self.misses += 1
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._loading[loading] = (board, future)
        try:
            body, seq = await read()
        except asyncio.CancelledError:
            future.cancel()  # those who joined read for themselves
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs "never retrieved"
            raise
        finally:
            del self._loading[loading]
        answer = Answer(key, body, board, stamp, until_ms, seq, headers(seq))
        future.set_result(answer)
        if stamp == self.stamp(board) and _size(answer) <= self._answers.maxsize:
            self._answers[key] = answer
            low = self._low_seq.get(board)
            self._low_seq[board] = seq if low is None else min(low, seq)
        return answer

    def changed(self, board: str, before: int, after: int) -> None:
        """A notice: every answer of `board` kept or being read is stale."""
        if board not in self._generations:
            return  # nothing of it kept or being read
        self._stale(board)
        low = self._low_seq.pop(board, None)
        if low is not None and before > low:
            self.gaps += 1  # a notice for this board was lost: the answers are dropped all the same

    def drop(self, board: str) -> None:
        """Serve nothing kept of `board` any more (it is served from memory from now on)."""
        if board in self._generations:
            self._stale(board)

    def _stale(self, board: str) -> None:
        """Every answer of `board` kept goes, and every one being read will not be kept (its
        stamp names the generation before this one)."""
        self._generations[board] = self._generations.get(board, 0) + 1
        self._answers.drop_board(board)

    def new_epoch(self) -> None:
        self.epoch += 1
        self._answers.clear()
        self._generations.clear()
        self._low_seq.clear()

    def boards_held(self) -> dict[str, int]:
        return dict(self._low_seq)

    def prune(self) -> None:
        """Forget the boards with no answer kept nor being read (evicted, expired, dropped)."""
        busy = set(self._answers.per_board)
        busy.update(board for board, _ in self._loading.values())
        for board in [b for b in self._generations if b not in busy]:
            del self._generations[board]
        for board in [b for b in self._low_seq if b not in busy]:
            del self._low_seq[board]

    def moved(self, board: str) -> None:
        """The safety check found the board's seq past what is kept: a notice was missed."""
        self.checks_dropped += 1
        self._stale(board)
        self._low_seq.pop(board, None)


class ChangeFeed:
    """The subscription to `<prefix>changes` and the seq check, run as a task of the API."""

    def __init__(
        self,
        key_prefix: str,
        cache: WarmCache,
        check_s: float,
        reads: Pipe,
        name: str = "",
        *,
        shards_of: Callable[[str], int] = lambda board: 1,
    ) -> None:
        """`shards_of`: a board's shard count (its type's `shards`)."""
        self._shards_of = shards_of
        cache.checked_until = time.monotonic() + CHECKS_MISSED * check_s
        self._prefix, self._cache, self._name = key_prefix, cache, name
        self._attempts = 0  # where the next subscription goes (a cluster: any node, in turn)
        self._channel = BoardKeys(key_prefix, "").changes
        self._check_s, self._reads = check_s, reads
        self.subscriptions = 0
        self.on_change: list[Callable[[str], None]] = []  # a board's notice (api/live.py)

    async def run(self, stopping: asyncio.Event) -> None:
        wait = RECONNECT_S[0]
        checker = asyncio.create_task(self._check(stopping))
        try:
            while not stopping.is_set():
                try:
                    await self._follow(stopping)
                    wait = RECONNECT_S[0]
                except (redis.RedisError, OSError) as exc:
                    _log.warning(
                        "change feed down: warm cache off until it is back", extra={"error": str(exc)}
                    )
                except Exception:  # noqa: BLE001 - a bug must not end the feed: logged, it starts again
                    _log.exception("change feed failed: warm cache off until it is back")
                finally:
                    self._down()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), wait)
                wait = min(wait * 2, RECONNECT_S[1])
        finally:
            checker.cancel()
            await asyncio.wait({checker})

    def _down(self) -> None:
        if self._cache.live:
            self._cache.live = False
            self._cache.new_epoch()

    async def _follow(self, stopping: asyncio.Event) -> None:
        """Apply each notice as it arrives (in the connection's callback: no task, no queue);
        return when stopping, raise what ended the connection."""
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def deliver(reply: Any) -> None:
            if ended.done():
                return
            if isinstance(reply, Exception):  # the connection's end
                ended.set_exception(reply)
                return
            try:
                self._message(reply)
            except Exception as exc:  # noqa: BLE001 - a bad notice: the feed starts again
                ended.set_exception(exc)

        feed = Subscription(
            self._reads.feed_url(self._attempts), deliver, name=self._name, tls=self._reads.tls
        )
        self._attempts += 1
        await feed.open(self._channel)
        stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({ended, stop}, return_when=asyncio.FIRST_COMPLETED)
            if ended.done():
                ended.result()  # raises: the connection ended
        finally:
            stop.cancel()
            if not ended.done():
                ended.cancel()  # what closing delivers now is ignored
            feed.close()

    def _message(self, reply: list[bytes]) -> None:
        kind = reply[0]
        if kind == b"subscribe":
            self.subscriptions += 1
            self._cache.new_epoch()  # whatever happened while unsubscribed is unknown
            self._cache.live = True
            _log.info("change feed subscribed: warm cache on", extra={"channel": self._channel})
        elif kind == b"message":
            before, after, name = reply[2].decode().split(" ", 2)
            if is_shard(name):  # a shard's seqs: the board's is their sum (no gap to tell)
                name = board_of(name)
                self._cache.changed(name, 0, 0)
            else:
                self._cache.changed(name, int(before), int(after))
            for listener in self.on_change:
                listener(name)
        # anything else (a pong) changes nothing

    async def _check(self, stopping: asyncio.Event) -> None:
        """Every check_s: drop each board held whose seq in Redis moved past what is kept."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._check_s)
            try:
                await self._check_once()
            except redis.RedisError:
                pass  # Redis is away: reads fail too; the next pass checks again
            except Exception:  # noqa: BLE001 - a bug must not end the check: logged, the next pass runs
                _log.exception("warm cache check failed")

    async def _check_once(self) -> None:
        self._cache.prune()
        held = self._cache.boards_held()
        deadline = time.monotonic() + CHECKS_MISSED * self._check_s
        if not held or not self._cache.live:
            self._cache.checked_until = deadline
            return
        stamps = {board: self._cache.stamp(board) for board in held}
        names = {board: shard_names(board, self._shards_of(board)) for board in held}
        replies = [
            self._reads.send("GET", BoardKeys(self._prefix, n).seq) for ns in names.values() for n in ns
        ]
        got = iter(await asyncio.gather(*replies))
        seqs = [sum(int(next(got) or 0) for _ in ns) for ns in names.values()]  # a sharded board's: the sum
        for (board, low), seq in zip(held.items(), seqs, strict=True):
            if seq != low and self._cache.stamp(board) == stamps[board]:
                self._cache.moved(board)
        self._cache.checked_until = deadline
