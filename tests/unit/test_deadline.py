"""The shutdown deadline's last resort (common/deadline.py exit_at), in a real process: a main
thread blocked past the deadline does not keep the process alive, and the one log line says where
each thread was."""

from __future__ import annotations

import subprocess
import sys
import time

import orjson

from tests.conftest import ROOT

BLOCKED = """
import threading
from common.deadline import Deadline, exit_at
from common.logs import setup_logging

setup_logging()
deadline = Deadline()
exit_at(deadline, grace_s=0.2)
deadline.start(0.3)
threading.Event().wait(30)  # stuck: e.g. a librdkafka destructor at the interpreter's exit
raise SystemExit(3)
"""


def test_a_process_blocked_past_the_deadline_exits_at_it_with_every_threads_stack():
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=ROOT, capture_output=True, timeout=20, check=False
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr.decode()
    assert 0.5 <= elapsed < 10, elapsed  # 0.3 s of deadline + 0.2 s of grace, then at once
    (line,) = [orjson.loads(raw) for raw in proc.stderr.splitlines()]
    assert (line["level"], line["msg"]) == ("error", "shutdown deadline reached: exiting now")
    main = next(stack for name, stack in line["stacks"].items() if name.startswith("MainThread "))
    assert 'File "<string>", line 10, in <module>' in main and "in wait" in main  # the wait(30)
    assert any(name.startswith("shutdown-deadline ") for name in line["stacks"])


def test_a_process_that_finishes_first_is_not_cut_short():
    finished = BLOCKED.replace("threading.Event().wait(30)", "threading.Event().wait(0.1)")
    proc = subprocess.run(
        [sys.executable, "-c", finished.replace("deadline.start(0.3)", "deadline.start(5)")],
        cwd=ROOT, capture_output=True, timeout=20, check=False,
    )  # fmt: skip
    assert proc.returncode == 3 and proc.stderr == b""


AT_EXIT = """
import time
from common.deadline import Deadline, exit_at
from common.logs import setup_logging


class Stuck:
    def __del__(self) -> None:
        time.sleep(30)  # a destructor blocked in the interpreter's final collection (librdkafka's)


setup_logging()
stuck = Stuck()
deadline = Deadline()
exit_at(deadline, grace_s=0.2)
deadline.start(0.3)
raise SystemExit(3)
"""


def test_a_process_blocked_while_it_finalizes_is_ended_by_the_watchdog():
    """The interpreter stops exit_at's daemon thread once it finalizes: faulthandler's watchdog,
    armed as the deadline starts, ends the process BACKSTOP_S after exit_at would have."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", AT_EXIT], cwd=ROOT, capture_output=True, timeout=20, check=False
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr.decode()
    assert 1.5 <= elapsed < 10, elapsed  # 0.3 s of deadline, 0.2 s of grace, 1 s of backstop
    err = proc.stderr.decode()
    assert err.startswith("Timeout (0:00:01."), err  # 1.5 s after the deadline started
    assert "in __del__" in err  # where it was stuck
