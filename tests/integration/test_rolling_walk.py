"""Deterministic reproducers of the rolling preparer's races (worker/rolling.py), on real Redis
through the worker's Applier and RollingPreparer with an injected clock, checked against the
independent model of tests/rolling_model.py.

1. A walk that outlives its source period. Period q+1 of `last_<N>h` is derived as
   R[q] - B[q-N+1] + B[q+1] while the preparer walks it late in bucket q. Once the clock has
   passed q's late grace, an event late for q (its bucket inside q+1's window) counts in its
   bucket and in q+1 but not in q, so R[q] no longer holds what q+1 sums. A walk still deriving
   then overwrote q+1 with a state that lacks the late event: the intermittent
   `test_rolling_oracle[cluster]` failure of cba386c (`ladder:hot last_6h:2027-11-25T18`: l00 at
   -1 where the model says -4), whose walk, begun at 17:59:59.999, derived l00 after the clock had
   moved to 18:26 and a late -3 for bucket 17 had been applied. The test stops the walk where it
   reads the source's members, moves the clock past the grace and applies the late event there.
2. A period marked prepared before its successor is registered. The walk set the marker `done`
   and only then added the board to the next bucket's due set, so a worker stopped between the
   two left a board whose next period nobody prepares (its members that no event touches are
   missing from it at the boundary), and a reader of the due set could miss the board although
   its period was done (what let the oracle's boundary wait pass before the walk above).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store import scan
from tests.redis_layout import read_general
from tests.rolling_model import HOUR, MINUTE, BoardType, Model
from worker import rolling
from worker.apply import Applier
from worker.rolling import RollingPreparer

# one Redis server: the preparer's calls are the same on a cluster (test_rolling_oracle.py runs
# them there), these reproducers are about when it makes them
pytestmark = pytest.mark.integration
ZONE = "UTC"
WINDOW = "last_6h"
BOARD = "ladder:hot"


def config(grace_s: int) -> str:
    ladder = f"{{windows: [total, {WINDOW}], order: asc, tie_break: last, late_grace: {grace_s}s}}"
    return f"timezone: {ZONE}\ntypes:\n  ladder: {ladder}\n"


class Scene:
    """One board fed through the Applier and prepared by a RollingPreparer, both on `now`."""

    def __init__(self, client: redis.Redis, prefix: str, grace_s: int = 600, page: int = 25) -> None:
        self.client, self.prefix = client, prefix
        wall = int(time.time() * 1000)
        self.q = wall - wall % HOUR + 3 * HOUR  # bucket q's start: ahead of Redis' own clock
        self.now = self.q + 20 * MINUTE
        boards = parse_boards(config(grace_s))
        self.applier = Applier(client, boards, prefix, 3600, now_ms=lambda: self.now)
        self.preparer = RollingPreparer(
            client, boards, prefix, clock=lambda: self.now, epoch=lambda: self.applier.epoch, owner="t",
            page=page,
        )  # fmt: skip
        types = {"ladder": BoardType("ladder", ("total", WINDOW), "asc", "last", grace_s * 1000)}
        self.model = Model(boards.timezone, self.q - 30 * 24 * HOUR, self.q + 30 * 24 * HOUR, types)
        self.ids = 0

    def send(self, member: str, score: float, ts: int) -> None:
        self.ids += 1
        event = {"id": f"e{self.ids}", "board": BOARD, "member": member, "op": "incr", "score": score}
        assert self.model.apply(event, ts, self.now)
        pair = (UpdateEvent(f"e{self.ids}", BOARD, "ladder", member, Op.INCR, float(score), ts, None), ts)
        self.applier.apply([pair])

    def prepare(self) -> None:
        while self.preparer.step():
            pass

    def period(self, offset: int) -> str:
        return self.model.shift(WINDOW, self.model.current(WINDOW, self.q), offset)

    def marker(self, period: str) -> bytes | None:
        return self.client.get(f"{self.prefix}{{{BOARD}}}:rp:{WINDOW}:{period}")  # type: ignore[return-value]

    def assert_exact(self, period: str) -> None:
        got = read_general(self.client, f"{self.prefix}{{{BOARD}}}", f"{WINDOW}:{period}", True, "last")
        assert got == self.model.members(BOARD, WINDOW, period), (period, self.now)


@pytest.fixture
def scene(rclient: redis.Redis, settings: Any) -> Scene:
    return Scene(rclient, settings.key_prefix)


def test_a_walk_still_running_after_the_boundary_counts_late_events(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = scene.q
    scene.send("l00", 5, q + 10 * MINUTE)  # in bucket q: R[q], and q+1 once prepared
    scene.send("l01", 2, q + 15 * MINUTE)
    # the walk of q+1 begins at q's last ms; where it reads q's members the clock has moved to
    # 26 minutes into bucket q+1 (q closed, its grace over) and a late event for bucket q came
    original: Callable[..., Iterator[list[str]]] = scan.member_pages
    late: list[int] = []

    def pages(*args: Any, **kwargs: Any) -> Iterator[list[str]]:
        if not late:
            scene.now = q + HOUR + 26 * MINUTE
            late.append(q + HOUR - 11 * MINUTE)
            scene.send("l00", -3, late[0])  # counts in bucket q and in q+1, not in q (closed)
            scene.send("l00", -1, q + HOUR + 2 * MINUTE)  # bucket q+1
        return original(*args, **kwargs)

    monkeypatch.setattr(scan, "member_pages", pages)
    scene.now = q + HOUR - 1
    scene.prepare()
    assert late, "the walk never read the source period's members"
    assert scene.marker(scene.period(1)) == b"done"
    # l00: 5 - 3 - 1 (the late -3 is in no other period: q had closed)
    assert scene.model.members(BOARD, WINDOW, scene.period(1))["l00"][0] == 1
    scene.assert_exact(scene.period(0))
    scene.assert_exact(scene.period(1))
    assert scene.preparer.stats.overtaken == 1


def test_a_walk_overtaken_mid_way_rebuilds_the_members_it_had_not_reached(
    rclient: redis.Redis, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One member a page: after the first page is derived the clock passes q's grace and late
    events for bucket q come, for that member and for one the walk has not reached."""
    scene = Scene(rclient, settings.key_prefix, page=1)
    q = scene.q
    for i in range(4):
        scene.send(f"l{i:02d}", 5, q + (10 + i) * MINUTE)
    derive = scene.preparer._derive
    first: list[str] = []

    def derive_then_strike(keys: Any, board_type: Any, call: Any, members: list[str], **kw: Any) -> bool:
        published = derive(keys, board_type, call, members, **kw)
        if not first:
            first.extend(members)
            later = next(m for m in ("l00", "l01", "l02", "l03") if m not in members)
            scene.now = q + HOUR + 26 * MINUTE
            for member in (members[0], later):
                scene.send(member, -3, q + HOUR - 11 * MINUTE)  # late for q: in bucket q and q+1
            scene.send(later, -1, q + HOUR + 2 * MINUTE)
        return published

    monkeypatch.setattr(scene.preparer, "_derive", derive_then_strike)
    scene.now = q + HOUR - 1
    scene.prepare()
    assert len(first) == 1 and scene.marker(scene.period(1)) == b"done"
    scores = sorted(score for score, _ in scene.model.members(BOARD, WINDOW, scene.period(1)).values())
    assert scores == [1, 2, 5, 5]  # the two the late events reached: 5 - 3 (- 1)
    scene.assert_exact(scene.period(0))
    scene.assert_exact(scene.period(1))
    assert scene.preparer.stats.overtaken == 1


