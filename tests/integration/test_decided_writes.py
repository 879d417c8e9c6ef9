"""Events the worker decides itself (worker/decide.py), written either way (native commands in a
transaction, common/store/native.py, or guarded.lua): Redis ends byte for byte as apply.lua
leaves it, and the guard is what keeps a worker from acting on a stale state of a board (a second
worker, a zombie, apply.lua's writes): each test runs once more without the guard (its expected
seq and fence replaced by what Redis holds) and shows the result then is wrong."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, cast
from unittest import mock

import pytest
import redis

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store import periodmark
from common.store.apply import ApplyScript
from common.store.encoding import TIE_WIDTH, Status
from common.store.guarded import GuardedWrite, IdBucket, IndexBucket
from common.store.keys import BoardKeys, index_expiry, string_slot, window_instance
from common.store.native import EXPIRY_MARGIN_MS, MAX_BOARDS, NativeWrites
from common.store.xhash import bucket
from tests.helpers import BOTH_TOPOLOGIES, wait_for
from worker.apply import DECIDED_ROLLING_COUNTS_PER_CALL, ROLLING_COUNTS_PER_CALL, Applier, Position, Source
from worker.boardstate import BoardStates
from worker.rolling import RollingPreparer
from worker.rolling_slots import RollingSlots

pytestmark = pytest.mark.integration

CONFIG = """
timezone: UTC
types:
  g: {windows: [total, day, week]}
  asc: {windows: [total, hour], order: asc, tie_break: last}
  r: {windows: [total, day], score_range: [-1000, 1000000]}
  n: {windows: [total], tie_break: none}
  cap: {windows: [total, day], max_members: 5}
  capr: {windows: [total, day], max_members: 4, order: asc, score_range: [-1000, 1000000]}
  roll: {windows: [total, last_3h]}
  rollcap: {windows: [total, last_3h], max_members: 5}
hot:
  - board: g:hot
"""
BOARDS = parse_boards(CONFIG)
SRC = [Source("t", p, "topic-id", -1) for p in range(3)]


WAYS = {"native": True}  # how the decided writes go: natively (else guarded.lua)


@pytest.fixture(autouse=True, params=["native", "script"])
def way(request: pytest.FixtureRequest) -> Iterator[str]:
    WAYS["native"] = request.param == "native"
    yield request.param
    WAYS["native"] = True


def applier(
    client: redis.Redis,
    prefix: str,
    cells: int = 1_000_000,
    cap: int = 128,
    window_s: int = 3600,
    *,
    now: int | None = None,
) -> Applier:
    """`now`: the worker's clock, fixed (rolling windows' periods and buckets follow it)."""
    clock = {} if now is None else {"now_ms": lambda: now}
    a = Applier(client, BOARDS, prefix, window_s, epoch="E", state_cells=cells, **clock)
    a.listpack_cap = cap
    if a.states is not None:
        a.states.native = WAYS["native"]
        a.states.native_min_events = 1  # every chunk, however small
    return a


def ev(
    board: str, member: str, score: float, eid: str, *, op: Op = Op.INCR, meta: bytes | None = None
) -> UpdateEvent:
    return UpdateEvent(
        id=eid,
        board=board,
        board_type=board.split(":", maxsplit=1)[0],
        member=member,
        op=op,
        score=score,
        ts=None,
        meta=meta,
    )


def score_of(client: Any, zset: str, member: str) -> float | None:
    rows = client.zrange(zset, 0, -1, withscores=True)
    return next((float(s) for m, s in rows if m.decode().endswith(member)), None)


def score(client: Any, prefix: str, board: str, member: str) -> float | None:
    return score_of(client, BoardKeys(prefix, board).rank("total"), member)


@contextmanager
def altered(alter: Callable[[GuardedWrite], None]) -> Iterator[None]:
    """Every guarded write altered by `alter` just before it is sent (a check taken away)."""
    real = BoardStates._write

    def write(self: BoardStates, client: Any, writes: list[GuardedWrite]) -> list[Any]:
        for w in writes:
            alter(w)
        return real(self, client, writes)

    with mock.patch.object(BoardStates, "_write", write):
        yield


def unguarded(client: Any) -> AbstractContextManager[None]:
    """The guard taken away: every guarded write expects what Redis holds at the moment."""

    def expect_what_redis_holds(write: GuardedWrite) -> None:
        write.expect_seq = int(client.get(write.keys.seq) or 0)
        held = client.hmget(write.keys.fence, [f for f, _ in write.fence]) if write.fence else []
        write.fence = [(f, (v or b"").decode()) for (f, _), v in zip(write.fence, held, strict=True)]
        write.directories = [(d, client.strlen(d)) for d, _ in write.directories]

    return altered(expect_what_redis_holds)


NOW = int(time.time() * 1000)
HOUR = 3_600_000


def prepared(client: Any, prefix: str, board: str, now: int = NOW, *, begun: bool = False) -> None:
    """As the preparer leaves a board that had events before: its rolling periods up to the
    current one whole (marked "done"); the next one not begun (`begun`: its walk under way)."""
    keys = BoardKeys(prefix, board)
    for back in range(-1 if begun else 0, 3):
        hour = time.strftime("%Y-%m-%dT%H", time.gmtime((now - back * HOUR) / 1000))
        client.set(keys.prepared(window_instance("last_3h", hour)), "busy:preparer" if back < 0 else "done")


def _turns(client: redis.Redis, prefix: str) -> tuple[float | None, int]:
    """Worker A keeps the board's state, B writes the board from another partition, A writes again."""
    a, b = applier(client, prefix), applier(client, prefix)
    board = "g:turns"
    a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    b.apply([(ev(board, "m", 1, "2"), NOW)], [Position(SRC[1], 0, None)])
    a.apply([(ev(board, "m", 1, "3"), NOW)], [Position(SRC[0], 1, None)])
    assert a.states is not None
    return score(client, prefix, board, "m"), a.states.stats.conflicts


