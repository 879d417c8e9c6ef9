"""The capacity model (docs/capacity.md): from a target load to partitions, workers, API nodes,
Redis masters and memory, by arithmetic on per-core figures `make bench` measures.

Every figure is CPU time (or bytes) per unit of work on one core, plus what a process of each
kind spends idle; a process uses at most one core (a worker applies on one thread, a Redis
master runs commands on one, an API node serves on one event loop). A kind's processes are its
total CPU divided by what one process may use (`utilization`, the share of a core planned for,
less its idle cost; the rest is headroom for peaks, failovers and rebalances). Costs scale with
the window instances an event writes, linearly from the measured workload's (FIGURE_WINDOWS). A
board takes its tier's events evenly (events_per_s / boards); a board whose Redis CPU exceeds one
master's budget needs `shards: K`. A board's events share one partition (producers key them by
board), so one worker applies all of them: a board faster than one worker is flagged.
`rankstream capacity target.yaml` prints the plan; `--figures bench/results/scale.json` uses
the figures of a run of `make bench` instead of the ones below."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import ConfigError
from common.store.shards import MAX_SHARDS

FIGURE_WINDOWS = 3  # the benchmarks' boards write total, day and week: 3 instances an event
GB = 1024**3
API_BASE_BYTES = 150e6  # an API node's RSS without hot boards


@dataclass(frozen=True)
class Figures:
    """Per-core costs: what one process of each kind spends doing nothing (cores), and per unit
    of work at a moderate load (µs; a quarter of a worker's drain rate: what a deployment planned
    at `utilization` runs at, and small batches cost more per event than a drain's). The
    defaults: `make bench` on the 2-core development machine (Nov 2026); `from_reports` reads
    the report keys named beside each."""

    worker_us_per_event: float = 300.0  # scale.json capacity_worker_us_per_event
    redis_us_per_event: float = 45.0  # capacity_redis_us_per_event (all masters together)
    api_us_per_read: float = 500.0  # capacity_api_us_per_read (top-10 pages and ranks from Redis)
    redis_us_per_read: float = 40.0  # capacity_redis_us_per_read
    worker_idle_cores: float = 0.02  # capacity_worker_idle_cores
    redis_idle_cores: float = 0.01  # capacity_redis_idle_cores (each master)
    api_idle_cores: float = 0.01  # capacity_api_idle_cores
    redis_replica_us_per_event: float = 18.0  # redis_replica_us_per_event_1w_cluster
    redis_bytes_per_member_window: float = 187.0  # worker.json redis_bytes_per_member_window
    redis_bytes_per_event_id: float = 24.0  # worker.json redis_bytes_per_event_id
    api_bytes_per_hot_member: float = 290.0  # hot members' RSS per member (docs/hot-boards.md)

    @classmethod
    def from_reports(cls, reports: Mapping[str, Any]) -> Figures:
        """The figures `make bench` reports hold (scale.json, worker.json, merged); the defaults
        for the others."""
        names = {f.name for f in fields(cls)}
        keys = {name: f"capacity_{name}" for name in names}
        keys |= {
            "redis_replica_us_per_event": "redis_replica_us_per_event_1w_cluster",
            "redis_bytes_per_member_window": "redis_bytes_per_member_window",
            "redis_bytes_per_event_id": "redis_bytes_per_event_id",
        }
        found = {name: float(reports[key]) for name, key in keys.items() if reports.get(key) is not None}
        return cls(**found)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tier(_Strict):
    name: str
    boards: Annotated[int, Field(ge=1)]
    events_per_s: Annotated[float, Field(ge=0)]
    members_per_board: Annotated[int, Field(ge=0)]
    windows: Annotated[int, Field(ge=1)] = FIGURE_WINDOWS  # window instances an event writes


class Target(_Strict):
    tiers: list[Tier]
    reads_per_s: Annotated[float, Field(ge=0)] = 0.0  # answered from Redis
    hot_members: Annotated[int, Field(ge=0)] = 0  # held in every API node's memory
    id_window_s: Annotated[int, Field(ge=1)] = 600
    utilization: Annotated[float, Field(gt=0, le=1)] = 0.6
    redis_memory_gb: Annotated[float, Field(gt=0)] = 16.0  # each master's; 70% of it planned for
    replicas_per_master: Annotated[int, Field(ge=0)] = 1
    partitions_min: Annotated[int, Field(ge=1)] = 6


@dataclass
class Plan:
    events_per_s: float
    partitions: int
    workers: int
    api_nodes: int
    redis_masters: int
    redis_replicas: int
    shards: dict[str, int]  # per tier: `shards:` its board type needs (1: none)
    over_one_worker: dict[str, float]  # tiers whose boards take more than one worker can: its share
    redis_memory_gb: float  # data, masters only (each replica holds as much again)
    api_memory_gb_per_node: float
    cpu: dict[str, float] = field(default_factory=dict)  # cores by kind, before headroom
    why_masters: str = ""


def load_target(path: str | Path) -> Target:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        return Target.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the target: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None


def load_figures(paths: list[str]) -> Figures:
    merged: dict[str, Any] = {}
    for path in paths:
        try:
            merged.update(orjson.loads(Path(path).read_bytes()))
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not a benchmark report: {exc}") from None
    return Figures.from_reports(merged)


def _scaled(us: float, windows: int) -> float:
    return us * windows / FIGURE_WINDOWS


def _cores(target: Target, us_per_event: float) -> float:
    """Cores the target's events take at `us_per_event` (for the figures' windows)."""
    return sum(t.events_per_s * _scaled(us_per_event, t.windows) for t in target.tiers) / 1e6


def _board_cores(tier: Tier, us_per_event: float) -> float:
    """Cores one board of the tier takes at `us_per_event` (its share of the tier's events)."""
    return tier.events_per_s / tier.boards * _scaled(us_per_event, tier.windows) / 1e6


def plan(target: Target, figures: Figures) -> Plan:
    util = target.utilization
    events = sum(t.events_per_s for t in target.tiers)
    worker_cores = _cores(target, figures.worker_us_per_event)
    write_cores = _cores(target, figures.redis_us_per_event)
    read_cores = target.reads_per_s * figures.redis_us_per_read / 1e6
    api_cores = target.reads_per_s * figures.api_us_per_read / 1e6
    master_room = util - figures.redis_idle_cores  # what a master has for commands
    shards = {}
    for tier in target.tiers:  # one board's writes, on one master unless sharded
        shards[tier.name] = max(1, math.ceil(_board_cores(tier, figures.redis_us_per_event) / master_room))
    too_big = [name for name, k in shards.items() if k > MAX_SHARDS]
    if too_big:
        raise ConfigError(f"tiers {', '.join(too_big)}: one board needs more than {MAX_SHARDS} shards")
    per_member = figures.redis_bytes_per_member_window
    data = sum(t.boards * t.members_per_board * t.windows * per_member for t in target.tiers)
    ids = events * target.id_window_s * figures.redis_bytes_per_event_id
    memory_gb = (data + ids) / GB
    needs = {  # a tie goes to the first named
        "the biggest board's shards": max(shards.values(), default=1),
        "CPU": math.ceil((write_cores + read_cores) / master_room),
        "memory": math.ceil(memory_gb / (target.redis_memory_gb * 0.7)),
    }
    why = max(needs, key=lambda name: needs[name])
    worker_room = util - figures.worker_idle_cores
    workers = max(1, math.ceil(worker_cores / worker_room))
    over = {}
    for tier in target.tiers:  # one partition, one worker, whatever the shards
        per_board = _board_cores(tier, figures.worker_us_per_event)
        if per_board > worker_room:
            over[tier.name] = round(per_board / worker_room, 2)
    cpu = {
        "workers": round(worker_cores, 3),
        "redis_masters": round(write_cores + read_cores, 3),
        "redis_replicas": round(events * figures.redis_replica_us_per_event / 1e6, 3),
        "api_nodes": round(api_cores, 3),
    }
    masters = max(*needs.values(), 1)
    api_memory = (target.hot_members * figures.api_bytes_per_hot_member + API_BASE_BYTES) / GB
    return Plan(
        events_per_s=events,
        partitions=max(target.partitions_min, 2 * workers),  # room to double the workers
        workers=workers,
        api_nodes=max(2, math.ceil(api_cores / (util - figures.api_idle_cores))),  # two: one may restart
        redis_masters=masters,
        redis_replicas=masters * target.replicas_per_master,
        shards=shards,
        over_one_worker=over,
        redis_memory_gb=round(memory_gb, 2),
        api_memory_gb_per_node=round(api_memory, 2),
        cpu=cpu,
        why_masters=why,
    )


def predict(
    figures: Figures,
    *,
    events_per_s: float,
    windows: int,
    reads_per_s: float,
    deployment: Mapping[str, int],
) -> dict[str, float]:
    """CPU seconds per second of one process of each kind (`deployment`: worker, api_node,
    redis_master -> how many) at a load, events spread evenly over workers and masters and reads
    over API nodes: what the model's check compares with a run."""
    writes = events_per_s * _scaled(figures.redis_us_per_event, windows)
    masters, workers, apis = deployment["redis_master"], deployment["worker"], deployment["api_node"]
    return {
        "worker": figures.worker_idle_cores
        + events_per_s * _scaled(figures.worker_us_per_event, windows) / 1e6 / workers,
        "redis_master": figures.redis_idle_cores
        + (writes + reads_per_s * figures.redis_us_per_read) / 1e6 / masters,
        "api_node": figures.api_idle_cores + reads_per_s * figures.api_us_per_read / 1e6 / apis,
    }


def render(target: Target, result: Plan, figures: Figures) -> str:
    cpu = result.cpu
    lines = [
        f"events/s (all tiers): {result.events_per_s:,.0f}",
        f"update_rank partitions: {result.partitions}",
        f"workers: {result.workers} ({cpu['workers']:.2f} cores, each used to {target.utilization:.0%})",
        f"API nodes: {result.api_nodes} (Redis reads {target.reads_per_s:,.0f}/s:"
        f" {cpu['api_nodes']:.2f} cores; memory {result.api_memory_gb_per_node:.2f} GB each)",
        f"Redis masters: {result.redis_masters} (set by {result.why_masters}; commands"
        f" {cpu['redis_masters']:.2f} cores), replicas: {result.redis_replicas}",
        f"Redis memory: {result.redis_memory_gb:.2f} GB of data (each replica as much again)",
    ]
    lines += [f"shards: {k} for the boards of tier {name}" for name, k in result.shards.items() if k > 1]
    lines += [
        f"warning: a board of tier {name} takes {share:g}x what one worker may apply: its events share"
        " one partition (docs/capacity.md#one-board-one-worker)"
        for name, share in result.over_one_worker.items()
    ]
    lines.append("figures: " + ", ".join(f"{f.name} {getattr(figures, f.name):g}" for f in fields(figures)))
    return "\n".join(lines)