@pytest.mark.parametrize(("before_end_ms", "overtaken"), [(5_000, 0), (500, 1)])
def test_a_short_grace_stops_the_derive_a_margin_before_any_event_can_miss_the_period(
    rclient: redis.Redis, settings: Any, before_end_ms: int, overtaken: int
) -> None:
    """late_grace 0: an event is late for q from q's end on, so the walk derives only until
    CLOCK_MARGIN_MS (1 s) before it; after, it rebuilds."""
    scene = Scene(rclient, settings.key_prefix, grace_s=0)
    scene.send("l00", 5, scene.q + 10 * MINUTE)
    scene.send("l01", 3, scene.q + 50 * MINUTE)
    scene.now = scene.q + HOUR - before_end_ms
    scene.prepare()
    assert scene.marker(scene.period(1)) == b"done"
    assert scene.preparer.stats.overtaken == overtaken
    scene.assert_exact(scene.period(1))


def test_a_prepared_period_is_registered_for_its_successor_before_it_is_marked_done(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = scene.q
    scene.now = q - 40 * MINUTE
    scene.send("l00", 5, scene.now)  # bucket q-1: the board is due in q-1 and q, not q+1
    scene.now = q - 1
    scene.prepare()  # q is walked, and carries l00: due in q
    scene.now = q + HOUR - 1  # q's last quarter: q+1 is walked
    due = f"{scene.prefix}{{rolling}}:h:{scene.period(1)}"
    real_sadd = scene.client.sadd
    stopped: list[str] = []

    def sadd(key: str, *values: Any) -> Any:
        if key == due and not stopped:  # the worker stops here, once
            stopped.append(key)
            raise redis.ConnectionError("the worker stopped")
        return real_sadd(key, *values)

    monkeypatch.setattr(scene.client, "sadd", sadd)
    with pytest.raises(redis.ConnectionError):
        scene.prepare()
    assert stopped
    registered = scene.client.sismember(due, BOARD)
    # a period marked done names its board in the due set of the bucket it begins with
    assert scene.marker(scene.period(1)) != b"done" or registered, (scene.marker(scene.period(1)), due)
    monkeypatch.undo()
    scene.prepare()  # the next pass finishes it
    assert scene.marker(scene.period(1)) == b"done"
    # nothing touches the board after bucket q-1: its period q+2 still carries l00
    scene.now = q + 2 * HOUR - 1
    scene.prepare()
    scene.now = q + 2 * HOUR
    scene.prepare()
    assert scene.model.members(BOARD, WINDOW, scene.period(2)) == {"l00": (5, q - 40 * MINUTE)}
    scene.assert_exact(scene.period(2))


def _claimed_only_from(scene: Scene, lead_ms: int, before_claim: Callable[[], None] = lambda: None) -> None:
    """Ten members in bucket q; q+1 is not claimed lead_ms + 1 ms before q ends, and is, whole,
    lead_ms before it. `before_claim` runs between the two."""
    q = scene.q
    for i in range(10):
        scene.send(f"l{i:02d}", 5, q + 10 * MINUTE)
    scene.now = q + HOUR - lead_ms - 1
    scene.prepare()
    assert scene.marker(scene.period(1)) is None
    before_claim()
    scene.now += 1
    scene.prepare()
    assert scene.marker(scene.period(1)) == b"done"


def test_a_board_is_claimed_a_twentieth_of_the_bucket_before_its_end_and_events_spare_it_until_then(
    scene: Scene,
) -> None:
    """The shorter the stretch after the claim, in which every event writes the next period too,
    the cheaper a rolling window: a small board's walk takes milliseconds, so it is claimed in
    the bucket's last twentieth (3 minutes of an hour), not its last quarter."""
    # before the claim the event spares q+1 (the walk carries it); after it, it writes q+1 itself
    _claimed_only_from(scene, 3 * MINUTE, lambda: scene.send("l00", 2, scene.now))
    scene.send("l01", 4, scene.now)
    scene.assert_exact(scene.period(1))


def test_a_board_whose_walk_takes_longer_is_claimed_earlier(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """claim_lead_ms by the board's size, read from Redis: with a walk priced at 15 s a member,
    ten members are claimed 10 minutes before the end (LEAD_SAFETY 4 x 10 x 15 s)."""
    monkeypatch.setattr(rolling, "WALK_US", 15_000_000)
    _claimed_only_from(scene, 10 * MINUTE)
    scene.assert_exact(scene.period(1))
