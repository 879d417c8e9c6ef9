"""bench/api's result: the headline numbers (ratios to bare, latency at half rate, visibility)
and the details they come from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bench.api.reads import READS
from bench.api.rows import AT_MOST, GOALS
from bench.common import Result
from bench.harness.report import met
from bench.harness.stats import ratio
from bench.harness.wrk import cpu_us_per_request

# wrk target -> its key prefix and the name of its ratio to bare (None: the baselines)
RATIOS = {
    "bare": None,
    "bare_uvloop": None,
    "bare_redis": "bare_redis_vs_bare",
    "redis_top10": "redis_vs_bare",
    "member": "member_vs_bare",
    "around": "around_vs_bare",
    "lookup500": "lookup500_vs_bare",
    "warm_top10": "warm_top10_vs_bare",
    "not_modified": "not_modified_vs_bare",
}


def _get(result: Result | None, key: str) -> Any:
    return None if result is None else result.get(key)


def throughput(results: Mapping[str, Result | None]) -> tuple[Result, dict[str, float | None]]:
    """rps, p50/p99 at max, the ratio to bare (by rps and by server CPU per request) of every
    wrk target; cached_* (the old name of the warm top-10) equal to warm_top10_*; (those, the
    server CPU per request of each)."""
    bare = results["bare"]
    assert bare is not None
    cpu_us: dict[str, float | None] = {}
    out: Result = {}
    for name, ratio_name in RATIOS.items():
        found = results.get(name)
        server = "bare" if name.startswith("bare") else "api"
        cpu_us[name] = None if found is None else cpu_us_per_request(found, server)
        out[f"{name}_rps"] = _get(found, "rps")
        out[f"{name}_p50_ms"] = _get(found, "p50_ms")
        out[f"{name}_p99_ms"] = _get(found, "p99_ms")
        if ratio_name is not None and found is not None:
            out[ratio_name] = ratio(found["rps"], bare["rps"])
            cpu = cpu_us[name]
            out[f"{ratio_name}_cpu"] = None if cpu is None else ratio(cpu_us["bare"] or math.nan, cpu)
    cpu_us["cached_top10"] = cpu_us["warm_top10"]
    for suffix in ("rps", "p50_ms", "p99_ms"):
        out[f"cached_top10_{suffix}"] = out[f"warm_top10_{suffix}"]
    out["cached_vs_bare"] = out["warm_top10_vs_bare"]
    out["cached_vs_bare_cpu"] = out["warm_top10_vs_bare_cpu"]
    return out, cpu_us


def latency_at_half(at_half: Mapping[str, Result]) -> Result:
    out: Result = {
        "half_rate_target_rps": at_half["redis_top10"]["target_rps"],
        "half_rate_achieved_rps": at_half["redis_top10"]["achieved_rps"],
    }
    for name in ("bare", *(read.name for read in READS)):
        out[f"{name}_p50_ms_at_half"] = at_half[name]["p50_ms"]
        out[f"{name}_p99_ms_at_half"] = at_half[name]["p99_ms"]
    return out


def visibility_keys(vis: Result) -> Result:
    return {
        "warm_visibility_count": vis["writes"],
        "warm_visibility_unresolved": vis["unresolved"],
        "warm_visibility_p50_ms": vis["p50_ms"],
        "warm_visibility_p99_ms": vis["p99_ms"],
        "warm_visibility_max_ms": vis["max_ms"],
        "warm_top10_p50_ms_during_writes": vis["reader"]["p50_ms"],
        "warm_top10_p99_ms_during_writes": vis["reader"]["p99_ms"],
    }


def summarize(
    results: Mapping[str, Result | None], at_half: Mapping[str, Result], vis: Result
) -> tuple[Result, Result]:
    """(the headline numbers with their goals, the details they come from)."""
    rates, cpu_us = throughput(results)
    summary: Result = {**rates, **latency_at_half(at_half), **visibility_keys(vis)}
    measured = {name: r for name, r in results.items() if r is not None}
    cpu_pct = {name: r["cpu_pct"] for name, r in measured.items()}
    cpu_pct["cached_top10"] = cpu_pct["warm_top10"]
    cpu_pct["at_half"] = at_half["redis_top10"]["cpu_pct"]  # the key's old meaning
    cpu_pct.update({f"at_half_{name}": r["cpu_pct"] for name, r in at_half.items()})
    cpu_pct["visibility"] = vis["reader"]["cpu_pct"]
    details: Result = {
        **measured,
        "cached_top10": measured["warm_top10"],
        "at_half": at_half["redis_top10"],  # the key's old meaning
        "at_half_by_read": dict(at_half),
        "visibility": vis,
        "cpu_pct": cpu_pct,
        "server_cpu_us_per_request": cpu_us,
        # the load generator's own cost (wrk_reads.lua formats its requests once, at init)
        "wrk_cpu_us_per_request": {name: cpu_us_per_request(r, "wrk") for name, r in measured.items()},
    }
    return {
        **summary,
        "goals": GOALS,
        "goals_at_most": list(AT_MOST),
        "met": met(summary, GOALS, AT_MOST),
    }, details
