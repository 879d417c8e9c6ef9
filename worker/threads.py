"""One daemon thread that runs jobs in order, handing each result to a Future. Unlike
ThreadPoolExecutor's threads it never holds the process open at exit, so a call stuck past the
shutdown deadline (Redis paused, a librdkafka call that ignores its timeout) is abandoned."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future


class DaemonThread:
    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[None], Callable[[], None]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, job: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._queue.put((future, job))
        return future

    def shutdown(self) -> None:
        """The thread ends after the jobs already queued (without waiting for them here)."""
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(None)
