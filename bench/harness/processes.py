"""The processes a benchmark starts: spawned with a log each, stopped newest first however the
run ends; a helper process run to its end for its JSON; a process' resident memory."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.common import REPO, BenchError, Result, say

STOP_TIMEOUT_S = 30.0  # a rankstream process commits and exits on SIGTERM well within this


def child_env(settings: Mapping[str, str]) -> dict[str, str]:
    """The environment of a rankstream child: ours without any RANKSTREAM_* (so the caller's
    shell cannot change what is measured), plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env.update(settings)
    return env


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")


@dataclass
class Children:
    """Every process a benchmark starts; `stop_all` (in a finally) stops them newest first."""

    folder: Path
    running: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        log = self.folder / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(argv), cwd=REPO, env=dict(env) if env is not None else child_env({}),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches us only: the finally stops it in order
            )  # fmt: skip
        child = Child(name, proc, log)
        self.running.append(child)
        return child

    def stop(self, child: Child) -> float:
        """SIGTERM, SIGKILL after STOP_TIMEOUT_S; seconds it took."""
        started = time.monotonic()
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                say(f"{child.name} ({child.pid}) ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s: killing it")
                child.proc.kill()
                child.proc.wait()
        if child in self.running:
            self.running.remove(child)
        return time.monotonic() - started

    def stop_all(self) -> None:
        for child in reversed(list(self.running)):
            try:
                self.stop(child)
            except Exception as exc:  # noqa: BLE001 - stop the others too
                say(f"stopping {child.name} failed: {exc}")


@contextlib.contextmanager
def children(folder: Path) -> Iterator[Children]:
    folder.mkdir(parents=True, exist_ok=True)
    group = Children(folder)
    try:
        yield group
    finally:
        group.stop_all()


def child_json(argv: Sequence[str], what: str, timeout: float) -> Result:
    """Run a helper process (a measurement that needs a fresh interpreter) to its end; its
    stdout is one JSON object."""
    proc = subprocess.run(
        list(argv), cwd=REPO, env=child_env({}), capture_output=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"{what} exited with {proc.returncode}: {proc.stderr.decode()[-400:]}")
    result: Result = orjson.loads(proc.stdout)
    return result


def rss_bytes(pid: int | str = "self") -> int | None:
    """VmRSS of a process, from /proc; None when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fork_all(jobs: Sequence[tuple[Callable[..., object], tuple[object, ...]]], what: str) -> None:
    """Run each (target, args) in a forked process at once and wait for all; BenchError if one failed."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=args) for target, args in jobs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        raise BenchError(f"{what}: a process failed (exit codes {[proc.exitcode for proc in procs]})")
