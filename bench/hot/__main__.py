"""The hot benchmark's helper processes, each printing one JSON object on stdout:
`python -m bench.hot memory N [--tracemalloc]` (bench/hot/footprint.py) and
`python -m bench.hot profile --bootstrap B --redis URL --boards FILE --prefix P --topic T`
(bench/hot/profile.py). The benchmark itself runs with `python -m bench hot`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from bench.hot.footprint import build
from bench.hot.profile import profile


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    mem = sub.add_parser("memory", help="build a hot window of N members; print its memory as JSON")
    mem.add_argument("members", type=int)
    mem.add_argument("--tracemalloc", action="store_true")
    prof = sub.add_parser("profile", help="replay hot boards under cProfile; print the profile as JSON")
    for name in ("bootstrap", "redis", "boards", "prefix", "topic"):
        prof.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    result = build(args.members, args.tracemalloc) if args.command == "memory" else profile(args)
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
