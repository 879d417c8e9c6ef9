"""The scale benchmark: ingest with 1 and 2 workers, against a single Redis and a Redis Cluster.

One run, one private Kafka (the harness'), one single Redis and one local Redis Cluster (3
masters with a replica each, rankstream/cluster.py); every Redis with AOF on (bench/scale/
targets.py). One set of N single-event messages (the worker benchmark's gift events: members
Zipf, boards uniform, here over BOARDS boards so the cluster's slots spread them over its three
masters). Each case (bench/scale/drain.py) runs real `rankstream worker` processes in a fresh
group on a fresh topic (update_rank's 6 partitions) and key prefix, from an empty Redis, and
times them draining all N released at once, to lag 0:

    1w_single, 1w_cluster, 2w_single, 2w_cluster   1 or 2 workers, single Redis or cluster
    1w_cluster_wait    1w_cluster with RANKSTREAM_REDIS_WAIT_REPLICAS=1: before each batch's
                       commit the worker waits until every master's replica holds its writes

Per case: events/s; CPU per event (µs) of Redis (`redis_us_per_event`: INFO cpu, summed over the
cluster's masters; `redis_replica_us_per_event`: its replicas, which users pay for too), of the
workers (/proc, summed) and of the Kafka broker; per core: `events_per_cpu_s` = events per second
of one core spent by workers and Redis (replicas included), `events_per_s_per_busy_core`; where
the box's CPU went (`where_cpu_goes`, `cpu_split_pct`) and, inside Redis, per event (`redis_profile`,
bench/scale/profile.py): in the apply script, in other commands, cluster bus messages.
Ratios within the run: cluster against single, two workers against one, the WAIT option against
none. The box has 2 cores: with two workers, Redis and Kafka on it, the cases with 2 workers
measure what the box can do, not what 2 workers on 2 machines would; the CPU per event is the
figure that carries over.

Then one board at a live event's peak, unsharded and sharded (bench/scale/shards.py): the busiest
master's Redis CPU per event with shards: 3 against the board unsharded
(`sharded_busiest_master_ratio`, and with 4 and 8 shards); and its reads while events stream in
(bench/scale/shardreads.py): top-10 and member-rank p99, sharded against unsharded. Last, the
capacity model's check (bench/scale/capacity.py): its prediction of each process' CPU against a
run of 2 workers, 2 API nodes and the cluster (`capacity_model_error`).

Knobs: RANKSTREAM_BENCH_EVENTS (N is half of it: default 150000 events per case),
RANKSTREAM_BENCH_SCALE_BOARDS (2000), RANKSTREAM_BENCH_SCALE_SHARDED_EVENTS (100000 a sharded case),
RANKSTREAM_BENCH_SCALE_CASES (the cases above to run, comma-separated; default all),
RANKSTREAM_BENCH_SCALE_PARTS (sharded,capacity,reads: which of the later parts run; default all).
"""

from __future__ import annotations

import os
import random
import time

from bench.common import REPO, Result, env_int, say
from bench.harness.processes import children
from bench.harness.report import Row, header
from bench.harness.stack import private_stack
from bench.harness.stats import ratio
from bench.scale import capacity, shardreads, shards
from bench.scale.drain import Case, run_case
from bench.scale.targets import cluster_target, local_cluster, single_target
from bench.worker.workload import BOARDS_YAML, MEMBERS, WINDOWS, make_events, single_messages
from common.boards import parse_boards
from common.settings import Settings

FOLDER = REPO / ".stack" / "bench-scale"
DEFAULT_EVENTS = 300_000  # the worker benchmark's default; this one runs half of it per case
DEFAULT_BOARDS = 2_000
DEFAULT_SHARDED_EVENTS = 100_000
SCALE_YAML = BOARDS_YAML + shards.TYPES_YAML
WAIT_SETTING = "redis_wait_replicas"
WAIT_ENV = {"RANKSTREAM_REDIS_WAIT_REPLICAS": "1"}
# (name, workers, target, needs the WAIT setting): the pairs compared run next to each other
CASES = (
    ("1w_single", 1, "single", False),
    ("1w_cluster", 1, "cluster", False),
    ("2w_single", 2, "single", False),
    ("2w_cluster", 2, "cluster", False),
    ("1w_cluster_wait", 1, "cluster", True),
)
NAMES = [name for name, *_ in CASES]
RATIOS = {  # name: (numerator case, denominator case), of events/s
    "cluster_vs_single_1w": ("1w_cluster", "1w_single"),
    "cluster_vs_single_2w": ("2w_cluster", "2w_single"),
    "two_vs_one_worker_single": ("2w_single", "1w_single"),
    "two_vs_one_worker_cluster": ("2w_cluster", "1w_cluster"),
    "cluster_wait_vs_cluster_1w": ("1w_cluster_wait", "1w_cluster"),
}
PER_CASE = (
    "redis_us_per_event",
    "redis_replica_us_per_event",
    "worker_us_per_event",
    "kafka_us_per_event",
    "events_per_cpu_s",
    "events_per_s_per_busy_core",
)
PROFILE_ROWS = ("cpu_us", "scripts_wall_us", "other_commands_wall_us", "bus_messages.publish_sent")
ROWS = [
    *(Row(f"events_per_s_{name}") for name in NAMES),
    *(Row(name) for name in RATIOS),
    Row("redis_cluster_vs_single_us_1w"),
    Row("redis_cluster_with_replicas_vs_single_us_1w"),
    *(Row(f"{metric}_{name}") for metric in PER_CASE for name in NAMES),
    *(Row(f"cases.{name}.where_cpu_goes") for name in NAMES),
    *(Row(f"cases.{name}.redis_profile.masters.{part}") for part in PROFILE_ROWS for name in NAMES),
    *(Row(f"cases.{name}.worker_metrics.apply_share") for name in NAMES),
    *(Row(f"cases.{name}.applied") for name in NAMES),
    *(Row(name) for name in shards.ROWS),
    *(Row(name) for name in shardreads.ROWS),
    Row("capacity_model_error"),
    Row("capacity_model_worst"),
]


