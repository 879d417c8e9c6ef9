"""The Guarantees table (docs/guarantees-table.md), written by a whole `make chaos` run and never
by hand: each scenario's events, faults injected, what was lost, doubled or ranked wrong, and how
long recovery took, with the date, the commit and the hash of the scenario list and the harness.
tests/unit/test_chaos_table.py fails when that hash is not the harness' own, and warns when the
service's code changed since the commit the table was measured on."""

from __future__ import annotations

import hashlib
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "guarantees-table.md"
# the harness: what a scenario does and how it is judged
HARNESS = [*sorted((ROOT / "chaos").glob("*.py")), ROOT / "tests" / "redis_layout.py"]
SERVICE = ("worker", "api", "common")
_HASH = re.compile(r"harness hash `([0-9a-f]{16})`")
_COMMIT = re.compile(r"commit `([0-9a-f]{7,40})`")


def harness_hash() -> str:
    digest = hashlib.sha256()
    for path in HARNESS:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()[:16]


def table_stamp(text: str) -> tuple[str | None, str | None]:
    """(harness hash, commit) the table was written with."""
    found, commit = _HASH.search(text), _COMMIT.search(text)
    return (found.group(1) if found else None, commit.group(1) if commit else None)


def head_commit() -> tuple[str, bool]:
    """HEAD, and whether the harness or the service differs from it (a run on uncommitted code)."""
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "chaos", *SERVICE], cwd=ROOT,
                           capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return out.stdout.strip() or "unknown", bool(dirty)


def service_changed_since(commit: str) -> list[str]:
    """Files of worker/, api/ or common/ that differ between `commit` and the work tree."""
    out = subprocess.run(["git", "diff", "--name-only", commit, "--", *SERVICE], cwd=ROOT,
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        raise LookupError(out.stderr.strip() or f"git diff {commit} failed")
    return out.stdout.split()


def _recover(row: dict[str, Any]) -> str:
    if not row["faults"]:
        return "-"
    return f"{row['recover_max_s']} s (median {row['recover_median_s']} s)"


def _exact(row: dict[str, Any]) -> str:
    if not row["passed"]:
        return "**no**"
    return "yes" if row["exact"] else f"no: {row['tolerated']} (documented)"


def render(rows: list[dict[str, Any]], descriptions: dict[str, str], profile: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit, dirty = head_commit()
    changed = " (with uncommitted changes)" if dirty else ""
    lines = [
        "<!-- written by `make chaos` (chaos/table.py): do not edit by hand -->",
        "# Guarantees, measured",
        "",
        f"Written by the chaos suite on {stamp}, profile `{profile}`, at commit `{commit}`{changed}, harness hash "
        f"`{harness_hash()}`. How the suite works and how to rerun one scenario: [chaos.md](chaos.md).",
        "",
        "Each scenario runs real Kafka, Redis, `rankstream worker` and `rankstream api` processes, produces the "
        "seeded stream while it injects its faults, and ends in an exact comparison of Redis, every API "
        "node's answers, the dead-letter topic and the period-result topic with the independent model.",
        "",
        "| scenario | events | faults injected | lost | doubled | wrong ranks | time to recover | answers compared | exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        faults = f"{row['faults']} x {', '.join(row['fault_kinds'])}" if row["faults"] else "none"
        lines.append(
            f"| {row['scenario']} | {row['events']:,} | {faults} | {row['lost']} | {row['doubled']} | {row['wrong']} "
            f"| {_recover(row)} | {row['answers_compared']:,} | {_exact(row)} |"
        )
    lines += ["", "What each scenario is:", ""]
    lines += [f"- **{row['scenario']}**: {descriptions[row['scenario']]}." for row in rows]
    lines += ["", "Per scenario: events applied (the rest are duplicates the id window dropped), dead letters "
              "and period results compared, and what the run noted.", ""]  # fmt: skip
    for row in rows:
        notes = "; ".join(row["notes"]) if row["notes"] else ""
        lines.append(f"- {row['scenario']}: {row['applied']:,} applied, {row['dead_letters']:,} dead letters, "
                     f"{row['results']} period results, {row['seconds']} s{'; ' + notes if notes else ''}.")  # fmt: skip
        lines += [f"  - difference: {p}" for p in row["problems"]]
    return "\n".join(lines) + "\n"


def write(rows: list[dict[str, Any]], descriptions: dict[str, str], profile: str) -> Path:
    TABLE.write_text(render(rows, descriptions, profile), encoding="utf-8")
    return TABLE