@BOTH_TOPOLOGIES
def test_a_state_another_worker_changed_is_read_again(rclient, settings):
    # A's write is refused once, then A reads the board and decides again
    assert _turns(rclient, settings.key_prefix + "a:") == (3, 1)
    with unguarded(rclient):
        assert _turns(rclient, settings.key_prefix + "b:") == (2, 0)  # A added 1 to what it remembered


def _zombie(client: redis.Redis, prefix: str) -> tuple[list[Status], float | None]:
    """A applied offsets 0-4 of a partition; it moved to B, which applied 0-14; A, not yet told,
    applies 5-9 again from what it kept (a fence at 4), after the 1 s id window: only the fence
    can tell them from new events."""
    a, b = applier(client, prefix, window_s=1), applier(client, prefix, window_s=1)
    board = "g:zombie"
    events = [(ev(board, "m", 1, f"z{i}"), NOW) for i in range(15)]
    where = [Position(SRC[0], i, None) for i in range(15)]
    a.apply(events[:5], where[:5])
    b.apply(events, where)
    applied_at = int(client.time()[0])
    wait_for(lambda: int(client.time()[0]) >= applied_at + 2, 10, "the id window to pass")
    late = a.apply(events[5:10], where[5:10])
    return [o.status for o in late], score(client, prefix, board, "m")


@BOTH_TOPOLOGIES
def test_a_zombie_with_a_stale_fence_changes_nothing(rclient, settings):
    statuses, total = _zombie(rclient, settings.key_prefix + "a:")
    assert statuses == [Status.REDELIVERED] * 5
    assert total == 15
    with unguarded(rclient):
        statuses, total = _zombie(rclient, settings.key_prefix + "b:")
    assert statuses == [Status.APPLIED] * 5  # counted twice...
    assert total == 10  # ...onto what A remembered: B's last five lost


def _between(client: redis.Redis, prefix: str, reset: bool = False) -> tuple[float | None, int]:
    """A reads the board (its transaction's first round trip), B writes it, A's transaction runs
    (`reset`: on a connection dropped meanwhile, which redis-py would silently open again)."""
    a, b = applier(client, prefix), applier(client, prefix, cells=0)
    board = "g:between"
    a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    real = NativeWrites._transaction
    struck: list[bool] = []

    def after_the_reads(self: NativeWrites, board_tx: Any) -> Any:
        if not struck:
            struck.append(True)
            b.apply([(ev(board, "m", 10, "2"), NOW)], [Position(SRC[1], 0, None)])
            if reset:
                board_tx.conn.disconnect()
        return real(self, board_tx)

    with mock.patch.object(NativeWrites, "_transaction", after_the_reads):
        a.apply([(ev(board, "m", 1, "3"), NOW)], [Position(SRC[0], 1, None)])
    assert a.states is not None
    return score(client, prefix, board, "m"), a.states.stats.conflicts


@BOTH_TOPOLOGIES
def test_a_write_between_the_reads_and_the_transaction_makes_redis_refuse_it(rclient, settings, way):
    """The transaction's WATCH: another worker's write lands after A read the board and before
    A's MULTI/EXEC; Redis runs none of A's writes, A reads again and decides again. Without the
    WATCH, A's writes go in over B's: B's 10 is lost."""
    if way == "script":
        pytest.skip("a guarded.lua call reads and writes in one step: nothing lands in between")
    assert _between(rclient, settings.key_prefix + "a:") == (12, 1)
    real = NativeWrites._reads

    def unwatched(req: GuardedWrite) -> list[Any]:
        reads = real(req)
        return [("PING",), *reads[1:]]  # the same replies' places, no WATCH

    with mock.patch.object(NativeWrites, "_reads", staticmethod(unwatched)):
        assert _between(rclient, settings.key_prefix + "b:") == (2, 0)


def _next_period(
    client: redis.Redis,
    prefix: str,
    *,
    race: bool = False,
    alter: Callable[[GuardedWrite], None] | None = None,
) -> tuple[float | None, int]:
    """A applied an event to a board with a rolling window while its next period's preparation
    had not begun (events leave that period to the preparer's walk), and keeps the board's state.
    Then the preparer claims the next period (its marker): before A's next chunk (`race`: after
    A's reads, before its transaction). From then on events write the next period too, absolute:
    A's next event must reach it (2, the member's current total over the window); A decides it
    (no chunk goes to apply.lua). `alter`: what becomes of A's second write (a check taken away)."""
    a = applier(client, prefix, now=NOW)
    board = "roll:next"
    prepared(client, prefix, board)
    markers: list[str] = []
    with altered(lambda w: markers.extend(w.unstarted)):
        a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    (marker,) = set(markers)
    real = NativeWrites._transaction

    def claimed_meanwhile(self: NativeWrites, board_tx: Any) -> Any:
        client.set(marker, "busy:preparer")
        return real(self, board_tx)

    with ExitStack() as stack:
        if race:
            stack.enter_context(mock.patch.object(NativeWrites, "_transaction", claimed_meanwhile))
        else:
            client.set(marker, "busy:preparer")
        if alter is not None:
            stack.enter_context(altered(alter))
        a.apply([(ev(board, "m", 1, "2"), NOW)], [Position(SRC[0], 1, None)])
    assert a.states is not None
    following = marker.split(":rp:", 1)[1]
    return score_of(client, BoardKeys(prefix, board).rank(following), "m"), a.states.stats.fallbacks


