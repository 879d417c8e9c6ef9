"""The constant-rate client in Go (bench/go/rate/main.go), built once into .stack/bench/bin/ when
a Go toolchain is on the PATH. Why: the Python client's own scheduling lateness reached tens of
milliseconds at p99 on this 2-core box and counted as server latency; with the Go client the bare
app's p99 at the same rate is the box's floor, not the client's. RANKSTREAM_BENCH_RATE_CLIENT=python
keeps the Python client (bench/harness/rate.py) for comparison."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench.common import ENV_PREFIX, REPO, say

SOURCE = REPO / "bench" / "go" / "rate"
BINARY = REPO / ".stack" / "bench" / "bin" / "rate"


def go_rate_client() -> Path | None:
    """The built client, rebuilt when its source is newer; None without Go (or when the Python
    client is asked for)."""
    if os.environ.get(ENV_PREFIX + "RATE_CLIENT", "go") == "python":
        return None
    go = shutil.which("go")
    if go is None:
        return None
    newest = max(p.stat().st_mtime for p in SOURCE.iterdir())
    if BINARY.exists() and BINARY.stat().st_mtime >= newest:
        return BINARY
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    say("building the Go rate client (bench/go/rate)")
    built = subprocess.run(
        [go, "build", "-o", str(BINARY), "."],
        cwd=SOURCE,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    if built.returncode != 0:
        say(f"Go rate client not built ({built.stderr.strip()[-200:]}): the Python client measures")
        return None
    return BINARY
