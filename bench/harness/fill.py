"""A board filled through the worker's own write path (Applier), as the read benchmarks need it."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import orjson
import redis

from bench.common import BenchError, Result
from common.boards import BoardsConfig
from common.events import Op, UpdateEvent
from common.store.encoding import Status
from worker.apply import Applier

FILL_BATCH = 500
META_SHARE = 20  # one member in 20 (5 %) carries a meta JSON
ID_WINDOW_S = 3600  # outlives the run: no expiry churn in Redis while measuring


def board_applier(client: redis.Redis, boards: BoardsConfig, key_prefix: str) -> Applier:
    """The worker's own write path, as the bench drives it (no stream fences)."""
    return Applier(client, boards, key_prefix, ID_WINDOW_S)


def set_event(event_id: str, board: str, member: str, score: float, meta: bytes | None = None) -> UpdateEvent:
    """A `set` of `member` to `score` on `board` (its type is the id's first part)."""
    return UpdateEvent(event_id, board, board.split(":", 1)[0], member, Op.SET, score, None, meta)


def apply_set(applier: Applier, event: UpdateEvent, ts_ms: int | None = None) -> int:
    """Apply one event (at `ts_ms`, default now); the board's seq after it. BenchError unless
    it was applied."""
    outcome = applier.apply([(event, int(time.time() * 1000) if ts_ms is None else ts_ms)])[0]
    if outcome.status is not Status.APPLIED:
        raise BenchError(f"{event.id}: {outcome.status.name}, not applied")
    return outcome.seq


def fill(
    client: redis.Redis,
    boards: BoardsConfig,
    key_prefix: str,
    *,
    board: str,
    members: Sequence[str],
    rng: random.Random,
) -> Result:
    """Every member once on `board` through the worker's own write path (Applier, `set`),
    FILL_BATCH events per apply. Scores are gift totals (Pareto: many small, a few huge);
    one member in META_SHARE has a meta JSON."""
    applier = board_applier(client, boards, key_prefix)
    now_ms = int(time.time() * 1000)
    started = time.monotonic()
    applied = 0
    for start in range(0, len(members), FILL_BATCH):
        batch: list[tuple[UpdateEvent, int]] = []
        for i in range(start, min(start + FILL_BATCH, len(members))):
            member = members[i]
            meta = orjson.dumps({"name": f"Player {i}", "lvl": i % 60}) if i % META_SHARE == 0 else None
            score = float(int(100 * rng.paretovariate(1.2)))
            event = set_event(f"fill-{i}", board, member, score, meta)
            batch.append((event, now_ms - rng.randrange(86_400_000)))
        applied += sum(1 for o in applier.apply(batch) if o.status is Status.APPLIED)
    elapsed = time.monotonic() - started
    if applied != len(members):
        raise BenchError(f"fill: {applied} of {len(members)} events applied")
    return {
        "members": len(members),
        "fill_s": round(elapsed, 2),
        "members_per_s": round(applied / elapsed, 1),
    }
