"""The report: run metadata, goals met, the printed table and bench/results/<name>.json."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import REPO, Result

RESULTS_DIR = REPO / "bench" / "results"


@dataclass(frozen=True)
class Row:
    """One line of the printed table: a dotted path into the result, and the goal it answers
    to (a key of result["goals"]; None = informative only)."""

    metric: str
    goal: str | None = None
    at_most: bool = False  # the goal is a ceiling (a latency, a size): met when value <= goal


# --- run metadata -----------------------------------------------------------------------------


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


def header() -> Result:
    """The metadata every report carries, taken when the run starts."""
    commit, dirty = git_commit()
    return {"machine": machine(), "git_commit": commit, "git_dirty": dirty, "timestamp": timestamp()}


def met(
    values: Mapping[str, float], goals: Mapping[str, float], at_most: Sequence[str] = ()
) -> dict[str, bool]:
    """Per goal with a value, whether it is met: value >= goal (value <= goal for `at_most`)."""
    return {
        name: (values[name] <= goal if name in at_most else values[name] >= goal)
        for name, goal in goals.items()
        if values.get(name) is not None and not math.isnan(values[name])
    }


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
        shown_met = "" if ok is None else ("yes" if ok else "NO")
        shown = "" if goal is None else ("<= " if row.at_most else "") + _fmt(goal)
        lines.append((row.metric, _fmt(value), shown, shown_met))
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
