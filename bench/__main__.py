"""`python -m bench [NAME ...] [--events N]`: run benchmarks, print a table each, write
bench/results/<name>.json. Without names, every benchmark module that exists runs."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any

from bench.common import ENV_PREFIX, BenchError, say
from bench.harness.report import Row, format_table, scalar_rows, write_result
from common.errors import RankstreamError

# In run order; a name whose module (bench/<name>.py or bench/<name>/) does not exist yet is
# skipped by default.
KNOWN = ("worker", "rolling", "results", "seal", "leagues", "api", "hot", "sse", "failover", "scale")


def available() -> list[str]:
    return [name for name in KNOWN if importlib.util.find_spec(f"bench.{name}") is not None]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(available())}")
    parser.add_argument(
        "--events", type=int, help=f"events per measured run (same as {ENV_PREFIX}EVENTS; default 300000)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in available()]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r} (available: {', '.join(available())})")
    if args.events is not None and args.events <= 0:
        parser.error("--events must be positive")
    return args


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # a SIGTERM must unwind like Ctrl-C so every benchmark's finally stops its servers
    raise KeyboardInterrupt


def run_one(name: str) -> None:
    module: ModuleType = importlib.import_module(f"bench.{name}")
    run: Callable[[], dict[str, Any]] = module.run
    started = time.monotonic()
    result = run()
    rows: Sequence[Row] = getattr(module, "ROWS", None) or scalar_rows(result)
    print(format_table(name, result, rows), flush=True)
    path = write_result(name, result)
    print(f"({time.monotonic() - started:.0f} s; report: {path})\n", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.events is not None:
        # benchmarks read their knobs from the environment, so run() keeps one shape for all
        os.environ[ENV_PREFIX + "EVENTS"] = str(args.events)
    signal.signal(signal.SIGTERM, _interrupt)
    for name in args.names or available():
        try:
            run_one(name)
        except KeyboardInterrupt:
            say(f"{name}: interrupted")
            return 130
        except (BenchError, RankstreamError) as exc:
            say(f"{name}: FAILED: {exc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
