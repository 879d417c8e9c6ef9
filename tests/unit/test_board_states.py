"""The worker's kept board states: bounded, least recently used out first, counted in metrics."""

from __future__ import annotations

from typing import cast

from common.boards import parse_boards
from common.store.topology import Store
from worker.apply import Applier
from worker.boardstate import BoardStates, Stats
from worker.decide import ABSENT, BoardState, InstanceState
from worker.metrics import WorkerMetrics


def _state(members: int) -> BoardState:
    inst = InstanceState(None, b"", 0, {f"m{i}": ABSENT for i in range(members)})
    return BoardState(0, {}, b"", {"total": inst})


def test_the_least_recently_used_boards_go_first_and_the_bound_holds():
    states = BoardStates(max_cells=100)
    states._keep("a", _state(40))
    states._keep("b", _state(40))
    states._keep("a", _state(40))  # a used again: b is now the oldest
    states._keep("c", _state(40))
    assert list(states._states) == ["a", "c"]
    assert states.stats.cells == 80 and states.stats.boards == 2


def test_a_board_larger_than_the_bound_is_not_kept():
    states = BoardStates(max_cells=10)
    states._keep("big", _state(11))
    assert states.stats.cells == 0 and not states._states


def test_a_period_past_its_expiry_is_forgotten():
    states = BoardStates()
    state = _state(3)
    state.instances["day:2020-01-01"] = InstanceState(None, b"", 1, {"m": ABSENT})
    states._keep("a", state)
    assert list(states._states["a"].instances) == ["total"]
    assert states.stats.cells == 3


def test_the_metrics_read_the_counts_when_scraped():
    metrics, stats = WorkerMetrics(), Stats()
    metrics.watch_states(stats)
    stats.hits, stats.conflicts, stats.cells, stats.natives, stats.scripted = 5, 2, 300, 7, 1
    sample = metrics.registry.get_sample_value
    assert sample("rankstream_worker_decided_writes_total", {"way": "native"}) == 7
    assert sample("rankstream_worker_decided_writes_total", {"way": "script"}) == 1
    assert sample("rankstream_worker_state_chunks_total", {"how": "hit"}) == 5
    assert sample("rankstream_worker_state_chunks_total", {"how": "conflict"}) == 2
    assert sample("rankstream_worker_state_cells") == 300


def test_another_redis_data_set_forgets_every_board():
    boards = parse_boards("types:\n  g: {windows: [total]}\n")
    applier = Applier(cast("Store", None), boards, "p:", 60, epoch="E1")  # never called: no event
    assert applier.states is not None
    applier.states._keep("a", _state(3))
    applier.epoch = "E1"
    assert applier.states.stats.boards == 1
    applier.epoch = "E2"
    assert applier.states.stats.boards == 0 and applier.states.stats.cells == 0
