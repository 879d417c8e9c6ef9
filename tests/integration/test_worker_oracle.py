"""The worker against an independent model of the stream: 100k+ events over 50 boards, every op,
10% re-produced duplicates, 2% bad events; then the same through three kill -9 and rebalances,
with the dead-letter topic exact each time (the worker's outputs are transactional)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.settings import Settings
from tests.helpers import (
    BOTH_TOPOLOGIES,
    applied_so_far,
    check_dlq,
    produce,
    running_worker,
    stop_workers,
    wait_applied_and_committed,
    wait_for,
    worker_env,
)
from tests.oracle import (
    BOARDS,
    ORACLE_BOARDS_RANGED,
    RANGED_BOARDS,
    SHARDED_BOARDS,
    Message,
    Model,
    compare_redis,
    generate,
    now_ms,
    run_model,
)

# The 100k oracle runs on both topologies (a batch's calls routed to 3 masters, slot marks); the
# kill -9, rebalance and fencing tests on one server: what they exercise is Kafka's redelivery and
# the board's own fence, the same calls on a cluster, where test_many_processes.py kills and
# churns workers.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
EVENTS = 100_000
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def oracle_settings(make_settings, tmp_path) -> Settings:
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS_RANGED)
    settings: Settings = make_settings(boards=boards)
    return settings


@pytest.fixture
def oracle_topics(oracle_settings):
    from rankstream.topics import ensure_topics

    ensure_topics(oracle_settings)
    return oracle_settings


def make_stream(seed: int) -> tuple[list[Message], Model]:
    start = now_ms()
    messages = list(generate(seed, EVENTS, start, [*BOARDS, *RANGED_BOARDS, *SHARDED_BOARDS]))
    return messages, run_model(messages, start)


def worker_process(
    settings: Settings, http_port: int = 0, worker_id: str = "", extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = worker_env(settings, http_port, worker_id)
    env.update(extra_env or {})
    argv = [sys.executable, "-m", "rankstream.cli", "worker"]
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def total_applied(model: Model) -> int:
    return sum(model.seq.values())


@BOTH_TOPOLOGIES
def test_oracle_exact_after_100k_events(oracle_topics, rclient, consumer_factory):
    settings = oracle_topics
    messages, model = make_stream(seed=1)
    assert len(model.dlq) > EVENTS * 0.015  # the stream really carries bad events
    produce(settings, messages)
    with running_worker(settings):
        wait_applied_and_committed(rclient, settings, total_applied(model))
    compared = compare_redis(rclient, settings.key_prefix, model)
    assert compared > 10_000
    check_dlq(consumer_factory, settings, model, exact=True)


def test_oracle_exact_after_three_kill_9_mid_stream(oracle_topics, rclient, consumer_factory):
    """kill -9 three times mid-stream: Redis equals the model and the dead-letter topic holds each
    bad event exactly once (read_committed), though every kill left a transaction open."""
    settings = oracle_topics
    messages, model = make_stream(seed=2)
    produce(settings, messages)
    target = total_applied(model)
    for n, share in enumerate((0.2, 0.45, 0.7)):
        # the first two restarts keep the id (a pod's container restarted), the third is new (a new pod)
        victim = worker_process(settings, worker_id="pod-a" if n < 2 else "pod-b")
        try:
            goal = target * share
            wait_for(lambda: applied_so_far(rclient, settings) > goal, 120, f"{share:.0%} applied")  # noqa: B023
            victim.kill()  # SIGKILL: no commit, its transaction stays open
            victim.wait(10)
            assert applied_so_far(rclient, settings) < target, "the kill came too late to test anything"
        finally:
            if victim.poll() is None:
                victim.kill()
    last = worker_process(settings, worker_id="pod-b")
    try:
        wait_applied_and_committed(rclient, settings, target)
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(30) == 0
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)


# one Redis only: on the cluster, tests/integration/test_many_processes.py has three workers join
# and leave (SIGTERM and kill -9) while producing and ends exact against the same kind of model
def test_oracle_exact_with_two_workers_and_rebalances(oracle_topics, rclient, consumer_factory):
    settings = oracle_topics
    messages, model = make_stream(seed=3)
    produce(settings, messages)
    target = total_applied(model)
    a = worker_process(settings)
    b = None
    try:
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.15, 120, "15% applied")
        b = worker_process(settings)  # joins: partitions move to it mid-stream
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.5, 120, "half applied")
        a.send_signal(signal.SIGTERM)  # leaves: its partitions move back to b
        started = time.monotonic()
        assert a.wait(30) == 0
        assert time.monotonic() - started < 25  # within the shutdown deadline
        wait_applied_and_committed(rclient, settings, target)
    finally:
        stop_workers(a, b)
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)


def test_the_worker_taking_a_dead_ones_partitions_fences_it_at_once(oracle_topics, rclient, consumer_factory):
    """kill -9 with a second worker alive: the survivor, assigned the dead one's partitions, finds
    it gone from the group and fences its transactional id (aborting its open transaction now,
    not after the broker's timeout), then finishes exactly."""
    settings = oracle_topics
    messages, model = make_stream(seed=6)
    produce(settings, messages)
    target = total_applied(model)
    victim = worker_process(settings, worker_id="pod-a")
    try:
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.1, 120, "10% applied")
        with running_worker(settings.model_copy(update={"worker_id": "pod-b"})) as survivor:
            wait_for(lambda: survivor.assigned > 0, 60, "the survivor owns partitions")
            wait_for(lambda: applied_so_far(rclient, settings) > target * 0.4, 120, "40% applied")
            victim.kill()
            victim.wait(10)
            assert applied_so_far(rclient, settings) < target, "the kill came too late to test anything"
            wait_applied_and_committed(rclient, settings, target)
            fence = survivor._fence
            assert fence is not None
            # the takeover waits for the group to drop the dead one (session.timeout.ms), whether
            # or not its partitions had work left: the stream can be done before it (the victim's
            # partitions all committed when it died: librdkafka drains one partition at a time)
            wait_for(lambda: bool(fence.fenced), 60, "the survivor fencing the dead worker")
            assert fence.fenced == [f"{settings.worker_group}-pod-a"]
            fenced = survivor.metrics.registry.get_sample_value("rankstream_worker_predecessors_fenced")
            assert fenced == 1
    finally:
        if victim.poll() is None:
            victim.kill()
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
