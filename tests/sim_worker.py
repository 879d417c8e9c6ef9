"""A worker process on a simulated service clock, for tests that kill workers (SIGKILL) while a
test moves the clock (tests/integration/test_period_results.py): `python -m tests.sim_worker`,
configured like `rankstream worker` by RANKSTREAM_* variables (tests/helpers.py worker_env), plus

    RANKSTREAM_TEST_CLOCK_FILE     the clock: a file the test writes (common/clock.py ClockFile),
                                   read at every call, as `rankstream worker` and `api` do
    RANKSTREAM_TEST_PASS_S         how often the rolling preparer and the results emitter pass
                                   (default: the product's, 1 s)
    RANKSTREAM_TEST_DWELL_FILE     while this file exists the results emitter lingers (DWELL_S)
                                   where a strike must land: once its markers say `sending`, before
                                   it produces, and after the first marker of a committed
                                   transaction says `sent`

It builds the real loop (worker.main.build_loop) and runs it as worker.main.run_worker does: SIGTERM
asks it to stop, it finishes its batch and commits, then closes (and exits at the shutdown deadline
whatever still runs); SIGUSR1 prints every thread's stack. Its metrics are served on
RANKSTREAM_WORKER_HTTP_PORT (/metrics, /livez: how long the loop stalls, /readyz: its
partitions, and those blocked)."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from common.clock import TEST_CLOCK_ENV, service_clock
from common.health import serve_probes
from common.logs import setup_logging
from common.settings import load_settings
from worker.main import build_loop, stop_on_signals
from worker.metrics import WorkerMetrics
from worker.outputs import ProducerFenced
from worker.results import ResultEmitter, ResultsThread
from worker.rolling import PreparerThread

PASS_ENV = "RANKSTREAM_TEST_PASS_S"  # noqa: S105 - a pass, not a password
DWELL_ENV = "RANKSTREAM_TEST_DWELL_FILE"
DWELL_S = 0.3


def dwell(flag: Path) -> None:
    """While `flag` exists, make the emitter linger at the moments a test strikes it (the steps
    are the product's)."""
    transaction, swap = ResultEmitter._transaction, ResultEmitter._swap

    def lingering_transaction(self: ResultEmitter, batch: list[Any]) -> None:
        if flag.exists():
            time.sleep(DWELL_S)  # markers `sending`, nothing produced yet
        transaction(self, batch)

    def lingering_swap(self: ResultEmitter, due: Any, mark: Any, new: str) -> Any:
        after = swap(self, due, mark, new)
        if new.startswith("sent:") and flag.exists():
            time.sleep(DWELL_S)  # committed: this marker `sent`, the batch's others still `sending`
        return after

    ResultEmitter._transaction = lingering_transaction  # type: ignore[method-assign]
    ResultEmitter._swap = lingering_swap  # type: ignore[method-assign]


def main() -> int:
    settings = load_settings()
    setup_logging(settings.log_level)
    assert settings.test_clock_file is not None, f"{TEST_CLOCK_ENV} names the clock"
    clock = service_clock(settings)
    metrics = WorkerMetrics()
    loop, client = build_loop(settings, metrics, clock)
    if DWELL_ENV in os.environ:
        dwell(Path(os.environ[DWELL_ENV]))
    interval = os.environ.get(PASS_ENV)
    if interval is not None:  # the threads start with loop.run(): replaced before they do
        if loop.preparer is not None:
            loop.preparer = PreparerThread(loop.preparer.preparer, interval_s=float(interval))
        if loop.results is not None:
            loop.results = ResultsThread(loop.results.emitter, interval_s=float(interval))

    def live() -> tuple[bool, dict[str, object]]:
        return True, {"loop_stalled_s": round(time.monotonic() - loop.last_loop, 1)}

    def ready() -> tuple[bool, dict[str, object]]:
        blocked = (
            {} if loop.guard is None else {str(p): b.reason for p, b in dict(loop.guard.blocked).items()}
        )
        return not blocked, {"partitions": loop.assigned, "blocked": blocked}

    server = serve_probes("127.0.0.1", settings.worker_http_port, live, ready, metrics.registry)

    stop_on_signals(loop, settings.shutdown_deadline_s)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a worker that won't stop: its stacks
    code = 0
    try:
        loop.run()
    except ProducerFenced:
        logging.getLogger(__name__).exception("stopping: fenced")
        code = 1
    finally:
        loop.request_stop()  # as run_worker: closing has the deadline, however the loop ended
        loop.close()
        if not loop.abandoned:
            server.shutdown()
    if loop.abandoned:  # a thread still blocked on Redis or Kafka: as run_worker, don't wait for it
        logging.shutdown()
        os._exit(code)
    client.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
