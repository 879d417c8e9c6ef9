"""The capacity model (docs/capacity.md): from a target load to partitions, workers, API nodes,
Redis masters and memory, by arithmetic on per-core figures `make bench` measures.

Every figure is CPU time (or bytes) per unit of work on one core, plus what a process of each
kind spends idle; a process uses at most one core (a worker applies on one thread, a Redis
master runs commands on one, an API node serves on one event loop). A kind's processes are the
fewest whose load each leaves within `utilization` of a core (the rest is headroom for peaks,
failovers and rebalances). What a worker or a master spends on events is not proportional to
them: a worker's rounds (poll, write, Kafka transaction) cost the same whatever they carry, and
so do a Redis event loop's wakeups, so a busier process spends less per event. The figures are
therefore curves: a worker's CPU at the events/s it applies, a master's at the events/s it takes,
measured at a few loads and interpolated (past the last, at its marginal cost). Costs scale with
the window instances an event writes, linearly from the measured workload's (FIGURE_WINDOWS). A
board takes its tier's events evenly (events_per_s / boards); a board whose writes exceed one
master's budget needs `shards: K`. A board's events share one partition (producers key them by
board), so one worker applies all of them: a board faster than one worker is flagged.
`rankstream capacity target.yaml` prints the plan; `--figures bench/results/scale.json` uses
the figures of a run of `make bench` instead of the ones below."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
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


Curve = tuple[tuple[float, float], ...]  # (events/s, cores above idle), by rising events/s


@dataclass(frozen=True)
class Figures:
    """Per-core costs: what one process of each kind spends doing nothing (cores), per read
    (µs), and its CPU over idle at a load (a curve). The defaults: `make bench` on the 2-core
    development machine (Nov 2026); `from_reports` reads the report keys named beside each."""

    # one worker holding 3 busy partitions: events/s it applies -> cores (capacity_worker_curve;
    # its last point: a worker draining a backlog, its most)
    worker_curve: Curve = ((876.6, 0.343), (1753.2, 0.572), (3506.4, 0.747), (8766.1, 0.817))
    # one master: events/s it takes (its share of all boards' writes) -> cores (capacity_redis_curve)
    redis_curve: Curve = ((292.2, 0.055), (584.4, 0.094), (1168.8, 0.098), (2922.0, 0.098))
    api_us_per_read: float = 830.0  # capacity_api_us_per_read (top-10 pages and ranks from Redis)
    redis_us_per_read: float = 172.0  # capacity_redis_us_per_read
    worker_idle_cores: float = 0.005  # capacity_worker_idle_cores
    redis_idle_cores: float = 0.002  # capacity_redis_idle_cores (each master)
    api_idle_cores: float = 0.002  # capacity_api_idle_cores
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
        found: dict[str, Any] = {}
        for name, key in keys.items():
            value = reports.get(key)
            if value is None:
                continue
            if name.endswith("_curve"):
                found[name] = tuple((float(x), float(y)) for x, y in value)
            else:
                found[name] = float(value)
        return cls(**found)


def at(curve: Curve, events_per_s: float) -> float:
    """Cores over idle at `events_per_s`: through (0, 0) and the curve's points, straight
    between them, and past the last at the last point's cost per event."""
    if events_per_s <= 0:
        return 0.0
    points = ((0.0, 0.0), *curve)
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if events_per_s <= x1:
            return y0 + (y1 - y0) * (events_per_s - x0) / (x1 - x0)
    x1, y1 = points[-1]
    return y1 / x1 * events_per_s


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


def _weight(target: Target) -> float:
    """The target's window instances per event, against the figures' (event-weighted)."""
    events = sum(t.events_per_s for t in target.tiers)
    if events == 0:
        return 1.0
    return sum(t.events_per_s * t.windows for t in target.tiers) / events / FIGURE_WINDOWS