def summarize(cases: dict[str, Result]) -> Result:
    out: Result = {}
    for name in NAMES:
        case = cases.get(name, {})
        out[f"events_per_s_{name}"] = case.get("events_per_s")
        for metric in PER_CASE:
            out[f"{metric}_{name}"] = case.get(metric)
    for key, (top, bottom) in RATIOS.items():
        a, b = out[f"events_per_s_{top}"], out[f"events_per_s_{bottom}"]
        out[key] = None if a is None or b is None else ratio(a, b)
    single = out["redis_us_per_event_1w_single"]
    masters, replicas = out["redis_us_per_event_1w_cluster"], out["redis_replica_us_per_event_1w_cluster"]
    if single and masters is not None:
        # what an event costs Redis in the cluster against one server (masters; and with replicas)
        out["redis_cluster_vs_single_us_1w"] = ratio(masters, single)
        out["redis_cluster_with_replicas_vs_single_us_1w"] = ratio(masters + (replicas or 0.0), single)
    return out


def run() -> Result:
    n = max(1, env_int("EVENTS", DEFAULT_EVENTS) // 2)
    boards = env_int("SCALE_BOARDS", DEFAULT_BOARDS)
    head = header()
    started = time.monotonic()
    rng = random.Random(20261123)  # the same events every run: only the code under test changes
    events = make_events(n, "scale", rng, boards=boards)
    messages = single_messages(events)
    board_names = sorted({str(event["board"]) for event in events})
    has_wait = WAIT_SETTING in Settings.model_fields
    cases: dict[str, Result] = {}
    sharded: Result = {}
    with (
        private_stack(FOLDER, SCALE_YAML, persist=True) as stack,
        local_cluster(FOLDER / "cluster") as cluster,
        children(FOLDER / "logs") as group,
    ):
        targets = {"single": single_target(stack), "cluster": cluster_target(cluster)}
        try:
            for target in targets.values():
                target.prepare()
            only = os.environ.get("RANKSTREAM_BENCH_SCALE_CASES")  # e.g. "1w_cluster" ("": none)
            for index, (name, workers, where, wait) in enumerate(CASES):
                if only is not None and name not in only.split(","):
                    continue
                if wait and not has_wait:
                    say(f"{name}: skipped: Settings has no {WAIT_SETTING} yet")
                    cases[name] = {"missing": f"Settings has no {WAIT_SETTING}"}
                    continue
                case = Case(name, workers, targets[where], WAIT_ENV if wait else {})
                cases[name] = run_case(stack, group, case, messages, board_names, index=index)
                say(f"{name}: {cases[name]['events_per_s']:,.0f} events/s; {cases[name]['where_cpu_goes']}")
            parts = os.environ.get("RANKSTREAM_BENCH_SCALE_PARTS", "sharded,capacity,reads").split(",")
            sharded_n = env_int("SCALE_SHARDED_EVENTS", DEFAULT_SHARDED_EVENTS)
            index = len(CASES) + len(shards.SHARDS)
            if "sharded" in parts:
                sharded = shards.run(
                    stack,
                    group,
                    targets["cluster"],
                    cluster,
                    n=sharded_n,
                    index=len(CASES),
                    boards=parse_boards(SCALE_YAML),
                )
            if "capacity" in parts and "1w_cluster" in cases:  # the check takes its figures from it
                sharded |= capacity.run(
                    stack, group, targets["cluster"], cases=cases, boards=boards, index=index + 2
                )
            if "reads" in parts and "events_per_s_k3" in sharded:
                ingest_max = float(sharded["events_per_s_k3"])
                reads_n = sharded_n // 5
                sharded |= shardreads.run(
                    stack, group, targets["cluster"], n=reads_n, ingest_max=ingest_max, index=index
                )
        finally:
            for target in targets.values():
                target.close()
    return {
        **summarize(cases),
        **sharded,
        "n_events": n,
        "boards": len(board_names),
        "members": MEMBERS,
        "windows": list(WINDOWS),
        "cluster_masters": cluster.masters,
        "cluster_replicas_per_master": cluster.replicas,
        "cases": cases,
        **head,
        "duration_s": round(time.monotonic() - started, 1),
    }
