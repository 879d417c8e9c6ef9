"""Rolling windows at the store level, hunted with hypothesis: random streams of incr, set, best
and delete, early and late, across hour and day boundaries in America/New_York (the autumn DST
change included), applied through the worker's Applier to real Redis while the worker's preparer
(worker/rolling.py) runs between steps. After every step each rolling window's current period,
the previous one and the next one (prepared ahead) must equal the independent model of
tests/rolling_model.py exactly: members, scores, ties and order (tests/redis_layout.py reads
the zsets and the tie index)."""

from __future__ import annotations

import itertools
import time
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.encoding import TIE_WIDTH
from tests.redis_layout import read_general
from tests.rolling_model import BoardType, Model
from worker.apply import Applier
from worker.rolling import RollingPreparer

pytestmark = pytest.mark.integration
HOUR = 3_600_000
DAY = 24 * HOUR
ZONE = "America/New_York"
CONFIG = f"""
timezone: {ZONE}
types:
  r: {{windows: [total, last_3h, last_2d], late_grace: 30m}}
  a: {{windows: [last_1h, last_2h], order: asc, tie_break: last, late_grace: 90m, retention: {{last_2h: 3}}}}
"""
TYPES = {
    "r": BoardType("r", ("total", "last_3h", "last_2d"), "desc", "first", 30 * 60_000),
    "a": BoardType("a", ("last_1h", "last_2h"), "asc", "last", 90 * 60_000, {"last_2h": 3}),
}
BOARDS = ("r:x", "a:y")
MEMBERS = ("m1", "m2", "m3", "m4")
_runs = itertools.count()

event_st = st.tuples(
    st.sampled_from(BOARDS),
    st.sampled_from(MEMBERS),
    st.sampled_from(["incr", "incr", "incr", "set", "best", "delete"]),
    st.integers(-3, 9),
    # ts: late (up to 3 h), now, or ahead (up to 25 h, past the next buckets)
    st.one_of(st.integers(-3 * HOUR, 0), st.just(0), st.integers(0, 25 * HOUR)),
)
# (clock advance, events, whether the preparer runs before them): a long advance without the
# preparer is an outage, after which the events of the backlog come before the catch-up
step_st = st.tuples(
    st.one_of(st.integers(0, 55 * 60_000), st.integers(60 * 60_000, 200 * 60_000)),
    st.lists(event_st, max_size=6),
    st.booleans(),
)


def _start() -> int:
    """Near the real clock (Redis expires keys by its own), at the New York autumn change's
    weekday and hour, so the repeated hour and a day boundary come within a few steps."""
    now = int(time.time() * 1000)
    return now - now % HOUR + 2 * HOUR + 20 * 60_000


_MODEL: list[Model] = []


def _fresh_model(tz: Any) -> Model:
    """The model with no events (its buckets, slow to build, are built once)."""
    if not _MODEL:
        start = _start()
        _MODEL.append(Model(tz, start - 40 * DAY, start + 60 * DAY, TYPES))
    model = _MODEL[0]
    model.clear()
    return model


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(steps=st.lists(step_st, min_size=4, max_size=14))
def test_rolling_periods_match_the_model(
    rclient: redis.Redis, steps: list[tuple[int, list[Any], bool]]
) -> None:
    run = next(_runs)
    prefix = f"rp{run}-{time.time_ns()}:"
    boards = parse_boards(CONFIG)
    now = [_start()]
    applier = Applier(rclient, boards, prefix, 3600, now_ms=lambda: now[0])
    preparer = RollingPreparer(
        rclient, boards, prefix, clock=lambda: now[0], epoch=lambda: applier.epoch, owner="t"
    )
    model = _fresh_model(boards.timezone)
    ids = itertools.count()
    seen: set[tuple[str, str]] = set()  # (window, period) checked while current
    for advance, events, prepare_first in steps:
        now[0] += advance
        while prepare_first and preparer.step():
            pass
        pairs = []
        for board, member, op, score, offset in events:
            ts = now[0] + offset
            event = {"id": f"e{next(ids)}", "board": board, "member": member, "op": op, "score": score}
            if not model.apply(event, ts, now[0]):
                continue  # beyond the allowed skew: the worker dead-letters it before applying
            pairs.append(
                (UpdateEvent(event["id"], board, board[0], member, Op(op), float(score), ts, None), ts)
            )
        applier.apply(pairs)
        while preparer.step():
            pass
        _check(rclient, prefix, boards, model, now=now[0], seen=seen)


def _check(
    client: redis.Redis, prefix: str, boards: Any, model: Model, *, now: int, seen: set[tuple[str, str]]
) -> None:
    """Each rolling window's current period, the previous one if it was checked while current
    (one an outage skipped stays as the outage left it), and the next one once prepared."""
    for board in BOARDS:
        board_type = boards.type_for(board[0])
        asc = board_type.order.value == "asc"
        for window in TYPES[board[0]].rolling:
            cur = model.current(window, now)
            previous = model.previous(window, cur)
            seen.add((window, cur))
            following = model.shift(window, cur, 1)
            for period in (previous, cur, following):
                if not model.readable(board, window, period, now) or (
                    period == previous and (window, period) not in seen
                ):
                    continue
                marker = f"{prefix}{{{board}}}:rp:{window}:{period}"
                if period == following and client.get(marker) != b"done":
                    continue  # not prepared yet (the bucket's last quarter has not come)
                got = read_general(
                    client, f"{prefix}{{{board}}}", f"{window}:{period}", asc, board_type.tie_break.value
                )
                want = model.members(board, window, period)
                assert got == want, (board, window, period, now)
                # Redis' own order of the rank zset (both types keep ties: a tie prefix)
                key = f"{prefix}{{{board}}}:z:{window}:{period}"
                rows = cast("list[bytes]", client.zrange(key, 0, -1, desc=not asc))
                order = [raw.decode()[TIE_WIDTH:] for raw in rows]
                assert order == [item.member for item in model.ranking(board, window, period)]
