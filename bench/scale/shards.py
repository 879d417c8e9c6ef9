"""The scale benchmark's sharded cases: one board at a live event's peak (docs/boards.md#shards).

One board takes every event (members Zipf, the worker benchmark's windows), drained by one
worker into the 3-master cluster, with the board's type unsharded and with shards: 3, 4 and 8.
Per case, each master's Redis CPU per event (INFO cpu); the figure that matters is the busiest
master's, because one board's writes all land on one master unsharded:

    sharded_busiest_master_ratio        K=3: busiest master's µs/event ÷ the unsharded board's master's
    sharded_busiest_master_ratio_k4     K=4 (four shards on three masters: one holds two)
    sharded_busiest_master_ratio_k8     K=8

The K=3 case asserts its shards sit on the three masters (`sharded_placement`)."""

from __future__ import annotations

import random
from collections.abc import Mapping

from redis.crc import key_slot

from bench.common import BenchError, Result, say
from bench.harness.processes import Children
from bench.harness.stack import Stack
from bench.harness.stats import ratio
from bench.scale import reshard
from bench.scale.drain import Case, prefix_of, run_case
from bench.scale.targets import RedisTarget
from bench.worker.workload import MEMBERS, WINDOWS, make_events, single_messages
from common.boards import BoardsConfig
from common.store.shards import shard_names
from rankstream.cluster import LocalRedisCluster

SHARDS = (1, 3, 4, 8)
BOARD = "global"  # each case's board: big<K>:global
TYPES_YAML = "".join(f"  big{k}: {{windows: [{', '.join(WINDOWS)}], shards: {k}}}\n" for k in SHARDS)
ROWS = (
    "sharded_busiest_master_ratio",
    "sharded_busiest_master_ratio_k4",
    "sharded_busiest_master_ratio_k8",
    *(f"busiest_master_us_per_event_k{k}" for k in SHARDS),
    *(f"events_per_s_k{k}" for k in SHARDS),
    "reshard_member_states_per_s",
    "reshard_redis_us_per_member_state",
    "reshard_s",
)


def _events(n: int, k: int) -> list[tuple[bytes, bytes]]:
    """n events of one board of type big<k>: the same members and scores for every k."""
    events = make_events(n, f"big{k}", random.Random(20261129))
    for event in events:
        event["board"] = f"big{k}:{BOARD}"
    return single_messages(events)


def placement(cluster: LocalRedisCluster, k: int) -> dict[str, int]:
    """The master (port) serving each shard of big<k>:global."""
    return {name: cluster.owner(key_slot(name.encode())) for name in shard_names(f"big{k}:{BOARD}", k)}


def run(
    stack: Stack,
    group: Children,
    target: RedisTarget,
    cluster: LocalRedisCluster,
    *,
    n: int,
    index: int,
    boards: BoardsConfig,
) -> Result:
    cases: dict[int, Result] = {}
    moved: Result = {}
    placed = placement(cluster, 3)
    if len(set(placed.values())) != 3:
        raise BenchError(f"the 3 shards of big3:{BOARD} are not on 3 masters: {placed}")
    for offset, k in enumerate(SHARDS):
        messages = _events(n, k)
        case = Case(f"big_k{k}", 1, target)
        board = f"big{k}:{BOARD}"
        cases[k] = run_case(stack, group, case, messages, shard_names(board, k), index=index + offset)
        say(f"shards {k}: {cases[k]['events_per_s']:,.0f} events/s; busiest master "
            f"{_busiest(cases[k], target):.1f} µs/event; {cases[k]['where_cpu_goes']}")  # fmt: skip
        if k == 1:  # the unsharded board, copied to 3 shards before the next case empties Redis
            moved = reshard.run(target, prefix_of(index + offset), boards, f"big{k}", board)
    return {**summarize(cases, target, placed), **moved}


def _busiest(case: Mapping[str, object], target: RedisTarget) -> float:
    by_node = case["redis_us_per_event_by_node"]
    assert isinstance(by_node, dict)
    return max(float(by_node[node.label]) for node in target.masters)


def summarize(cases: Mapping[int, Result], target: RedisTarget, placed: Mapping[str, int]) -> Result:
    busiest = {k: _busiest(case, target) for k, case in cases.items()}
    out: Result = {f"busiest_master_us_per_event_k{k}": round(v, 2) for k, v in busiest.items()}
    out.update({f"events_per_s_k{k}": case["events_per_s"] for k, case in cases.items()})
    out["sharded_busiest_master_ratio"] = ratio(busiest[3], busiest[1])
    out["sharded_busiest_master_ratio_k4"] = ratio(busiest[4], busiest[1])
    out["sharded_busiest_master_ratio_k8"] = ratio(busiest[8], busiest[1])
    out["sharded_placement"] = dict(placed)
    out["sharded_members"] = MEMBERS
    out["sharded_cases"] = {f"k{k}": case for k, case in cases.items()}
    return out