@BOTH_TOPOLOGIES
def test_a_next_rolling_period_being_prepared_is_written_by_every_event(rclient, settings, way):
    """A next rolling period whose preparation began is written by every event; the worker kept
    the board while it had not begun, and the write (a transaction, or guarded.lua) checks the
    period's marker: refused, the board is read again, the claim found, and the worker writes
    the period absolute through guarded.lua. Without that check the event skips the next period
    and the preparer's walk, which already began, never adds it."""
    assert _next_period(rclient, settings.key_prefix + "a:") == (2, 0)

    def unchecked(write: GuardedWrite) -> None:
        write.unstarted = []

    assert _next_period(rclient, settings.key_prefix + "b:", alter=unchecked)[0] is None


def test_a_capped_board_whose_next_period_is_being_prepared_skips_its_reads_until_it_begins(
    rclient, settings, way
):
    """With max_members, a next rolling period being prepared is apply.lua's to write: once the
    worker found one, the board's chunks go to apply.lua without reading the board again; an
    hour later that period is the current one, the chunks name the next, and the worker decides
    them again."""
    clock = [NOW]
    a = Applier(rclient, BOARDS, settings.key_prefix, 3600, epoch="E", now_ms=lambda: clock[0])
    assert a.states is not None
    a.states.native, a.states.native_min_events = WAYS["native"], 1
    board, stats = "rollcap:begun", a.states.stats
    prepared(rclient, settings.key_prefix, board)
    markers: list[str] = []
    with altered(lambda w: markers.extend(w.unstarted)):
        a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    rclient.set(markers[0], "busy:preparer")
    a.apply([(ev(board, "m", 1, "2"), NOW)], [Position(SRC[0], 1, None)])  # read, found: apply.lua's
    before = (stats.hits, stats.misses, stats.fallbacks)
    a.apply([(ev(board, "m", 1, "3"), NOW)], [Position(SRC[0], 2, None)])
    assert (stats.hits, stats.misses, stats.fallbacks) == (before[0], before[1], before[2] + 1)
    following = markers[0].split(":rp:", 1)[1]
    assert score_of(rclient, BoardKeys(settings.key_prefix, board).rank(following), "m") == 3
    rclient.set(markers[0], "done")  # the walk ended; an hour later it is the current period
    clock[0] += HOUR
    written = stats.natives + stats.scripted
    a.apply([(ev(board, "m", 1, "4"), clock[0])], [Position(SRC[0], 3, None)])
    assert stats.natives + stats.scripted == written + 1
    assert score_of(rclient, BoardKeys(settings.key_prefix, board).rank(following), "m") == 4


def _rebuilt(client: redis.Redis, prefix: str) -> float | None:
    """A board's current rolling period that nobody prepared (its marker absent: the preparers
    were down): an event of the hour before sits in its bucket, not yet in the period. A worker
    applies an event; the preparer's catch-up rebuilds the period from its buckets (outside the
    seq); the worker applies another. The period must hold all three: 3."""
    board, member = "roll:rebuilt", "m"
    keys = BoardKeys(prefix, board)
    before = applier(client, prefix, cells=0, now=NOW - HOUR)
    before.apply([(ev(board, member, 1, "1"), NOW - HOUR)], [Position(SRC[0], 0, None)])
    a = applier(client, prefix, now=NOW)
    a.apply([(ev(board, member, 1, "2"), NOW)], [Position(SRC[0], 1, None)])
    preparer = RollingPreparer(client, BOARDS, prefix, clock=lambda: NOW, epoch=lambda: "E", owner="t")
    board_type = BOARDS.types["roll"]
    window = board_type.window("last_3h")
    call = preparer._rebuild_call(
        board_type, window, RollingSlots(BOARDS.timezone).bucket_at(window, NOW - HOUR)
    )
    preparer._derive(keys, board_type, call, [member], window=window.name, op="rebuild")
    a.apply([(ev(board, member, 1, "3"), NOW)], [Position(SRC[0], 2, None)])
    return score_of(client, keys.rank(call[0].name), member)


@BOTH_TOPOLOGIES
def test_a_rolling_period_the_preparer_has_not_made_whole_is_apply_luas(rclient, settings):
    """The preparer may still rebuild a period it has not marked done, outside the seq: the
    worker must not keep it (its kept state would miss the rebuild). Without that rule the
    worker's third event is added to what it kept: the rebuild is lost."""
    assert _rebuilt(rclient, settings.key_prefix + "a:") == 3
    with mock.patch("worker.boardstate._unprepared", return_value=False):
        assert _rebuilt(rclient, settings.key_prefix + "b:") == 2


