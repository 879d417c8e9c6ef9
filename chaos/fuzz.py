"""HTTP fuzzing from the OpenAPI spec: schemathesis (`st run`) against a running API node, checking
that no answer is a 5xx and that every answer conforms to the spec (status, content type, body
schema). It runs twice per setting: on the spec as published (arbitrary boards, members and
windows: the paths that refuse bad input), and on the spec steered onto the run's own boards,
members, windows, divisions and tiers (the paths that rank). The node's own metrics count the
answers by status, so a run shows the 401s and 429s a locked node gave."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from chaos.config import BOARDS, TIERS

ROOT = Path(__file__).resolve().parent.parent
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
# not fuzzed: a live stream never ends (tests/integration/test_live.py), and the admin port's own
SKIPPED = ("/v1/boards/{board}/events", "/metrics", "/openapi.json")
STEERED: dict[str, list[str]] = {
    "board": [BOARDS["gift"][0], BOARDS["gift"][1], BOARDS["score"][0], BOARDS["plain"][0], BOARDS["split"][0],
              BOARDS["arena"][0], BOARDS["arena"][1], BOARDS["cup"][0], BOARDS["misc"][0], "gift:none"],
    "member": ["m0", "m1", "m2", "m7", "ghost"],
    "window": ["total", "hour", "day", "week", "month", "30min", "1min", "season", "last_2h"],
    "division": [f"{TIERS[0]}.1", f"{TIERS[0]}.2", f"{TIERS[-1]}.1", TIERS[0]],
    "tier": [*TIERS, "tin"],
}  # fmt: skip
METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
_METRIC = re.compile(r'^rankstream_api_requests_total\{route="([^"]*)",status="(\d+)"\} ([0-9.e+]+)$', re.M)


@dataclass
class FuzzReport:
    """One `st run`: its cases, failures and the answers' statuses (from the node's metrics)."""

    label: str
    cases: int = 0
    failures: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    detail: str = ""

    def line(self) -> str:
        counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(self.statuses.items()))
        return f"{self.label}: {self.cases:,} cases, {self.failures} failing ({counts})"


def steered(spec: dict[str, Any], values: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The spec with its board, member, window, division and tier parameters drawn from `values`
    (the chaos run's own by default), so generated requests reach the ranking code, not 404s."""
    values = values or STEERED
    out = copy.deepcopy(spec)
    params = out["components"]["parameters"]
    for name in ("board", "member", "window"):
        params[name]["schema"] = {"type": "string", "enum": values[name]}
    for route in out["paths"].values():
        for operation in route.values():
            for param in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if param.get("name") in ("division", "tier") and param.get("in") == "path":
                    param["schema"] = {"type": "string", "enum": values[param["name"]]}
    return out


def statuses(admin_base: str) -> Counter[str]:
    """Public answers so far by status, from the node's admin /metrics."""
    with urllib.request.urlopen(f"{admin_base}/metrics", timeout=30) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    out: Counter[str] = Counter()
    for _route, status, count in _METRIC.findall(text):
        out[status] += int(float(count))
    return out


def fetch_spec(admin_base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{admin_base}/openapi.json", timeout=30) as resp:  # noqa: S310 - loopback
        spec: dict[str, Any] = orjson.loads(resp.read())
    return spec


def st_run(spec: dict[str, Any], base: str, admin_base: str, *, label: str, cases: int, seed: int,
           folder: Path, token: str | None = None, coverage: bool = False) -> FuzzReport:  # fmt: skip
    """At least `cases` generated requests against the node at `base` (the fuzzing phase's
    examples are set from the operations' count; `coverage` adds schemathesis' coverage phase,
    which tries every boundary and bad type of each parameter on top)."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    spec_file, report_file = folder / f"{slug}.spec.json", folder / f"{slug}.report.json"
    spec_file.write_bytes(orjson.dumps(spec))
    operations = sum(
        1 for path, route in spec["paths"].items() if path not in SKIPPED for m in route if m in METHODS
    )
    per_operation = math.ceil(1.5 * cases / max(1, operations))
    argv = [str(Path(sys.executable).parent / "st"), "run", str(spec_file), "--url", base, "--checks", CHECKS,
            "-n", str(per_operation), "--seed", str(seed), "--no-color", "--report", "json",
            "--report-json-path", str(report_file),
            "--phases", "coverage,fuzzing" if coverage else "fuzzing"]  # fmt: skip
    for path in SKIPPED:
        argv += ["--exclude-path", path]
    if token is not None:
        argv += ["-H", f"Authorization: Bearer {token}"]
    before = statuses(admin_base)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False, cwd=ROOT)
    report = FuzzReport(label, statuses=statuses(admin_base) - before)
    if not report_file.exists():
        report.failures, report.detail = 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        return report
    found = orjson.loads(report_file.read_bytes())
    report.cases = int(found["test_cases"]["generated"])
    report.failures = int(found["test_cases"]["with_failures"]) + int(found["test_cases"]["errored"])
    if report.failures or proc.returncode != 0:
        report.failures = max(report.failures, 1)
        report.detail = proc.stdout[-3000:]
    return report


def fuzz(base: str, admin_base: str, *, label: str, cases: int, seed: int, folder: Path,
         token: str | None = None, coverage: bool = False,
         values: dict[str, list[str]] | None = None) -> list[FuzzReport]:  # fmt: skip
    """`cases` requests, half on the spec as published and half steered onto `values`."""
    spec = fetch_spec(admin_base)
    half = max(1, cases // 2)
    return [
        st_run(spec, base, admin_base, label=f"{label}, published spec", cases=half, seed=seed, folder=folder,
               token=token, coverage=coverage),
        st_run(steered(spec, values), base, admin_base, label=f"{label}, steered onto the run's boards", cases=half,
               seed=seed + 1, folder=folder, token=token, coverage=coverage),
    ]  # fmt: skip


def locked_env(token: str) -> dict[str, str]:
    """A node's settings with reads behind `token` (and a spare) and a rate limit schemathesis
    goes past however slow the machine (it sends as fast as the node answers)."""
    return {"RANKSTREAM_API_READ_TOKENS": f"{token},spare-{token}", "RANKSTREAM_API_RATE_LIMIT_PER_S": "2",
            "RANKSTREAM_API_RATE_LIMIT_BURST": "5"}  # fmt: skip


def judge(
    open_: list[FuzzReport], with_token: list[FuzzReport], without: list[FuzzReport], cases: int
) -> list[str]:
    """What the three runs must show: no failing case, no 5xx, `cases` or more in each setting
    (open; locked), and the locked node's 200s to its token, 429s past its rate and 401s to none."""
    problems = [f"{r.label}: {r.detail[-1500:]}" for r in (*open_, *with_token, *without) if r.failures]
    seen = {label: sum((r.statuses for r in group), Counter[str]()) for label, group in
            (("open", open_), ("a token", with_token), ("no token", without))}  # fmt: skip
    fuzzed = {"open": sum(r.cases for r in open_), "locked": sum(r.cases for r in (*with_token, *without))}
    server_errors = sum(
        n for counts in seen.values() for status, n in counts.items() if status.startswith("5")
    )
    for problem, failed in (
        (f"{server_errors} answers were 5xx", server_errors > 0),
        (f"fewer than {cases} cases in a setting: {fuzzed}", min(fuzzed.values()) < cases),
        ("no 429 with a token past the rate limit", seen["a token"]["429"] == 0),
        ("no 200 with a token", seen["a token"]["200"] == 0),
        ("no 401 without a token", seen["no token"]["401"] == 0),
    ):
        if failed:
            problems.append(problem)
    return problems
