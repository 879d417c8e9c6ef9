"""A job beside the worker loop that runs in passes (rolling preparation, period results): a
pass every `interval_s`, at once again while a pass says more is waiting; a failed pass (Redis or
Kafka away) is logged, counted and retried at the next one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

_log = logging.getLogger(__name__)


class PassThread:
    def __init__(
        self,
        name: str,
        step: Callable[[], bool],  # one pass; True: more is waiting, run the next at once
        failed: Callable[[], None],  # counts a failed pass
        interval_s: float,
    ) -> None:
        self._name = name
        self._step = step
        self._failed = failed
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def name(self) -> str:
        return self._name

    def request_stop(self) -> None:
        """No pass after the one under way."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop after the pass under way; False if it is still running after `timeout`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                while self._step() and not self._stop.is_set():
                    pass
            except Exception as exc:  # noqa: BLE001 - Redis or Kafka away: the next pass retries
                _log.warning("%s pass failed, retrying", self._name, extra={"error": repr(exc)})
                self._failed()
            self._stop.wait(self._interval)
