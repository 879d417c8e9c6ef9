"""The shutdown deadline: one object, started when SIGTERM arrives, consulted by every blocking
call (consume, Redis, produce, flush, transaction commit, close), so a process exits within
RANKSTREAM_SHUTDOWN_DEADLINE_S however stuck Kafka or Redis are."""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from common.logs import flush_logs

_log = logging.getLogger(__name__)
BACKSTOP_S = 1.0  # after exit_at's own time: faulthandler's watchdog ends a process it could not


class Deadline:
    """Unset until `start()`: then `timeout(cap)` is at most what is left of the budget."""

    def __init__(self) -> None:
        self._end: float | None = None
        self.started = threading.Event()  # also a stop signal the loops can wait on
        self._on_start: list[Callable[[], None]] = []

    def start(self, seconds: float) -> None:
        """Start the budget; a second signal does not extend it."""
        if self._end is None:
            self._end = time.monotonic() + seconds
            self.started.set()
            for action in self._on_start:
                action()

    def when_started(self, action: Callable[[], None]) -> None:
        """Run `action` in the thread that starts the budget, as it starts (now if it has)."""
        self._on_start.append(action)
        if self._end is not None:
            action()

    def remaining(self) -> float:
        return math.inf if self._end is None else max(0.0, self._end - time.monotonic())

    def timeout(self, cap: float, keep: float = 0.0) -> float:
        """What a blocking call may wait: its usual `cap`, or less once the deadline runs: what is
        left less `keep` (what the steps after this one need), or half of what is left if that is
        more (a small deadline shares what it has rather than starving the last steps)."""
        left = self.remaining()
        return max(0.0, min(cap, max(left - keep, left / 2)))

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


def exit_at(deadline: Deadline, grace_s: float = 0.0, status: Callable[[], int] = lambda: 0) -> None:
    """The last resort of a process that stops, in a daemon thread of its own: `grace_s` after
    the (started) deadline passes, the process exits with `status()` (0: a stop asked for)
    whatever is still running, after one log line with every thread's stack (the orderly
    shutdown ends before; this is for a call blocked past its own timeout, e.g. a librdkafka
    destructor, or a bug).

    A Python thread can't end a process that is already finalizing (the interpreter stops its
    daemon threads at their next step: a destructor blocked in the final collection, say), so the
    deadline's start also arms faulthandler's own C watchdog BACKSTOP_S later: it writes every
    thread's stack to stderr and exits with status 1. Where that write blocks too (a full stderr
    pipe), the kernel's SIGALRM, BACKSTOP_S after it (no handler: its default action), ends the
    process without writing anything."""

    def run() -> None:
        deadline.started.wait()
        time.sleep(deadline.remaining() + grace_s)
        _log.error("shutdown deadline reached: exiting now", extra={"stacks": thread_stacks()})
        flush_logs()
        os._exit(status())

    def backstop() -> None:
        watchdog = deadline.remaining() + grace_s + BACKSTOP_S
        faulthandler.dump_traceback_later(watchdog, exit=True)
        signal.setitimer(signal.ITIMER_REAL, watchdog + BACKSTOP_S)

    threading.Thread(target=run, name="shutdown-deadline", daemon=True).start()
    deadline.when_started(backstop)


def thread_stacks() -> dict[str, str]:
    """Each thread's name and where it is (a call into C shows as the line that made it)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return {
        f"{names.get(ident, 'unknown')} ({ident})": "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    }
