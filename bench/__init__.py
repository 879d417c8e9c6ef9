"""rankstream's benchmarks: `python -m bench [worker ...]` (what `make bench` runs).

Each benchmark is a module `bench/<name>.py` or a package `bench/<name>/` with `run() -> dict`
(the JSON report, written to `bench/results/<name>.json`) and optionally `ROWS`, the metrics its
printed table shows. They run on real servers started for the run, never on mocks, through one
harness (`bench/harness/`: the private stack, child processes, load generators, CPU meter,
report); `bench/common.py` holds the few names every module speaks (Result, BenchError, knobs).
"""