@BOTH_TOPOLOGIES
def test_a_claim_between_the_reads_and_the_transaction_makes_redis_refuse_it(rclient, settings, way):
    """The transaction WATCHes the next period's marker: a claim that lands after the worker
    read it absent and before EXEC makes Redis run none of the writes; the board is read again,
    the claim found, and the worker writes the period absolute. Without the WATCH the event
    misses the next period."""
    if way == "script":
        pytest.skip("a guarded.lua call reads and writes in one step: nothing lands in between")
    assert _next_period(rclient, settings.key_prefix + "a:", race=True) == (2, 0)
    real = NativeWrites._reads

    def unwatched(req: GuardedWrite) -> list[Any]:
        return [("PING",), *real(req)[1:]]

    with mock.patch.object(NativeWrites, "_reads", staticmethod(unwatched)):
        assert _next_period(rclient, settings.key_prefix + "b:", race=True)[0] is None


def _walk_meanwhile(
    client: redis.Redis,
    prefix: str,
    board: str,
    walked: list[str],
    alter: Callable[[GuardedWrite], None] | None,
    *,
    others: int = 0,
) -> tuple[BoardKeys, str]:
    """Member m (and `others` more) has an event in the current rolling period (ts NOW - 60 s)
    before the next period's preparation began; the preparer claims it. A's next event for m
    (ts NOW) writes m there too; between A's reads of that period and A's write, the preparer's
    walk derives `walked` there (from the state before A's event). `alter`: A's writes' checks.
    The board's keys and the next period's name."""
    keys, board_type = BoardKeys(prefix, board), BOARDS.types["roll"]
    window = board_type.window("last_3h")
    slots = RollingSlots(BOARDS.timezone)
    derived, deps = slots.derived(board_type, window, slots.bucket_at(window, NOW))
    prepared(client, prefix, board)
    a = applier(client, prefix, now=NOW)
    first = [(ev(board, m, 1, f"e-{m}"), NOW - 60_000) for m in ["m", *(f"o{i}" for i in range(others))]]
    a.apply(first, [Position(SRC[0], i, None) for i in range(len(first))])
    client.set(keys.prepared(derived.name), "busy:preparer")
    preparer = RollingPreparer(client, BOARDS, prefix, clock=lambda: NOW, epoch=lambda: "E", owner="t")
    done: list[bool] = []

    def meanwhile(w: GuardedWrite) -> None:
        if not done and w.unchanged:  # after its reads, before the write
            done.append(True)
            preparer._derive(
                keys, board_type, [derived, *deps], walked, window=derived.name.split(":", 1)[0], op="derive"
            )
        if alter is not None:
            alter(w)

    with altered(meanwhile):
        a.apply([(ev(board, "m", 1, "again"), NOW)], [Position(SRC[0], len(first), None)])
    assert done, "the worker never wrote the next period"
    return keys, derived.name


def _walked_meanwhile(
    client: redis.Redis, prefix: str, alter: Callable[[GuardedWrite], None] | None = None
) -> list[tuple[str, float]]:
    """The walk derives m itself (its tie there is the earlier event's). The period must end with
    m once, at 2 and its latest event: [("m", 2.0)]."""
    keys, following = _walk_meanwhile(client, prefix, "roll:walked", ["m"], alter)
    rows = cast("list[tuple[bytes, float]]", client.zrange(keys.rank(following), 0, -1, withscores=True))
    return [(m.decode()[TIE_WIDTH:], s) for m, s in rows]


@BOTH_TOPOLOGIES
def test_a_walk_between_the_reads_and_the_write_of_a_next_period_makes_redis_refuse_it(
    rclient, settings, way
):
    """The preparer writes a next period being prepared outside the seq: the worker's write
    checks that the period's tie index still holds, for each member it writes, the tie it read
    (and its directory). The walk's derive lands between A's reads and A's write: refused, A
    reads again and writes over the walk's entry. Without the check m is in the period twice
    (the walk's entry, at the earlier event's tie, and A's)."""
    assert _walked_meanwhile(rclient, settings.key_prefix + "a:") == [("m", 2.0)]

    def unchecked(write: GuardedWrite) -> None:
        write.unchanged = []

    assert len(_walked_meanwhile(rclient, settings.key_prefix + "b:", unchecked)) == 2


def _split_meanwhile(
    client: redis.Redis, prefix: str, alter: Callable[[GuardedWrite], None] | None = None
) -> Any:
    """60 more members; the walk derives those, not m, and the next period's tie index (empty at
    A's reads: one bucket, no directory) splits (the preparer's buckets split past 48). m's tie
    must then be where the directory says: its tie index bucket holds it (its tie, NOW)."""
    others = [f"o{i}" for i in range(60)]
    keys, following = _walk_meanwhile(client, prefix, "roll:split", others, alter, others=len(others))
    index = keys.tie_index(following)
    directory = cast("bytes | None", client.get(index)) or b""
    assert directory, "the walk did not split the index"
    return client.hget(bucket(directory, index, string_slot("m"))[0], "m")


@BOTH_TOPOLOGIES
def test_a_walk_splitting_the_next_periods_index_under_a_write_makes_redis_refuse_it(rclient, settings, way):
    """The walk's splits change a next period's tie index directory outside the seq: the write
    checks that the directory still gives each member it writes the bucket it read. The walk
    splits the one bucket between A's reads and A's write: refused, A reads again and writes m's
    tie where the directory says. Without the check A writes it into the bucket the split
    dropped, where no reader looks: m's tie is lost."""
    assert _split_meanwhile(rclient, settings.key_prefix + "a:") == str(NOW).encode()

    def unchecked(write: GuardedWrite) -> None:
        write.unsplit = []

    assert _split_meanwhile(rclient, settings.key_prefix + "b:", unchecked) is None


