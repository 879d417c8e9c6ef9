"""Where a Redis node's CPU goes while a scale case runs, from the node's own counters.

Before and after a case, per node: INFO cpu (the process' user + sys seconds, every thread),
INFO commandstats (calls and µs per command; a script's own calls, e.g. the PUBLISH inside
apply.lua, count under their command and inside the EVALSHA's µs too) and, on a cluster, CLUSTER
INFO's bus message counters. Per event, summed by role (masters, replicas):

- `cpu_us`: all of it;
- `scripts_wall_us`: inside EVALSHA/EVAL (the apply script: Lua, its reads, writes and notice);
- `other_commands_wall_us`: every other command (on a master nearly all are the script's own
  calls, so `scripts_wall_us - other_commands_wall_us` is the Lua interpreter's part; on a
  replica, the replication stream's writes);
- `commands`: the top commands' µs and calls per event;
- `bus_messages`: cluster bus messages sent and received per event, by type (a PUBLISH on a
  cluster goes over the bus to every other node: `publish_sent` shows the fan-out).

commandstats times are wall clock: a node the OS preempts mid-command counts the wait. On a box
below saturation they are CPU (they sum to about `cpu_us`); on a busy one (every cluster case on
2 cores, with 6 Redis processes) they exceed it, and only the calls and messages carry over."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

import redis

from bench.common import Result
from bench.redis_cost import redis_cpu_s

SCRIPT_COMMANDS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"})
TOP_COMMANDS = 8
BUS_PREFIX = "cluster_stats_messages_"


@dataclass(frozen=True)
class Snapshot:
    cpu_s: float
    commands: dict[str, tuple[int, int]]  # command -> (calls, µs)
    bus: dict[str, int]  # message type and direction (e.g. "publish_received") -> count


def snapshot(client: redis.Redis, cluster: bool) -> Snapshot:
    """One node's counters now."""
    stats = cast("dict[str, dict[str, int]]", client.info("commandstats"))
    commands = {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
        if isinstance(v, dict)
    }
    bus: dict[str, int] = {}
    if cluster:
        fields = cast("dict[str, object]", client.cluster("info"))  # redis-py parses it
        for key, value in fields.items():
            if key.startswith(BUS_PREFIX) and not key.endswith("_total"):
                bus[key.removeprefix(BUS_PREFIX)] = int(str(value))
    return Snapshot(redis_cpu_s(client), commands, bus)


def _per(value: float, n: int) -> float:
    return round(value / n, 3)


def role_profile(pairs: Iterable[tuple[Snapshot, Snapshot]], n: int) -> Result:
    """The nodes of one role (their before and after), summed, per event (n events)."""
    cpu_us = 0.0
    commands: dict[str, list[int]] = {}
    bus: dict[str, int] = {}
    for before, after in pairs:
        cpu_us += 1e6 * (after.cpu_s - before.cpu_s)
        for name, (calls, usec) in after.commands.items():
            was_calls, was_usec = before.commands.get(name, (0, 0))
            total = commands.setdefault(name, [0, 0])
            total[0] += calls - was_calls
            total[1] += usec - was_usec
        for key, count in after.bus.items():
            bus[key] = bus.get(key, 0) + count - before.bus.get(key, 0)
    scripts_us = sum(usec for name, (_, usec) in commands.items() if name in SCRIPT_COMMANDS)
    others_us = sum(usec for name, (_, usec) in commands.items() if name not in SCRIPT_COMMANDS)
    top = sorted(commands.items(), key=lambda item: -item[1][1])[:TOP_COMMANDS]
    return {
        "cpu_us": _per(cpu_us, n),
        "scripts_wall_us": _per(scripts_us, n),
        "other_commands_wall_us": _per(others_us, n),
        "commands": {
            name: {"us": _per(usec, n), "calls": _per(calls, n)} for name, (calls, usec) in top if calls
        },
        "bus_messages": {key: _per(count, n) for key, count in sorted(bus.items()) if count},
    }


def profile(
    before: Mapping[int, Snapshot], after: Mapping[int, Snapshot], roles: Mapping[str, list[int]], n: int
) -> Result:
    """Per role ("masters", "replicas": their ports) with any node: role_profile."""
    return {
        role: role_profile(((before[port], after[port]) for port in ports), n)
        for role, ports in roles.items()
        if ports
    }
