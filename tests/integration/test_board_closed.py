"""An activity's end (`ends_at`) against real Redis: what the worker's clock says at the first
delivery decides, and the fence keeps that verdict: a redelivery of an event applied before the
end plus the grace stays a redelivery (reporting the member's state, so hot nodes get it), a
producer retry of it stays a duplicate, and a refused event is refused again."""

from __future__ import annotations

import pytest

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.encoding import Status
from worker.apply import Applier, Position, Source

pytestmark = pytest.mark.integration

END = 1_900_000_000_000  # 2030-03-17
GRACE = 600_000
CONFIG = (
    "types:\n  promo: {windows: [total, day], late_grace: 10m, ends_at: '2030-03-17T17:46:40Z'}\n"
    "hot:\n  - {board: 'promo:x'}\n"
)
SRC = Source("update_rank", 0, "topic-a", -1)


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def ev(eid: str, member: str = "m") -> UpdateEvent:
    return UpdateEvent(eid, "promo:x", "promo", member, Op.INCR, 5.0, END - 60_000, None)


def test_the_verdict_at_the_first_delivery_holds(rclient, settings):
    clock = Clock(END + GRACE - 1)  # processed just before end + grace: still counts
    applier = Applier(rclient, parse_boards(CONFIG), settings.key_prefix, 3600, now_ms=clock, epoch="E")
    (first,) = applier.apply([(ev("a"), END - 60_000)], [Position(SRC, 1, None)])
    assert first.status is Status.APPLIED
    (at_end,) = applier.apply([(ev("b"), END)], [Position(SRC, 2, None)])  # ts at the end
    assert (at_end.status, at_end.failed_as) == (Status.FAILED, "board_closed")

    clock.now = END + GRACE  # from here on every new event is refused
    again = applier.apply(
        [(ev("a"), END - 60_000), (ev("b"), END), (ev("a"), END - 60_000), (ev("c"), END - 60_000)],
        [Position(SRC, 1, None), Position(SRC, 2, None), Position(SRC, 3, None), Position(SRC, 4, None)],
    )
    assert [(o.status, o.failed_as) for o in again] == [
        (Status.REDELIVERED, None),  # applied before the end: a redelivery, not a dead letter
        (Status.FAILED, "board_closed"),  # refused then, refused again
        (Status.DUPLICATE, None),  # a producer retry of the applied one
        (Status.FAILED, "board_closed"),  # new, after end + grace
    ]
    # the redelivery and the retry report the member's state, so hot nodes get it from either
    state = again[0].states["total"]
    assert state is not None and state.score == 5.0
    assert again[2].states["total"] == state
    assert [o.late_windows for o in again] == [0, 0, 0, 0]