def test_a_connection_dropped_between_the_round_trips_loses_no_write(rclient, settings, way):
    """A WATCH lives on its connection: one dropped after the reads must not be silently opened
    again for the MULTI/EXEC (it would run unwatched, over B's write). The chunk goes to
    apply.lua instead, and B's 10 counts."""
    if way == "script":
        pytest.skip("a guarded.lua call is one round trip")
    assert _between(rclient, settings.key_prefix, reset=True)[0] == 12


def test_a_period_expiring_soon_by_redis_clock_goes_through_the_script(rclient, settings, way):
    """The worker's clock is only a first guess: a write whose period expires within the margin
    by Redis' own clock (the one that expires keys) is declined by the transaction, and written
    by guarded.lua instead (nothing written twice, nothing lost)."""
    if way == "script":
        pytest.skip("the script way has no transaction to decline it")
    a = applier(rclient, settings.key_prefix)
    board = "g:soon"
    a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    redis_ms = int(rclient.time()[0]) * 1000

    def soon(w: GuardedWrite) -> None:
        w.expires_at_ms = redis_ms + EXPIRY_MARGIN_MS // 2

    assert a.states is not None
    before = a.states.stats.natives, a.states.stats.scripted
    with altered(soon), mock.patch("worker.boardstate.native", return_value=True):
        a.apply([(ev(board, "m", 2, "2"), NOW)], [Position(SRC[0], 1, None)])
    assert (a.states.stats.natives, a.states.stats.scripted) == (before[0], before[1] + 1)
    assert score(rclient, settings.key_prefix, board, "m") == 3


def test_a_round_over_more_boards_than_its_connections_writes_the_rest_through_the_script(
    rclient, settings, way
):
    """Each board's transaction holds a connection for the round: at most MAX_BOARDS of them,
    the largest chunks; the other boards' writes go through guarded.lua in the same round."""
    if way == "script":
        pytest.skip("the script way opens no connection of its own")
    a = applier(rclient, settings.key_prefix)
    boards = [f"g:many{i}" for i in range(MAX_BOARDS + 6)]
    events = [(ev(board, "m", 1, f"e{i}"), NOW) for i, board in enumerate(boards)]
    events += [(ev(boards[-1], "m", 1, f"again{j}"), NOW) for j in range(3)]  # the largest chunk
    a.apply(events, [Position(SRC[0], i, None) for i in range(len(events))])
    assert a.states is not None
    assert (a.states.stats.natives, a.states.stats.scripted) == (MAX_BOARDS, 6)
    assert [score(rclient, settings.key_prefix, b, "m") for b in boards] == [1] * (len(boards) - 1) + [4]


def test_an_id_another_worker_applied_is_a_duplicate(rclient, settings):
    """The id window is checked by Redis whatever the worker kept: a producer retry that landed
    on another partition (another worker) is a duplicate, and one the worker itself applied too."""
    prefix = settings.key_prefix
    a, b = applier(rclient, prefix), applier(rclient, prefix)
    board = "g:ids"
    assert (
        a.apply([(ev(board, "m", 1, "same"), NOW)], [Position(SRC[0], 0, None)])[0].status is Status.APPLIED
    )
    got = b.apply([(ev(board, "m", 1, "same"), NOW)], [Position(SRC[1], 0, None)])
    assert got[0].status is Status.DUPLICATE
    got = a.apply([(ev(board, "m", 1, "same"), NOW)], [Position(SRC[2], 0, None)])
    assert got[0].status is Status.DUPLICATE
    assert score(rclient, prefix, board, "m") == 1


