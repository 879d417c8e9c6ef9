"""The chaos suite: one seeded producer, one independent model, one checker, and scenarios that
inject faults into real processes (workers, API nodes, Kafka, Redis) while the stream flows.

`make chaos` runs every scenario and writes docs/guarantees-table.md; `python -m chaos --help`
runs one. docs/chaos.md says what each scenario does and what it proves."""