def _fewest(load: Callable[[int], float], room: float) -> int:
    """The fewest processes n >= 1 whose each one's load(n) (cores; falling as n grows) is
    within `room`; 0 when none would do."""
    if room <= 0:
        return 0
    n = 1
    while load(n) > room:
        if n > 1_000_000:
            return 0
        n *= 2
    low = n // 2 + 1 if n > 1 else 1
    while low < n:
        mid = (low + n) // 2
        if load(mid) > room:
            low = mid + 1
        else:
            n = mid
    return n


def plan(target: Target, figures: Figures) -> Plan:
    util = target.utilization
    events = sum(t.events_per_s for t in target.tiers)
    weight = _weight(target)

    def worker_load(per_worker: float) -> float:
        return at(figures.worker_curve, per_worker) * weight

    def master_writes(per_master: float) -> float:
        return at(figures.redis_curve, per_master) * weight

    read_cores = target.reads_per_s * figures.redis_us_per_read / 1e6
    api_cores = target.reads_per_s * figures.api_us_per_read / 1e6
    master_room = util - figures.redis_idle_cores  # what a master has for commands
    worker_room = util - figures.worker_idle_cores
    shards = {}
    for tier in target.tiers:  # one board's writes, on one master unless sharded
        per_board = tier.events_per_s / tier.boards
        k = 1
        while (
            k <= MAX_SHARDS
            and at(figures.redis_curve, per_board / k) * tier.windows / FIGURE_WINDOWS > master_room
        ):
            k += 1
        shards[tier.name] = k
    too_big = [name for name, k in shards.items() if k > MAX_SHARDS]
    if too_big:
        raise ConfigError(f"tiers {', '.join(too_big)}: one board needs more than {MAX_SHARDS} shards")
    workers = _fewest(lambda n: worker_load(events / n), worker_room)
    if workers == 0:
        raise ConfigError(f"utilization {util:g} leaves a worker no room over its idle cost")
    per_member = figures.redis_bytes_per_member_window
    data = sum(t.boards * t.members_per_board * t.windows * per_member for t in target.tiers)
    ids = events * target.id_window_s * figures.redis_bytes_per_event_id
    memory_gb = (data + ids) / GB
    cpu_masters = _fewest(lambda n: master_writes(events / n) + read_cores / n, master_room)
    needs = {  # a tie goes to the first named
        "the biggest board's shards": max(shards.values(), default=1),
        "CPU": max(cpu_masters, 1),
        "memory": math.ceil(memory_gb / (target.redis_memory_gb * 0.7)),
    }
    why = max(needs, key=lambda name: needs[name])
    masters = max(*needs.values(), 1)
    over = {}
    for tier in target.tiers:  # one partition, one worker, whatever the shards
        per_board = at(figures.worker_curve, tier.events_per_s / tier.boards) * tier.windows / FIGURE_WINDOWS
        if per_board > worker_room:
            over[tier.name] = round(per_board / worker_room, 2)
    cpu = {
        "workers": round(workers * worker_load(events / workers), 3),
        "redis_masters": round(masters * master_writes(events / masters) + read_cores, 3),
        "redis_replicas": round(events * figures.redis_replica_us_per_event / 1e6, 3),
        "api_nodes": round(api_cores, 3),
    }
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
    masters, workers, apis = deployment["redis_master"], deployment["worker"], deployment["api_node"]
    weight = windows / FIGURE_WINDOWS
    return {
        "worker": figures.worker_idle_cores + at(figures.worker_curve, events_per_s / workers) * weight,
        "redis_master": figures.redis_idle_cores
        + at(figures.redis_curve, events_per_s / masters) * weight
        + reads_per_s * figures.redis_us_per_read / 1e6 / masters,
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
    lines.append(
        "figures: " + ", ".join(f"{f.name} {_shown(getattr(figures, f.name))}" for f in fields(figures))
    )
    return "\n".join(lines)


def _shown(value: float | Curve) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{x:g}/s:{y:g}" for x, y in value)
    return f"{value:g}"
