"""The capacity model's arithmetic (rankstream/capacity.py, docs/capacity.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from common.errors import ConfigError
from rankstream.capacity import Figures, Target, Tier, at, load_figures, load_target, plan, predict

FIGURES = Figures(
    worker_curve=((1000.0, 0.1),),  # 100 µs an event at any load (a straight line through 0)
    redis_curve=((1000.0, 0.03),),  # 30 µs an event on a master
    redis_replica_us_per_event=10.0,
    api_us_per_read=500.0,
    redis_us_per_read=20.0,
    redis_bytes_per_member_window=200.0,
    redis_bytes_per_event_id=25.0,
    api_bytes_per_hot_member=300.0,
    worker_idle_cores=0.0,
    redis_idle_cores=0.0,
    api_idle_cores=0.0,
)


def test_a_plan_is_the_documented_arithmetic():
    target = Target(
        tiers=[
            Tier(name="room", boards=10_000, events_per_s=30_000, members_per_board=100),
            Tier(name="global", boards=1, events_per_s=30_000, members_per_board=1_000_000, windows=6),
        ],
        reads_per_s=2_000,
        hot_members=1_000_000,
        utilization=0.5,
    )
    result = plan(target, FIGURES)
    # workers: 30k x 100 us + 30k x 200 us (6 windows: twice the figures' 3) = 9 cores, at 50%
    assert result.cpu["workers"] == 9.0 and result.workers == 18 and result.partitions == 36
    # the global board: 30k x 60 us = 1.8 cores on one slot, 0.5 a master: 4 shards
    assert result.shards == {"room": 1, "global": 4}
    # masters: writes 0.9 + 1.8, reads 2k x 20 us = 0.04 -> 2.74 cores at 50% = 6 (more than 4 shards)
    assert result.cpu["redis_masters"] == 2.74 and result.redis_masters == 6 and result.why_masters == "CPU"
    assert result.redis_replicas == 6
    # memory: 1M x 3 x 200 + 1M x 6 x 200 + 60k/s x 600 s x 25 B
    assert result.redis_memory_gb == round((600e6 + 1200e6 + 900e6) / 1024**3, 2)
    # API nodes: 2k reads x 500 us = 1 core at 50% = 2; memory 1M x 300 B + 150 MB
    assert result.api_nodes == 2 and result.api_memory_gb_per_node == round(450e6 / 1024**3, 2)
    # the global board alone: 30k x 200 us = 6 cores of one worker's 0.5: its partition's limit
    assert result.over_one_worker == {"global": 12.0}


def test_the_biggest_board_and_memory_can_each_decide_the_masters():
    hot_board = Target(tiers=[Tier(name="global", boards=1, events_per_s=50_000, members_per_board=10)])
    assert plan(hot_board, FIGURES).redis_masters == 3  # 1.5 cores on one board at 60%: 3 shards
    assert plan(hot_board, FIGURES).why_masters == "the biggest board's shards"
    big = Target(tiers=[Tier(name="room", boards=100_000, events_per_s=10, members_per_board=10_000)])
    result = plan(big, FIGURES)  # 100k x 10k x 3 x 200 B = ~559 GB, 11.2 GB a master
    assert result.why_masters == "memory" and result.redis_masters == 50


def test_predict_spreads_the_load_evenly_over_each_kind_above_its_idle_cost():
    idle = replace(FIGURES, worker_idle_cores=0.02, redis_idle_cores=0.01, api_idle_cores=0.03)
    got = predict(idle, events_per_s=1_000, windows=3, reads_per_s=400,
                  deployment={"worker": 2, "api_node": 2, "redis_master": 3})  # fmt: skip
    assert got == pytest.approx({"worker": 0.07, "redis_master": 0.01 + (0.03 + 0.008) / 3, "api_node": 0.13})


def test_a_curve_is_straight_between_its_points_and_past_the_last_at_that_points_cost_per_event():
    curve = ((500.0, 0.2), (1000.0, 0.3))
    assert [at(curve, x) for x in (0, 250, 500, 750, 1000, 2000)] == pytest.approx(
        [0, 0.1, 0.2, 0.25, 0.3, 0.6]
    )


def test_a_busier_worker_spends_less_per_event_so_fewer_workers_do():
    # a worker's rounds cost the same whatever they carry: 0.2 cores at 500 events/s, 0.3 at 1,000
    bent = replace(FIGURES, worker_curve=((500.0, 0.2), (1000.0, 0.3)))
    target = Target(tiers=[Tier(name="room", boards=1000, events_per_s=2_000, members_per_board=10)])
    # 2,000 events/s: 4 workers at 500 (0.2 each) fit 0.6, and so do 3 at 667 (0.233); 2 at
    # 1,000 (0.3) too; 1 at 2,000 (0.5) too: one worker, where a straight 400 µs/event needs 2
    assert plan(target, bent).workers == 1
    assert plan(target, replace(FIGURES, worker_curve=((500.0, 0.2),))).workers == 2


def test_idle_costs_leave_less_of_each_process():
    target = Target(tiers=[Tier(name="room", boards=1000, events_per_s=5_000, members_per_board=10)])
    assert plan(target, FIGURES).workers == 1  # 0.5 cores of 0.6
    assert plan(target, replace(FIGURES, worker_idle_cores=0.2)).workers == 2  # of 0.4


def test_figures_come_from_a_bench_report(tmp_path: Path):
    report = tmp_path / "scale.json"
    report.write_bytes(
        orjson.dumps({"capacity_worker_curve": [[500, 0.2], [1000, 0.3]], "capacity_api_us_per_read": 400})
    )
    figures = load_figures([str(report)])
    assert figures.worker_curve == ((500.0, 0.2), (1000.0, 0.3)) and figures.api_us_per_read == 400
    assert figures.redis_curve == Figures().redis_curve  # not in the report: the default


def test_a_bad_target_is_one_line(tmp_path: Path):
    bad = tmp_path / "target.yaml"
    bad.write_text("tiers:\n  - {name: room, boards: 0, events_per_s: 10, members_per_board: 5}\n")
    with pytest.raises(
        ConfigError, match=r"target.yaml: tiers.0.boards: Input should be greater than or equal to 1"
    ):
        load_target(bad)
    bad.write_text("tiers: []\nreads: 5\n")
    with pytest.raises(ConfigError, match="reads: Extra inputs are not permitted"):
        load_target(bad)


def test_the_command_prints_the_plan(tmp_path: Path):
    target = tmp_path / "target.yaml"
    target.write_text(
        "tiers:\n  - {name: global, boards: 1, events_per_s: 60000, members_per_board: 1000000}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "capacity", str(target)],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    k = plan(load_target(target), Figures()).shards["global"]  # 60k events/s on one board
    assert k > 1 and f"Redis masters: {k} (set by the biggest board's shards" in out
    assert f"shards: {k} for the boards of tier global" in out
    assert "warning: a board of tier global takes" in out  # and more than one worker applies
