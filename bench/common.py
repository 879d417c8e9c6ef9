"""What every benchmark shares: run metadata, CPU accounting, the printed table, the JSON file."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Benchmark switches are RANKSTREAM_BENCH_*; child rankstream processes must not see them
# (load_settings refuses unknown RANKSTREAM_* variables as typos).
ENV_PREFIX = "RANKSTREAM_BENCH_"

Result = dict[str, Any]


class BenchError(Exception):
    """A benchmark could not produce a trustworthy number (a stall, a lost event, a bad tool)."""


@dataclass(frozen=True)
class Row:
    """One line of the printed table: a dotted path into the result, and the goal it answers
    to (a key of result["goals"]; None = informative only)."""

    metric: str
    goal: str | None = None
    at_most: bool = False  # the goal is a ceiling (a latency, a size): met when value <= goal


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise BenchError(f"{ENV_PREFIX}{name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise BenchError(f"{ENV_PREFIX}{name} must be positive, got {value}")
    return value


def child_env(settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of a rankstream child: ours without any RANKSTREAM_* (so the caller's
    shell cannot change what is measured), plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env.update(settings)
    return env


def git_commit() -> tuple[str | None, bool | None]:
    """(HEAD, whether the work tree differs from it); (None, None) outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO, capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, bool(status.strip())


def machine() -> dict[str, Any]:
    """Where the numbers come from: they only compare within one run on one machine."""
    load: list[float] | None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": load,
    }


def timestamp() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# --- CPU accounting ---------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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


# --- output -----------------------------------------------------------------------------------


def lookup(result: Mapping[str, Any], path: str) -> Any:
    """result["a"]["b"] for "a.b"; None when any part is missing."""
    node: Any = result
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return (
            f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
        )
    return str(value)


def scalar_rows(result: Mapping[str, Any]) -> list[Row]:
    """Every top-level number of a result, for a benchmark that names no ROWS."""
    return [
        Row(key, key if key in result.get("goals", {}) else None)
        for key, value in result.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]


def format_table(name: str, result: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """metric | value | goal | met, one line per row; a goal is met when value >= goal (value <=
    goal for an `at_most` row, shown as "<= goal")."""
    goals: Mapping[str, Any] = result.get("goals", {})
    lines = [("metric", "value", "goal", "met")]
    for row in rows:
        value = lookup(result, row.metric)
        goal = goals.get(row.goal) if row.goal else None
        ok = None if goal is None or value is None else (value <= goal if row.at_most else value >= goal)
        met = "" if ok is None else ("yes" if ok else "NO")
        shown = "" if goal is None else ("<= " if row.at_most else "") + _fmt(goal)
        lines.append((row.metric, _fmt(value), shown, met))
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    out = [f"== bench {name} =="]
    for i, line in enumerate(lines):
        out.append(
            f"{line[0]:<{widths[0]}}  {line[1]:>{widths[1]}}  {line[2]:>{widths[2]}}  {line[3]}".rstrip()
        )
        if i == 0:
            out.append("-" * (sum(widths) + 6 + 2))
    return "\n".join(out)


def write_result(name: str, result: Mapping[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return path


def say(message: str) -> None:
    """Progress on stderr, so stdout holds only the tables."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
