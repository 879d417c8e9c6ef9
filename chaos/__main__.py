"""`python -m chaos [scenario ...]`: run scenarios (all by default), print each outcome, write
the JSON report and, for a whole full-profile run, the Guarantees table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from chaos import table
from chaos.scenarios import PROFILES, SCENARIOS, Outcome, run_scenario

ROOT = Path(__file__).resolve().parent.parent


def _verdict(outcome: Outcome) -> str:
    if not outcome.passed:
        return "FAILED"
    return "exact" if outcome.verdict.exact else "within its documented degradation"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("scenarios", nargs="*", metavar="scenario",
                        help=f"of: {', '.join(SCENARIOS)} (default: all)")  # fmt: skip
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--soak-minutes", type=float, default=None,
                        help="the soak's length (default: 30 in the full profile, 1 in the short one)")  # fmt: skip
    parser.add_argument("--folder", type=Path, default=ROOT / ".stack" / "chaos")
    parser.add_argument("--report", type=Path, default=ROOT / "chaos" / "results" / "latest.json")
    parser.add_argument("--table", action="store_true",
                        help="write docs/guarantees-table.md (every scenario, full profile: `make chaos`)")  # fmt: skip
    args = parser.parse_args(argv)
    names = args.scenarios or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; the scenarios: {', '.join(SCENARIOS)}")
    if args.table and (names != list(SCENARIOS) or args.profile != "full"):
        parser.error("--table is written by a run of every scenario in the full profile")
    profile = PROFILES[args.profile]
    if args.soak_minutes is not None:
        if args.soak_minutes <= 0:
            parser.error("--soak-minutes must be above 0")
        profile = replace(profile, soak_s=args.soak_minutes * 60)
    outcomes: list[Outcome] = []
    for name in names:
        print(f"== {name}: {SCENARIOS[name][0]}", flush=True)
        began = time.monotonic()
        outcome = run_scenario(name, profile, args.seed, args.folder)
        outcomes.append(outcome)
        print(json.dumps(outcome.row(), indent=1), flush=True)
        print(f"== {name}: {_verdict(outcome)} in {time.monotonic() - began:.0f}s")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps([o.row() for o in outcomes], indent=1) + "\n", encoding="utf-8")
    if args.table:
        written = table.write(
            [o.row() for o in outcomes], {n: d for n, (d, _) in SCENARIOS.items()}, args.profile
        )
        print(f"wrote {written.relative_to(ROOT)}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
