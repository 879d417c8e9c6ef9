"""The service's clock: ms since the epoch. The worker (which periods are closed, which boards have
ended) and the API (`at=` defaults, `period_expired`, hot periods dropped) ask it rather than the
system clock, so tests run days of periods without sleeping by passing their own."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def system_ms() -> int:
    return time.time_ns() // 1_000_000
