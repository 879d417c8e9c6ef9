"""Maximum throughput with wrk: one run, and interleaved rounds of several targets (best of each)."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchError, Result, env_int, say
from bench.harness.cpu import cpu_us_per_unit, run_tool

WRK_CONNECTIONS = 32
WRK_WARMUP_S = 2
DEFAULT_ROUNDS = 2
DEFAULT_WRK_S = 8


def wrk_knobs() -> tuple[int, int]:
    """(rounds, seconds per measured run): RANKSTREAM_BENCH_ROUNDS (2), RANKSTREAM_BENCH_WRK_S (8)."""
    return env_int("ROUNDS", DEFAULT_ROUNDS), env_int("WRK_S", DEFAULT_WRK_S)


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise BenchError("wrk not found: apt-get install -y wrk")
    return found


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if match is None:
        raise BenchError(f"wrk: unexpected latency {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def parse_wrk(text: str) -> Result:
    """Requests/sec, the latency percentiles (ms), requests, errors from `wrk --latency` output."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.MULTILINE)
    total = re.search(r"^\s*(\d+) requests in ([\d.]+\w+)", text, re.MULTILINE)
    if rps is None or total is None:
        raise BenchError(f"unexpected wrk output: {text.strip()[-300:]!r}")
    percentiles = {
        f"p{m[1]}_ms": round(_ms(m[2]), 3) for m in re.finditer(r"^\s+(\d+)%\s+(\S+)$", text, re.MULTILINE)
    }
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "rps": float(rps[1]),
        "requests": int(total[1]),
        **percentiles,
        "non_2xx": int(non2xx[1]) if non2xx else 0,
        "socket_errors": sum(int(x) for x in sockets.groups()) if sockets else 0,
    }


def parse_info(text: str) -> dict[str, str | int]:
    """What a wrk Lua script printed as `wrk-info KEY VALUE` lines (an integer VALUE as one)."""
    return {
        m[1]: int(m[2]) if m[2].isdigit() else m[2]
        for m in re.finditer(r"^wrk-info (\S+) (.*)$", text, re.MULTILINE)
    }


@dataclass(frozen=True)
class Script:
    """A wrk Lua script (-s) and the arguments its init(args) gets (after `--`)."""

    path: Path
    args: tuple[str, ...] = ()


def wrk(
    url: str,
    duration_s: int,
    pids: Mapping[str, int],
    connections: int = WRK_CONNECTIONS,
    script: Script | None = None,
) -> Result:
    """One `wrk -t1` run; CPU% of `pids` and of wrk itself (100 = one core) while it ran. With a
    `script`, what it printed as `wrk-info` lines is under "info"."""
    argv = [wrk_binary(), "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency"]
    if script is not None:
        argv += ["-s", str(script.path), url, "--", *script.args]
    else:
        argv.append(url)
    run = run_tool("wrk", argv, pids, timeout=duration_s + 60)
    if run.returncode != 0:
        raise BenchError(f"wrk exited with {run.returncode}: {run.stderr.strip()[-300:]}")
    result = parse_wrk(run.stdout)
    if result["non_2xx"] or result["socket_errors"]:
        raise BenchError(
            f"wrk {url}: {result['non_2xx']} non-2xx answers, {result['socket_errors']} socket errors"
        )
    result["cpu_pct"] = run.cpu_pct
    if script is not None:
        result["info"] = parse_info(run.stdout)
    return result


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    pids: dict[str, int]
    script: Script | None = None


def wrk_rounds(targets: Sequence[Target], rounds: int, duration_s: int) -> dict[str, Result]:
    """A warm-up of each target, then `rounds` interleaved measured runs; the best run of each
    (highest rps) is its result, every run is kept under "runs"."""
    for target in targets:
        say(f"wrk warm-up: {target.name}")
        wrk(target.url, WRK_WARMUP_S, target.pids, script=target.script)
    runs: dict[str, list[Result]] = {t.name: [] for t in targets}
    for round_no in range(rounds):
        for target in targets:
            result = wrk(target.url, duration_s, target.pids, script=target.script)
            rps, p99 = result["rps"], result.get("p99_ms")
            say(f"round {round_no + 1}: {target.name}: {rps:,.0f} req/s, p99 {p99} ms")
            runs[target.name].append(result)
    out: dict[str, Result] = {}
    for name, results in runs.items():
        best = max(results, key=lambda r: float(r["rps"]))
        out[name] = {**best, "runs_rps": [r["rps"] for r in results]}
    return out


def cpu_us_per_request(result: Result, server: str) -> float:
    """CPU time the server spent per request (from its CPU% during a wrk run)."""
    per_request = cpu_us_per_unit(result["cpu_pct"], result["rps"]) if result["rps"] > 0 else {}
    return per_request.get(server, math.nan)
