"""Writes to a board an API node registered (BoardKeys.promoted, common/store/promotion.py): each
one reports the member's states in every window, whichever way it goes (apply.lua, guarded.lua,
a native transaction), so the worker publishes it; a write that believed otherwise is refused
before it writes anything, and the worker learns the registration from the refusal. Without
the transaction's WATCH of the registration, a registration landing between a worker's reads
and its transaction lets an unreported write through: the test shows it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import redis

from common.store import promotion
from common.store.guarded import GuardedWrite
from common.store.keys import BoardKeys
from common.store.native import NativeWrites
from tests.helpers import BOTH_TOPOLOGIES
from tests.integration.test_decided_writes import NOW, SRC, WAYS, applier, ev, score
from worker.apply import Applier, Outcome, Position

pytestmark = pytest.mark.integration

TTL_MS = 60_000
WINDOWS = {"total", "day", "week"}  # type g's


@pytest.fixture(autouse=True, params=["native", "script"])
def way(request: pytest.FixtureRequest) -> Iterator[str]:
    """The decided writes go natively, or through guarded.lua (test_decided_writes.py's WAYS)."""
    WAYS["native"] = request.param == "native"
    yield request.param
    WAYS["native"] = True


def windows(outcome: Outcome) -> set[str]:
    return {name.split(":", 1)[0] for name in outcome.states}


def apply_one(a: Applier, board: str, offset: int, score: float = 1) -> Outcome:
    (outcome,) = a.apply([(ev(board, "m", score, f"e{offset}"), NOW)], [Position(SRC[0], offset, None)])
    return outcome


@BOTH_TOPOLOGIES
@pytest.mark.parametrize("cells", [1_000_000, 0], ids=["decided", "apply.lua"])
def test_writes_report_their_states_exactly_while_the_board_is_registered(rclient, settings, cells):
    prefix = settings.key_prefix
    a = applier(rclient, prefix, cells=cells)
    board, keys = "g:promoted", BoardKeys(prefix, "g:promoted")
    assert windows(apply_one(a, board, 0)) == set()  # neither hot nor registered
    token = promotion.register(rclient, keys, TTL_MS)
    assert promotion.register(rclient, keys, TTL_MS) == token  # kept alive, not started again
    seq = int(rclient.get(keys.seq) or 0)
    registered = apply_one(a, board, 1, 10)
    assert windows(registered) == WINDOWS
    assert registered.states["total"] is not None and registered.states["total"].score == 11
    assert a.promotions.believed(board)
    assert int(rclient.get(keys.seq) or 0) == seq + 1  # the refused call wrote nothing
    assert windows(apply_one(a, board, 2)) == WINDOWS  # known now: no refusal
    rclient.delete(keys.promoted)  # the registration lapsed
    apply_one(a, board, 3)  # refused once: the worker learns it
    assert not a.promotions.believed(board)
    assert windows(apply_one(a, board, 4)) == set()
    assert score(rclient, prefix, board, "m") == 14  # each event once
    assert promotion.register(rclient, keys, TTL_MS) != token  # a new registration, a new token


def _registered_meanwhile(client: redis.Redis, prefix: str) -> Outcome:
    """A worker reads the board for its transaction; an API node registers the board before the
    transaction runs."""
    a = applier(client, prefix)
    board = "g:meanwhile"
    apply_one(a, board, 0)
    real = NativeWrites._transaction
    struck: list[bool] = []

    def registered_after_the_reads(self: NativeWrites, board_tx: Any) -> Any:
        if not struck:
            struck.append(True)
            promotion.register(client, BoardKeys(prefix, board), TTL_MS)
        return real(self, board_tx)

    with mock.patch.object(NativeWrites, "_transaction", registered_after_the_reads):
        return apply_one(a, board, 1)


@BOTH_TOPOLOGIES
def test_a_registration_between_the_reads_and_the_transaction_is_not_missed(rclient, settings, way):
    if way == "script":
        pytest.skip("a guarded.lua call reads and writes in one step: nothing lands in between")
    assert windows(_registered_meanwhile(rclient, settings.key_prefix + "a:")) == WINDOWS
    real = NativeWrites._reads

    def unwatched(req: GuardedWrite) -> list[Any]:
        reads = real(req)
        return [("WATCH", *(k for k in reads[0][1:] if not str(k).endswith(":promoted"))), *reads[1:]]

    with mock.patch.object(NativeWrites, "_reads", staticmethod(unwatched)):
        # written, unreported: an API node loading the board from then on would miss it
        assert windows(_registered_meanwhile(rclient, settings.key_prefix + "b:")) == set()
