"""What every benchmark module speaks: the result type, the error, the knobs, the progress line.
The machinery that runs a benchmark (servers, processes, load, CPU, the report) is bench/harness/."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Benchmark switches are RANKSTREAM_BENCH_*; child rankstream processes must not see them
# (load_settings refuses unknown RANKSTREAM_* variables as typos).
ENV_PREFIX = "RANKSTREAM_BENCH_"

Result = dict[str, Any]


class BenchError(Exception):
    """A benchmark could not produce a trustworthy number (a stall, a lost event, a bad tool)."""


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


def say(message: str) -> None:
    """Progress on stderr, so stdout holds only the tables."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def zipf_cum_weights(n: int, s: float) -> list[float]:
    """Cumulative Zipf(s) weights of ranks 1..n (the k-th most popular weighs 1/k^s), for
    random.choices(cum_weights=...): a live room, where a few members get most of the events."""
    return list(itertools.accumulate(1 / (rank + 1) ** s for rank in range(n)))
