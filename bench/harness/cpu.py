"""CPU accounting from /proc: CPU% of named processes over a stretch of time, and the CPU of a
load tool (wrk, redis-benchmark, the rate client) run to its end beside them."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO
from bench.harness.processes import child_env

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
NOT_A_PROCESS = frozenset({"machine", "others"})  # CpuMeter's keys that name no process


def _process_ticks(pid: int) -> int | None:
    """utime + stime of every thread of `pid`, in clock ticks; None when unreadable (not Linux,
    or the process is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: count fields after the last ')'
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, total) ticks of all cores since boot, from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in first.split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuMeter:
    """CPU% of named processes between start() and stop(): 100 = one full core. "machine" is
    the busy share of all cores (100 = every core busy) and "others" what processes not named
    here used (100 = one core): how noisy the box was while this was measured."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._pids = dict(pids)
        self._t0 = 0.0
        self._ticks0: dict[str, int | None] = {}
        self._machine0: tuple[int, int] | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._ticks0 = {name: _process_ticks(pid) for name, pid in self._pids.items()}
        self._machine0 = _machine_ticks()

    def stop(self) -> dict[str, float]:
        elapsed = time.monotonic() - self._t0
        out: dict[str, float] = {}
        if elapsed <= 0:
            return out
        ours = 0
        for name, pid in self._pids.items():
            before, after = self._ticks0.get(name), _process_ticks(pid)
            if before is not None and after is not None:
                ours += after - before
                out[name] = round(100 * (after - before) / _CLK_TCK / elapsed, 1)
        machine_now = _machine_ticks()
        if self._machine0 is not None and machine_now is not None:
            busy, total = (now - then for now, then in zip(machine_now, self._machine0, strict=True))
            if total > 0:
                out["machine"] = round(100 * busy / total, 1)
                out["others"] = round(100 * max(0, busy - ours) / _CLK_TCK / elapsed, 1)
        return out


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class ToolRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_pct: dict[str, float]  # the metered processes', the tool's (under its name) and the box's


def run_tool(name: str, argv: Sequence[str], pids: Mapping[str, int], timeout: float) -> ToolRun:
    """Run a load tool to its end while metering `pids`. Its own CPU% goes under `name`: it has
    exited and been reaped by then, so it is in our children's rusage; the meter could not see
    it and counted it in "others", so it is taken out of there."""
    meter = CpuMeter(pids)
    children0 = _children_cpu_s()
    started = time.monotonic()
    meter.start()
    proc = subprocess.run(
        list(argv), cwd=REPO, env=child_env({}), capture_output=True, text=True, timeout=timeout, check=False
    )
    cpu = meter.stop()
    wall_s = time.monotonic() - started
    cpu[name] = round(100 * (_children_cpu_s() - children0) / wall_s, 1)
    if "others" in cpu:
        cpu["others"] = round(max(0.0, cpu["others"] - cpu[name]), 1)
    return ToolRun(proc.returncode, proc.stdout, proc.stderr, wall_s, cpu)


def cpu_us_per_unit(cpu_pct: Mapping[str, float], per_s: float) -> dict[str, float]:
    """CPU microseconds each process spent per unit of work (an event, a request) done at
    `per_s` a second: less sensitive to a noisy box than the rates are."""
    return {
        name: round(pct / 100 / per_s * 1e6, 1) for name, pct in cpu_pct.items() if name not in NOT_A_PROCESS
    }
