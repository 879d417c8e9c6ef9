"""Two workers and the rolling preparer on one board at once (issue 30: the design is weakest where
others write the board the worker keeps). Workers A and B apply two partitions of one board's
events concurrently (batch by batch, in lockstep), each deciding from its own kept state of the
board; some ids reach both partitions (a producer retry on another partition). Halfway, late in the
hour, the preparer claims the next rolling period and walks the board while
the workers go on, each writing that period too, as the walk does. Incr events only, so the
end state does not depend on which worker applied what first; it must equal an independent sum
of the distinct events: each member's score in total and its day, and its score and latest
event in the current and the next rolling period and in the bucket."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, cast
from unittest import mock

import pytest
import redis

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.encoding import TIE_WIDTH, parse_state
from common.store.guarded import GuardedWrite
from common.store.keys import BoardKeys, bucket_instance
from tests.helpers import BOTH_TOPOLOGIES, wait_for
from tests.redis_layout import read_general
from worker.apply import Applier, Position, Source
from worker.boardstate import BoardStates
from worker.rolling import RollingPreparer, claim_lead_ms

pytestmark = [pytest.mark.integration, BOTH_TOPOLOGIES]
HOUR = 3_600_000
CONFIG = "timezone: UTC\ntypes:\n  r: {windows: [total, day, last_3h]}\n"
BOARD = "r:room"
MEMBERS = [f"m{i}" for i in range(300)]  # a walk of 25 pages of 12
PER_PARTITION = 600
BATCH = 30


def _stream(rng: random.Random, start: int) -> list[list[tuple[str, str, float, int]]]:
    """Per partition: (id, member, score, ts) in its order; ts in the hour before `start`; one in
    twenty ids also reaches the other partition (the same event, retried there)."""
    parts: list[list[tuple[str, str, float, int]]] = [[], []]
    for p in (0, 1):
        for i in range(PER_PARTITION):
            event = (
                f"p{p}-{i}",
                rng.choice(MEMBERS),
                float(rng.randint(1, 9)),
                start - rng.randrange(45 * 60_000),
            )
            parts[p].append(event)
            if rng.random() < 0.05:
                parts[1 - p].append(event)
    return parts


def _model(parts: list[list[tuple[str, str, float, int]]]) -> dict[str, tuple[float, int]]:
    """member -> (sum of its distinct events' scores, its latest event's ts)."""
    events = {e[0]: e for part in parts for e in part}
    out: dict[str, tuple[float, int]] = {}
    for _, member, score, ts in events.values():
        total, latest = out.get(member, (0.0, 0))
        out[member] = (total + score, max(latest, ts))
    return out


def _run_concurrently(tasks: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker or the preparer did not finish"
    assert not errors, errors


def _scores(client: redis.Redis, key: str) -> dict[str, float]:
    rows = cast("list[tuple[bytes, float]]", client.zrange(key, 0, -1, withscores=True))
    return {raw.decode()[TIE_WIDTH:]: score for raw, score in rows}


def test_two_workers_and_the_preparer_on_one_board_end_as_the_model(rclient):
    prefix = f"tw{time.time_ns()}:"
    real = int(time.time() * 1000)
    # the next hour's claim (worker/rolling.py claim_lead_ms): its next rolling period is prepared now
    start = real - real % HOUR + 2 * HOUR - claim_lead_ms(HOUR, len(MEMBERS))
    parts = _stream(random.Random(7), start)
    boards = parse_boards(CONFIG)
    workers = [Applier(rclient, boards, prefix, 3600, now_ms=lambda: start, epoch="E") for _ in (0, 1)]
    preparer = RollingPreparer(rclient, boards, prefix, clock=lambda: start, epoch=lambda: "E", owner="t")
    keys = BoardKeys(prefix, BOARD)
    # the board had events before: its current rolling period was prepared in the hour before
    rclient.set(keys.prepared(f"last_3h:{_hour(start)}"), "done")
    lockstep = threading.Barrier(2)
    halfway = threading.Barrier(3)
    claimed = threading.Event()
    finished = threading.Event()

    def worker(p: int) -> Callable[[], None]:
        source = Source("t", p, "topic-id", -1)
        events = [(UpdateEvent(i, BOARD, "r", m, Op.INCR, s, ts, None), ts) for i, m, s, ts in parts[p]]
        batches = range(0, len(events), BATCH)

        def run() -> None:
            for n, at in enumerate(batches):
                if n < len(batches) // 2:
                    lockstep.wait(60)  # both workers' batches at once: each meets the other's writes
                elif n == len(batches) // 2:
                    halfway.wait(60)
                    assert claimed.wait(60), (
                        "the preparer did not claim the next period"
                    )  # the rest races its walk
                chunk = events[at : at + BATCH]
                workers[p].apply(chunk, [Position(source, at + k, None) for k in range(len(chunk))])

        return run

    def prepare() -> None:
        halfway.wait(60)
        while not finished.is_set():
            busy = preparer.step()
            if busy or rclient.exists(keys.prepared(f"last_3h:{_hour(start + HOUR)}")):
                claimed.set()
            if not busy:
                finished.wait(0.01)

    def both() -> None:
        _run_concurrently([worker(0), worker(1)])
        finished.set()

    derived: list[str] = []  # how the workers' writes of the next period being prepared ended
    real_write = BoardStates._write

    def write(self: BoardStates, client: Any, writes: list[GuardedWrite]) -> list[Any]:
        replies = real_write(self, client, writes)
        derived.extend(type(r).__name__ for w, r in zip(writes, replies, strict=True) if w.unchanged)
        return replies

    with mock.patch.object(BoardStates, "_write", write):
        _run_concurrently([both, prepare])
    following = f"last_3h:{_hour(start + HOUR)}"
    wait_for(
        lambda: preparer.step() is False and rclient.get(keys.prepared(following)) == b"done", 30, "the walk"
    )

    want = _model(parts)
    sums = {m: s for m, (s, _) in want.items()}
    assert _scores(rclient, keys.rank("total")) == sums
    assert _scores(rclient, keys.rank(f"day:{_day(start)}")) == sums
    for period in (f"last_3h:{_hour(start)}", following):  # the next one: R[q] - B[q-2] + B[q+1]
        assert read_general(rclient, keys.tag, period, asc=False, tie="first") == want, period
    bucket = cast(
        "dict[bytes, bytes]", rclient.hgetall(keys.bucket(bucket_instance("last_3h", _hour(start))))
    )
    held = {m.decode(): parse_state(v) for m, v in bucket.items()}
    assert {m: (st.score, st.tie_ms) for m, st in held.items() if st is not None} == want
    stats = [w.states.stats for w in workers if w.states is not None]
    assert sum(s.natives for s in stats) > 0, stats  # decided and written as transactions before the claim
    # once the next period was being prepared, the workers wrote it too, as the walk went
    assert "Written" in derived, (derived, stats)
    assert sum(s.stale + s.conflicts for s in stats) > 0, stats  # each met the other's writes


def _hour(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H", time.gmtime(ms / 1000))


def _day(ms: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ms / 1000))
