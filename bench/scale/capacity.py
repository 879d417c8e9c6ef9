"""The capacity model's check (docs/capacity.md, rankstream/capacity.py): what the model predicts
each process spends against what it spends in a run here, 2 workers, 2 API nodes and the
3-master cluster, at stated rates below saturation.

The figures are measured first, one process of each kind alone, on the scale benchmark's boards
(filled first): each process' CPU idle (IDLE_S, nothing to do); one worker applying events at
half the check's rate (its share of it); one API node answering reads at half the check's read
rate (top-10 pages at random offsets and rank-of-score, from Redis: nocache=1), no events
meanwhile. They are reported as `capacity_*` keys, which `rankstream capacity --figures` reads.
Then the check: the second worker and API node join, events stream at CHECK_SHARE of the
1w_cluster case's drain rate over the boards while reads arrive at CHECK_READS_PER_S, half on
each API node, for CHECK_S seconds; each process' CPU (workers and API nodes from /proc, masters
from INFO cpu) against capacity.predict:

    capacity_model_error   the largest, over the 7 processes, of |predicted - measured| / measured"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

from bench.common import BenchError, Result, say
from bench.harness.cpu import CpuMeter
from bench.harness.http1 import Request, write_requests
from bench.harness.kafka import paced, produce
from bench.harness.nodes import assigned_partitions, start_api, start_worker
from bench.harness.probes import wait_ready
from bench.harness.processes import Child, Children
from bench.harness.rate import RATE_S, RATE_WARMUP_S, constant_rate
from bench.harness.stack import Stack
from bench.scale.profile import Snapshot, profile
from bench.scale.targets import RedisTarget, part_settings
from bench.worker.workload import WINDOWS, live_stream
from common.settings import Settings
from common.store.keys import BoardKeys
from rankstream.capacity import Figures, predict
from rankstream.stack import free_port
from rankstream.topics import ensure_topics

CHECK_SHARE = 0.4  # of the 1w_cluster case's events/s
CHECK_READS_PER_S = 400.0
CHECK_S = 12.0
IDLE_S = 6.0
CAL_S = 10.0
# the calibration's event rates, as shares of the check's, each applied by the one worker over
# the boards of half the partitions: a check's worker holds 3 of the 6, at half the check's rate
CAL_SHARES = (0.25, 0.5, 1.0)
PARTITIONS = 6  # update_rank's (RANKSTREAM_TOPIC_UPDATES_PARTITIONS' default)
WORKERS, API_NODES = 2, 2


def _reads(folder: Path, boards: int) -> Path:
    rng, path = random.Random(13), folder / "capacity-reads.jsonl"
    requests = []
    for _ in range(10_000):
        board = f"gift:room{rng.randrange(boards)}"
        if rng.random() < 0.5:
            requests.append(
                Request("GET", f"/v1/boards/{board}/top?limit=10&offset={rng.randrange(40)}&nocache=1")
            )
        else:
            requests.append(
                Request("GET", f"/v1/boards/{board}/rank?score={rng.randrange(1, 500)}&nocache=1")
            )
    write_requests(path, requests)
    return path


def _masters_cpu_s(
    target: RedisTarget, before: Mapping[int, Snapshot], after: Mapping[int, Snapshot]
) -> dict[str, float]:
    return {node.label: after[node.port].cpu_s - before[node.port].cpu_s for node in target.masters}


def _read_load(
    bases: list[str], rate: float, pids: Mapping[str, int], file: Path, seconds: float
) -> list[Result]:
    """`rate` reads a second split over `bases`, each from a rate client of its own (threads)."""
    results: list[Result] = []
    errors: list[BaseException] = []

    def one(base: str) -> None:
        try:
            results.append(
                constant_rate(f"{base}/", rate / len(bases), pids, duration_s=seconds, requests_file=file)
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(base,)) for base in bases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 180)
    if errors:
        raise errors[0]
    return results


class _Cpu(NamedTuple):
    processes: dict[str, float]  # cores, by name
    masters: dict[str, float]  # cores, by master
    elapsed_s: float
    profile: Result  # inside Redis, per second (bench/scale/profile.py)


def _stretch(target: RedisTarget, pids: Mapping[str, int], seconds: float) -> _Cpu:
    """Each process' and master's CPU (cores) over the next `seconds`."""
    meter = CpuMeter(pids)
    before = target.snapshots()
    meter.start()
    started = time.monotonic()
    time.sleep(seconds)
    cpu = meter.stop()
    after = target.snapshots()
    elapsed = time.monotonic() - started
    masters = {label: s / elapsed for label, s in _masters_cpu_s(target, before, after).items()}
    inside = profile(before, after, {"masters": [n.port for n in target.masters]}, max(int(elapsed), 1))
    return _Cpu({name: cpu[name] / 100 for name in pids}, masters, elapsed, inside)


def run(
    stack: Stack,
    group: Children,
    target: RedisTarget,
    *,
    cases: Mapping[str, Result],
    boards: int,
    index: int,
) -> Result:
    rate = CHECK_SHARE * float(cases["1w_cluster"]["events_per_s"])
    settings = part_settings(stack, target, "capacity", index)
    ensure_topics(settings)
    ports = [free_port() for _ in range(WORKERS)]
    workers = [start_worker(group, "cap-w0", settings, http_port=ports[0], worker_id="w0")]
    apis = [start_api(group, f"cap-api{i}", settings) for i in range(API_NODES)]
    try:
        for child, base in apis:
            wait_ready(child, f"{base}/readyz")
        fill = live_stream("fill", boards=boards)(boards * 20)
        produce(settings.kafka_bootstrap, settings.topic_updates, fill)
        _wait_applied(target, settings, boards, len(fill))
        reads = _reads(stack.folder, boards)
        figures, profiles = _calibrate(
            settings,
            target,
            workers[0],
            apis[0],
            rate=rate,
            reads=reads,
            boards=boards,
            drain=cases["1w_cluster"],
        )
        workers.append(start_worker(group, "cap-w1", settings, http_port=ports[1], worker_id="w1"))
        _wait_shared(ports)
        pids = {f"worker{i}": c.pid for i, c in enumerate(workers)}
        pids |= {f"api{i}": c.pid for i, (c, _) in enumerate(apis)}
        measured, profiles["check"] = _measure(
            settings, target, apis, pids, rate=rate, reads=reads, boards=boards
        )
        for child in workers:
            child.check_alive()
    finally:
        for child in [*workers, *(c for c, _ in apis)]:
            group.stop(child)
    deployment = {"worker": WORKERS, "api_node": API_NODES, "redis_master": len(target.masters)}
    predicted = predict(figures, events_per_s=rate, windows=len(WINDOWS), reads_per_s=CHECK_READS_PER_S,
                        deployment=deployment)  # fmt: skip
    errors = {name: abs(predicted[_kind(name)] - cpu) / cpu for name, cpu in measured.items() if cpu > 0}
    worst = max(errors, key=lambda name: errors[name])
    say(f"capacity: model error {errors[worst]:.2f} at {worst} (predicted {predicted[_kind(worst)]:.3f} "
        f"CPU s/s, measured {measured[worst]:.3f})")  # fmt: skip
    return {
        "capacity_model_error": round(errors[worst], 3),
        "capacity_model_worst": worst,
        "capacity_check_events_per_s": round(rate, 1),
        "capacity_check_reads_per_s": CHECK_READS_PER_S,
        **{
            f"capacity_{f.name}": round(getattr(figures, f.name), 4)
            for f in fields(Figures)
            if f.name.endswith(("_cores", "_us_per_read"))
        },
        "capacity_worker_curve": figures.worker_curve,
        "capacity_redis_curve": figures.redis_curve,
        "capacity_predicted_cpu_s_per_s": {k: round(v, 4) for k, v in predicted.items()},
        "capacity_measured_cpu_s_per_s": {k: round(v, 4) for k, v in measured.items()},
        "capacity_errors": {k: round(v, 3) for k, v in errors.items()},
        # each board batch's write (guarded.lua or a MULTI/EXEC) per event: a process that waits
        # longer between rounds (a busier box) carries more events in each and spends less per event
        "capacity_writes_per_event": {
            name: round(_writes(profiles[name]) / per_s, 3)
            for name, per_s in [*((f"writes_{c:g}", c * rate) for c in CAL_SHARES), ("check", rate)]
        },
        "capacity_redis_profiles_per_s": profiles,  # inside Redis, per second, of each stretch
    }


def _calibrate(
    settings: Settings,
    target: RedisTarget,
    worker: Child,
    api: tuple[Child, str],
    *,
    rate: float,
    reads: Path,
    boards: int,
    drain: Result,
) -> tuple[Figures, dict[str, Result]]:
    """The figures, one process of each kind alone: idle, then events at CAL_SHARES of `rate`
    (with the 1w_cluster case's drain as the curves' last point: a worker's most), then reads;
    and what Redis did in the idle and the events stretches."""
    pids = {"worker": worker.pid, "api": api[0].pid}
    profiles: dict[str, Result] = {}
    idle = _stretch(target, pids, IDLE_S)
    master_idle = sum(idle.masters.values()) / len(idle.masters)
    half = _half_the_partitions(boards)  # a check worker holds half of them
    masters = len(idle.masters)
    worker_curve, redis_curve = [], []
    for share in CAL_SHARES:
        per_s = share * rate
        with paced(settings.kafka_bootstrap, settings.topic_updates, per_s, live_stream("cap", boards=half)):
            time.sleep(2)
            writing = _stretch(target, pids, CAL_S)
        _wait_quiet(target, master_idle)  # what the worker still had to apply is not a read's
        worker_curve.append(
            (round(per_s, 1), round(writing.processes["worker"] - idle.processes["worker"], 4))
        )
        redis = sum(writing.masters.values()) / masters - master_idle
        redis_curve.append((round(per_s / masters, 1), round(redis, 4)))
        profiles[f"writes_{share:g}"] = writing.profile
    most = float(drain["events_per_s"])
    worker_curve.append(
        (most, round(most * float(drain["worker_us_per_event"]) / 1e6 - idle.processes["worker"], 4))
    )
    redis_curve.append(
        (
            round(most / masters, 1),
            round(most * float(drain["redis_us_per_event"]) / 1e6 / masters - master_idle, 4),
        )
    )
    for curve in (worker_curve, redis_curve):  # never less for more events (a drain's batches are
        for i in range(1, len(curve)):  # bigger, the lone worker's smaller: the model keeps the most)
            curve[i] = (curve[i][0], max(curve[i][1], curve[i - 1][1]))
    read_rate = CHECK_READS_PER_S / API_NODES
    before, started = target.snapshots(), time.monotonic()
    answered = constant_rate(f"{api[1]}/", read_rate, {"api": api[0].pid}, requests_file=reads)
    after, elapsed = target.snapshots(), time.monotonic() - started
    masters_s = (
        sum(_masters_cpu_s(target, before, after).values()) - master_idle * len(idle.masters) * elapsed
    )
    served = read_rate * (RATE_S + RATE_WARMUP_S)
    figures = Figures(
        worker_curve=tuple(worker_curve),
        redis_curve=tuple(redis_curve),
        api_us_per_read=1e6 * (float(answered["cpu_pct"]["api"]) / 100 - idle.processes["api"]) / read_rate,
        redis_us_per_read=1e6 * masters_s / served,
        worker_idle_cores=idle.processes["worker"],
        redis_idle_cores=master_idle,
        api_idle_cores=idle.processes["api"],
    )
    say(f"capacity: figures {figures}")
    return figures, {"idle": idle.profile, **profiles}


def _writes(profile: Result) -> float:
    """Board batch writes a second on the masters (guarded.lua calls and MULTI/EXECs; the reads'
    scripts in the check are among the calls: an upper bound there)."""
    commands = profile["masters"]["commands"]
    assert isinstance(commands, dict)
    return sum(float(commands.get(c, {}).get("calls", 0)) for c in ("evalsha", "exec"))


def _half_the_partitions(boards: int) -> list[str]:
    """The boards of update_rank's first 3 partitions (the producer's partitioner: CRC-32 of
    the key, librdkafka's consistent_random): a worker holding 3 of them, as each of the
    check's does."""
    names = [f"gift:room{i}" for i in range(boards)]
    return [b for b in names if zlib.crc32(b.encode()) % PARTITIONS < PARTITIONS // 2]


def _wait_quiet(target: RedisTarget, idle: float, timeout: float = 60) -> None:
    """Until the masters are back to idle (the worker caught up with what was produced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = target.snapshots()
        time.sleep(0.5)
        busy = _masters_cpu_s(target, before, target.snapshots())
        if sum(busy.values()) / 0.5 < 3 * idle * len(busy) + 0.01:
            return
    raise BenchError(f"the worker did not catch up within {timeout:.0f}s of the calibration's events")


def _kind(name: str) -> str:
    if name.startswith("worker"):
        return "worker"
    return "api_node" if name.startswith("api") else "redis_master"


def _measure(
    settings: Settings,
    target: RedisTarget,
    apis: list[tuple[Child, str]],
    pids: Mapping[str, int],
    *,
    rate: float,
    reads: Path,
    boards: int,
) -> tuple[dict[str, float], Result]:
    """Each worker's, API node's and master's CPU (cores) while events stream in at `rate` and
    reads arrive at CHECK_READS_PER_S: over CHECK_S seconds in the middle of it; and what Redis did."""
    with paced(settings.kafka_bootstrap, settings.topic_updates, rate, live_stream("cap", boards=boards)):
        loader = threading.Thread(
            target=_read_load, args=([b for _, b in apis], CHECK_READS_PER_S, pids, reads, CHECK_S + 6)
        )
        loader.start()
        time.sleep(3)  # the rate clients' warm-up, the producer's first slices
        got = _stretch(target, pids, CHECK_S)
        loader.join(CHECK_S + 200)
    return {**got.processes, **got.masters}, got.profile


def _wait_shared(ports: list[int], timeout: float = 60) -> None:
    """Until every worker holds some of update_rank's partitions."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(assigned_partitions(port, timeout=2) for port in ports):
            return
        time.sleep(0.2)
    raise BenchError(f"the workers did not share the partitions within {timeout:.0f}s")


def _wait_applied(target: RedisTarget, settings: Settings, boards: int, n: int, timeout: float = 300) -> None:
    keys = [BoardKeys(settings.key_prefix, f"gift:room{i}").seq for i in range(boards)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if target.applied(keys) >= n:
            return
        time.sleep(0.5)
    raise BenchError(f"the capacity check's fill was not applied within {timeout:.0f}s")