def _dump(client: Any, prefix: str) -> dict[str, Any]:
    """Every key under the prefix (without it): its value, and whether it expires (id window
    entries hold the second they were applied: their members only)."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match=f"{prefix}*", count=1000):
        key = raw.decode()
        kind = client.type(raw).decode()
        ids = ":i:" in key or key.endswith(":i")
        value: Any
        if kind == "string":
            value = client.get(raw)
        elif kind == "hash":
            value = client.hgetall(raw)
        elif kind == "zset":
            rows = client.zrange(raw, 0, -1, withscores=True)
            value = sorted(m for m, _ in rows) if ids else rows
        else:
            value = kind
        expiry = client.pexpiretime(raw)
        if ":t:" in key and expiry > 0:  # a tie index key expires after its period, spread by its name
            expiry -= index_expiry(1, key) - 1
        out[key.removeprefix(prefix)] = (value, expiry > 0 if ids else expiry)
    return out


@BOTH_TOPOLOGIES
@pytest.mark.parametrize("seed", [1, 2])
def test_redis_holds_what_apply_lua_leaves_through_splits_and_turns(rclient, settings, seed, way):
    """A random stream over every layout (general, ascending, declared range, no tie, max_members
    in the general and the packed layout) and a hot board, ids repeated, messages redelivered,
    small buckets (cap 4: the id window's and the tie indexes' directories split), rolling boards
    with their next period's preparation begun or not; once through apply.lua alone, once through
    three workers taking turns (two deciding, one not). Same replies, same keys, same values."""
    rng = random.Random(seed)
    boards = ["g:a", "g:hot", "asc:b", "r:c", "n:d", "cap:e", "capr:f", "roll:g", "roll:h"]
    members = [f"m{i}" for i in range(60)]
    stream: list[tuple[UpdateEvent, int]] = []
    for i in range(1500):
        board = rng.choice(boards)
        op = rng.choice([Op.INCR, Op.INCR, Op.INCR, Op.SET, Op.BEST, Op.DELETE])
        value = float(rng.choice([1, 2, 5, -3, 0.5, 2_000_000]))
        meta = rng.choice([None, None, b'{"n": 1}'])
        eid = f"e{rng.randrange(1200)}" if rng.random() < 0.1 else f"e{i}"
        stream.append(
            (ev(board, rng.choice(members), value, eid, op=op, meta=meta), NOW - rng.randrange(3_600_000))
        )
    where = [Position(SRC[i % 2], i // 2, None) for i in range(len(stream))]
    batches = [(s, min(s + rng.randrange(1, 300), len(stream))) for s in range(0, len(stream), 150)]
    batches += [(s, min(s + 100, len(stream))) for s in range(0, 500, 100)]  # redelivered

    def run(prefix: str, turns: list[Applier]) -> list[tuple[Any, ...]]:
        replies = []
        for n, (start, stop) in enumerate(batches):
            out = turns[n % len(turns)].apply(stream[start:stop], where[start:stop])
            replies += [
                (o.event.id, o.event.board, o.status, o.seq, o.states, o.meta, o.failed_as) for o in out
            ]
        return replies

    for run_prefix in ("lua:", "dec:"):
        prepared(rclient, settings.key_prefix + run_prefix, "roll:g")
        prepared(rclient, settings.key_prefix + run_prefix, "roll:h", begun=True)
    lua = run(
        settings.key_prefix + "lua:",
        [applier(rclient, settings.key_prefix + "lua:", cells=0, cap=4, now=NOW)],
    )
    prefix = settings.key_prefix + "dec:"
    deciding = [
        applier(rclient, prefix, cap=4, now=NOW),
        applier(rclient, prefix, cap=4, now=NOW),
        applier(rclient, prefix, cells=0, cap=4, now=NOW),
    ]
    rolled: list[str] = []  # how the rolling boards' writes ended
    derived: list[str] = []  # the same, for those writing a next period being prepared
    real = BoardStates._write

    def write(self: BoardStates, client: Any, writes: list[GuardedWrite]) -> list[Any]:
        replies = real(self, client, writes)
        for w, r in zip(writes, replies, strict=True):
            if w.unstarted:
                rolled.append(type(r).__name__)
            if w.unchanged:
                derived.append(type(r).__name__)
        return replies

    with mock.patch.object(BoardStates, "_write", write):
        decided = run(prefix, deciding)
    # per board in stream order (a rolling board's batches are cut into more calls for apply.lua
    # alone than for the worker, so boards interleave differently)
    assert sorted(decided, key=lambda r: r[1]) == sorted(lua, key=lambda r: r[1])
    # a board with a rolling window is decided too (the write checks that its next period's
    # preparation has not begun), and so is one whose next period is being prepared
    assert "Written" in rolled
    assert "Written" in derived
    assert _dump(rclient, prefix) == _dump(rclient, settings.key_prefix + "lua:")
    stats = [a.states.stats for a in deciding[:2] if a.states is not None]
    assert sum(s.conflicts + s.stale for s in stats) > 0  # the turns made them meet changed boards
    assert sum(s.hits for s in stats) > 0
    assert sum(s.natives if way == "native" else s.scripted for s in stats) > 0
    assert sum(s.scripted if way == "native" else s.natives for s in stats) == 0


@BOTH_TOPOLOGIES
def test_a_board_written_alone_is_not_read_again_for_its_buckets(rclient, settings, way):
    """What the board's transactions left in its buckets is kept with its state: a tie index
    bucket's entries exactly, an id window bucket's at most, and the second every id in it was
    applied at or after; a later transaction reads none of them again (no HLEN or ZCARD of a
    known bucket), through splits (cap 4)."""
    if way == "script":
        pytest.skip("a guarded.lua call reads the buckets inside Redis, and reports nothing of them")
    prefix = settings.key_prefix
    a = applier(rclient, prefix, cap=4)
    board = "g:alone"
    rng = random.Random(5)
    sent: list[list[Any]] = []
    real = NativeWrites._reads

    def reads(req: GuardedWrite) -> Any:
        cmds = real(req)
        buckets = {w.key for w in req.writes if isinstance(w, IdBucket | IndexBucket)}
        sent.append([c for c in cmds if c[0] in ("HLEN", "ZCARD") and c[1] in buckets])
        return cmds

    with mock.patch.object(NativeWrites, "_reads", staticmethod(reads)):
        for n in range(12):
            batch = [(ev(board, f"m{rng.randrange(40)}", 1, f"e{n}-{i}"), NOW) for i in range(20)]
            a.apply(batch, [Position(SRC[0], n * 20 + i, None) for i in range(20)])
    assert a.states is not None
    state = a.states._states[board]
    assert len(state.sizes) > 10  # the buckets split (cap 4)
    assert sent[0]  # the first transaction reads the buckets' sizes...
    assert not any(sent[1:])  # ...and none again: every bucket written since was known
    keys = BoardKeys(prefix, board)
    for key, size in state.sizes.items():
        if key.startswith(keys.id_window):
            stamps = [s for _, s in rclient.zrange(key, 0, -1, withscores=True)]
            cutoff = state.cutoffs.get(key)  # none for a bucket a split left empty
            assert len(stamps) <= size, key
            assert not stamps or (cutoff is not None and min(stamps) >= cutoff), key
        else:
            assert rclient.hlen(key) == size, key
    assert a.states.stats.conflicts == a.states.stats.stale == 0


def _id_keys_outlive_their_ids(client: Any, prefix: str, board: str, window_s: int) -> None:
    """Every id window key expires no sooner than a window after the newest id it serves was
    applied (each bucket: its own newest; the directory: the board's)."""
    keys = BoardKeys(prefix, board)
    newest = 0.0
    for raw in client.scan_iter(match=f"{keys.id_window}:*", count=1000):
        stamps = [s for _, s in client.zrange(raw, 0, -1, withscores=True)]
        if stamps:
            newest = max(newest, *stamps)
            assert client.pexpiretime(raw) >= (max(stamps) + window_s) * 1000, raw
    if client.exists(keys.id_window):
        assert client.pexpiretime(keys.id_window) >= (newest + window_s) * 1000


@BOTH_TOPOLOGIES
def test_an_id_window_keys_expiry_is_set_once_in_its_slack_and_leaves_every_id_its_window(
    rclient, settings, way
):
    """A transaction sets an id window key's expiry only when the worker does not know it was
    set a sixtieth of the window ago or less (its own transactions' record, forgotten with any
    other write of the board), and gives it that much more: every id still lives its window.
    Through splits (cap 4); then a guarded.lua call of the same worker in between, which sets
    the plain window: the next transaction sets it again (without forgetting, the bucket would
    expire before the ids it takes then have lived their window); and a record older than the
    slack: set again too."""
    if way == "script":
        pytest.skip("guarded.lua sets every id window key's expiry on each write")
    prefix = settings.key_prefix
    a = applier(rclient, prefix, cap=4, window_s=600)  # slack: 10 s
    sent: list[list[tuple[Any, ...]]] = []
    real = NativeWrites._transaction

    def transaction(self: NativeWrites, b: Any) -> Any:
        cmds = real(self, b)
        sent.append([c for c in cmds if c[0] in ("PEXPIRE", "ZADD") and ":i" in str(c[1])])
        return cmds

    board = "g:ttl"
    with mock.patch.object(NativeWrites, "_transaction", transaction):
        for n in range(8):
            batch = [(ev(board, f"m{i % 7}", 1, f"t{n}-{i}"), NOW) for i in range(10)]
            a.apply(batch, [Position(SRC[0], n * 10 + i, None) for i in range(10)])
    expired = [c[1] for cmds in sent for c in cmds if c[0] == "PEXPIRE"]
    inserts = [c[1] for cmds in sent for c in cmds if c[0] == "ZADD"]
    assert len(set(inserts)) > 4  # the id window split
    assert len(expired) == len(set(expired))  # each key's expiry set once in the test's seconds
    assert len(expired) < len(inserts)
    _id_keys_outlive_their_ids(rclient, prefix, board, 600)

    b = applier(rclient, prefix, window_s=120)  # slack: 2 s; one bucket, no directory
    board = "g:turn"
    b.apply([(ev(board, "m", 1, "u0"), NOW)], [Position(SRC[0], 0, None)])
    assert b.states is not None
    state = b.states._states[board]
    (bucket_key, refreshed), *_ = state.refreshed.items()
    b.states.native = False  # the same worker's guarded.lua call: a window and a second from now
    b.apply([(ev(board, "m", 1, "u1"), NOW)], [Position(SRC[0], 1, None)])
    b.states.native = True
    wait_for(lambda: int(rclient.time()[0]) >= refreshed + 2, 10, "Redis' clock two seconds on")
    b.apply([(ev(board, "m", 1, "u2"), NOW)], [Position(SRC[0], 2, None)])
    refreshed = b.states._states[board].refreshed[bucket_key]
    _id_keys_outlive_their_ids(rclient, prefix, board, 120)
    # past the slack, the worker's own record is too old: set again
    wait_for(lambda: int(rclient.time()[0]) >= refreshed + 4, 10, "Redis' clock past the slack")
    b.apply([(ev(board, "m", 1, "u3"), NOW)], [Position(SRC[0], 3, None)])
    _id_keys_outlive_their_ids(rclient, prefix, board, 120)
    assert b.states._states[board].refreshed[bucket_key] >= refreshed + 4


def test_a_foreign_key_in_the_boards_place_fails_the_chunk_before_any_write(rclient, settings):
    """A key of another type where the board's total zset should be (an operator's mistake) while
    the worker keeps the board's state: the guarded write reads every key it would write first,
    so it fails whole; the event is dead-lettered (apply.lua's narrowing), and its other windows
    and the seq stay as they were."""
    prefix = settings.key_prefix
    a = applier(rclient, prefix)
    board = "g:foreign"
    keys = BoardKeys(prefix, board)
    a.apply([(ev(board, "m", 1, "f1"), NOW)], [Position(SRC[0], 0, None)])
    day = next(k.decode() for k in rclient.scan_iter(match=f"{keys.tag}:z:day:*"))
    rclient.delete(keys.rank("total"))
    rclient.set(keys.rank("total"), "foreign")
    outcomes, failures = a.apply_isolated([(ev(board, "m", 1, "f2"), NOW)], [Position(SRC[0], 1, None)])
    assert outcomes == []
    assert [type(f.error).__name__ for f in failures] == ["ResponseError"]
    assert "WRONGTYPE" in str(failures[0].error)
    assert rclient.get(keys.seq) == b"1"
    assert [s for _, s in rclient.zrange(day, 0, -1, withscores=True)] == [1.0]


SEALING = parse_boards(
    "timezone: UTC\ntypes:\n"
    "  res: {windows: [total, day], late_grace: 1d, period_results: {windows: [day], top: 3}}\n"
)


def _sealed_period(client: Any, prefix: str) -> tuple[int, float | None, float | None]:
    """Worker A keeps the board's state; the day's result is sealed (worker/results.py); A then
    applies an event of that day: (windows it missed, the day's score, the total's score)."""
    a = Applier(client, SEALING, prefix, 3600, epoch="E")
    board = "res:r1"
    keys = BoardKeys(prefix, board)
    a.apply([(ev(board, "m", 1, "s1"), NOW)], [Position(SRC[0], 0, None)])
    day = next(k.decode() for k in client.scan_iter(match=f"{keys.tag}:z:day:*"))
    instance = day.split(":z:", 1)[1]
    assert periodmark.seal(client, keys, instance, NOW + 7 * 86_400_000).sealed
    (late,) = a.apply([(ev(board, "m", 1, "s2"), NOW)], [Position(SRC[0], 1, None)])
    return late.late_windows, score_of(client, day, "m"), score_of(client, keys.rank("total"), "m")


def test_a_period_sealed_after_the_worker_read_it_is_left_alone(rclient, settings):
    """A sealed period's result is final: the worker learns of the seal from the guarded write's
    check (nothing written), then decides again without the period, counting it late."""
    assert _sealed_period(rclient, settings.key_prefix + "a:") == (1, 1.0, 2.0)

    def unchecked(write: GuardedWrite) -> None:  # the seal check taken away
        write.unsealed = ()

    with altered(unchecked):
        assert _sealed_period(rclient, settings.key_prefix + "b:") == (0, 2.0, 2.0)


@BOTH_TOPOLOGIES
def test_a_rolling_batch_the_worker_leaves_to_apply_lua_is_cut_into_its_calls(rclient, settings, way):
    """The worker takes a rolling board's events in chunks of up to DECIDED_ROLLING_COUNTS_PER_CALL
    (event, instance) counts; one that goes to apply.lua after all (here: the board's current
    rolling period was never prepared) is cut into calls of at most ROLLING_COUNTS_PER_CALL, in
    order, and ends as apply.lua alone leaves the board."""
    # 4 counts an event: total, the bucket, the current period and the next (its walk not begun:
    # apply.lua counts it too)
    board, n, counts = "roll:cut", 45, 4
    stream = [(ev(board, f"m{i % 40}", 1 + i % 7, f"c{i}"), NOW - i) for i in range(n)]
    where = [Position(SRC[0], i, None) for i in range(n)]
    sizes: list[int] = []
    real = ApplyScript.run_many

    def recorded(self: ApplyScript, client: Any, reqs: Any) -> Any:
        sizes.extend(len(r.events) for r in reqs if r.keys.board == board)
        return real(self, client, reqs)

    prefix = settings.key_prefix
    lua = applier(rclient, prefix + "lua:", cells=0, now=NOW).apply(stream, where)
    sizes.clear()
    with mock.patch.object(ApplyScript, "run_many", recorded):
        decided = applier(rclient, prefix + "dec:", now=NOW).apply(stream, where)
    assert DECIDED_ROLLING_COUNTS_PER_CALL >= counts * n > ROLLING_COUNTS_PER_CALL  # one chunk, cut
    per_call = ROLLING_COUNTS_PER_CALL // counts
    assert sizes == [per_call] * (n // per_call) + [n % per_call]
    assert [(o.event.id, o.status, o.seq) for o in decided] == [(o.event.id, o.status, o.seq) for o in lua]
    assert _dump(rclient, prefix + "dec:") == _dump(rclient, prefix + "lua:")


@BOTH_TOPOLOGIES
def test_a_next_period_read_afresh_while_prepared_is_kept_once_it_is_current(rclient, settings, way):
    """A next rolling period being prepared is read for every chunk (the walk writes it outside
    the seq); an hour later it is the current period, which only appliers write: the worker
    keeps it again, and a chunk that finds all it needs in the kept state reads nothing."""
    clock = [NOW]
    a = Applier(rclient, BOARDS, settings.key_prefix, 3600, epoch="E", now_ms=lambda: clock[0])
    assert a.states is not None
    a.states.native, a.states.native_min_events = WAYS["native"], 1
    board, stats = "roll:turned", a.states.stats
    prepared(rclient, settings.key_prefix, board, begun=True)
    markers: list[str] = []
    with altered(lambda w: markers.extend(k for k, _, _ in w.unsplit)):
        a.apply([(ev(board, "m", 1, "1"), NOW)], [Position(SRC[0], 0, None)])
    assert markers, "the next period was not written as being prepared"
    following = window_instance("last_3h", time.strftime("%Y-%m-%dT%H", time.gmtime((NOW + HOUR) / 1000)))
    rclient.set(BoardKeys(settings.key_prefix, board).prepared(following), "done")  # the walk ended
    clock[0] += HOUR
    a.apply([(ev(board, "m", 1, "2"), clock[0])], [Position(SRC[0], 1, None)])
    hits = stats.hits
    a.apply([(ev(board, "m", 1, "3"), clock[0])], [Position(SRC[0], 2, None)])
    assert stats.hits == hits + 1
    assert score_of(rclient, BoardKeys(settings.key_prefix, board).rank(following), "m") == 3
