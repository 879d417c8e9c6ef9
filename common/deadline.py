"""The shutdown deadline: one object, started when SIGTERM arrives, consulted by every blocking
call (consume, Redis, produce, flush, transaction commit, close), so a process exits within
RANKSTREAM_SHUTDOWN_DEADLINE_S however stuck Kafka or Redis are."""

from __future__ import annotations

import math
import threading
import time


class Deadline:
    """Unset until `start()`: then `timeout(cap)` is at most what is left of the budget."""

    def __init__(self) -> None:
        self._end: float | None = None
        self.started = threading.Event()  # also a stop signal the loops can wait on

    def start(self, seconds: float) -> None:
        """Start the budget; a second signal does not extend it."""
        if self._end is None:
            self._end = time.monotonic() + seconds
            self.started.set()

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
