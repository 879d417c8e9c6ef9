"""The service's clock: ms since the epoch. The worker (which periods are closed, which boards have
ended) and the API (`at=` defaults, `period_expired`, hot periods dropped) ask it rather than the
system clock, so tests run days of periods without sleeping by passing their own.

`rankstream worker`, `rankstream api` and `rankstream periods` run on `service_clock()`: the
system clock, or, for tests only, the shared clock file RANKSTREAM_TEST_CLOCK_FILE names
(`ClockFile`): a test writes the time it wants and every process it started reads it at every
call (the worker's preparer and results emitter included), so many processes share one simulated
clock for everything the service clock decides (periods, closed windows, activity ends; a
previous release's adoption window stays on real time). Never set it in a deployment: the
process logs a warning at start when it is in effect."""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError

if TYPE_CHECKING:
    from common.settings import Settings

Clock = Callable[[], int]
TEST_CLOCK_ENV = "RANKSTREAM_TEST_CLOCK_FILE"  # Settings.test_clock_file
# the time (ms) and its complement: a read that races a write sees them disagree and reads again
_LAYOUT = struct.Struct("<qq")
_log = logging.getLogger(__name__)


def system_ms() -> int:
    return time.time_ns() // 1_000_000


class ClockFile:
    """A clock shared by a test (writable) and the processes it starts (read-only)."""

    def __init__(self, path: Path, *, writable: bool = False) -> None:
        self.path = path
        with path.open("r+b" if writable else "rb") as file:
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._map = mmap.mmap(file.fileno(), _LAYOUT.size, access=access)

    @classmethod
    def create(cls, path: Path, now: int) -> ClockFile:
        path.write_bytes(_LAYOUT.pack(now, ~now))
        return cls(path, writable=True)

    def __call__(self) -> int:
        while True:
            value, check = _LAYOUT.unpack(self._map[: _LAYOUT.size])
            if check == ~value:
                return int(value)
            os.sched_yield()  # torn: the writer is mid-write

    def set(self, now: int) -> None:
        self._map[: _LAYOUT.size] = _LAYOUT.pack(now, ~now)

    def close(self) -> None:
        self._map.close()


def service_clock(settings: Settings) -> Clock:
    """The system clock, or the test clock file the settings name."""
    if settings.test_clock_file is None:
        return system_ms
    try:
        clock = ClockFile(settings.test_clock_file)
    except (OSError, ValueError) as exc:  # missing, unreadable, or shorter than a clock
        raise ConfigError(f"{TEST_CLOCK_ENV}: not a clock file: {exc}") from None
    _log.warning("a test clock is in effect", extra={"file": str(clock.path), "now_ms": clock()})
    return clock
