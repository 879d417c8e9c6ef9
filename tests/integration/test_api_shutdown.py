"""SIGTERM: a real `rankstream api` process exits with 0 within RANKSTREAM_SHUTDOWN_DEADLINE_S,
also while Redis stalls under a request in flight and while Kafka is unreachable (the hot-board
replay thread then hangs in librdkafka); a request that can finish within the budget is answered
before the process exits."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from rankstream.stack import free_port
from tests.helpers import api_env, http_status, wait_for
from tests.integration.test_api_contract import fill

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 6.0
TOLERANCE_S = 1.5  # process start/stop noise around the measured exit (what is measured is printed)
COLD_TOP = "/v1/boards/gift:room7/top"  # not hot (deploy/boards.yaml): read from Redis


class InFlight:
    """One GET in a thread: its answer (or the error it ended with) and when it ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.status: int | None = None
        self.body: Any = None
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> InFlight:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with urllib.request.urlopen(self.url, timeout=60) as resp:  # noqa: S310 - loopback
                self.status, self.body = int(resp.status), orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            self.status, self.body = int(exc.code), exc.read()
        except OSError as exc:  # the connection closed unanswered (cancelled at the deadline)
            self.error = exc
        self.ended_at = time.monotonic()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def running(self) -> bool:
        return self._thread.is_alive()


class ApiProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")  # a file, not a pipe: a full pipe would block the server's logging
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rankstream.cli", "api"], env=env, cwd=ROOT, stderr=self._out
        )

    def terminate_and_time(self) -> tuple[int, float, float]:
        """SIGTERM; (exit code, seconds from the signal to the exit, monotonic exit time)."""
        self.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = self.proc.wait(DEADLINE_S + 30)
        exited = time.monotonic()
        return code, exited - sent, exited

    def stderr(self) -> str:
        self._out.close()
        return self.log.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()


def _logged(stderr: str, msg: str) -> list[dict[str, Any]]:
    entries = []
    for line in stderr.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == msg:
            entries.append(entry)
    return entries


def _report(case: str, code: int, took: float, deadline_s: float, stderr: str) -> None:
    stopped = _logged(stderr, "api stopped")
    logged = f"{stopped[0]['seconds']}s" if stopped else "never"
    print(f"\n[{case}] exit code {code} {took:.2f}s after SIGTERM (deadline {deadline_s}s; "
          f"'api stopped' logged at {logged})")  # fmt: skip
    for line in stderr[stderr.find('"stopping: ') :].splitlines():  # the shutdown, as the process logged it
        if '"logger":"api.' in line:
            print("  " + line)


def _start(settings, port: int, tmp_path: Path, **env: str) -> tuple[ApiProcess, str]:
    environ = {
        **api_env(settings, port),
        "RANKSTREAM_SHUTDOWN_DEADLINE_S": str(DEADLINE_S),
        "RANKSTREAM_TOP_CACHE_TTL_S": "0",
        **env,
    }
    return ApiProcess(environ, tmp_path / "api.log"), f"http://127.0.0.1:{port}"


class StalledUpload:
    """A POST whose body never completes: its handler waits in `request.read()` until the shutdown
    cuts it, a request in flight that no drain can finish. Records what the server sent back."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = b'{"members": ["u1"]}'
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        self.sock.sendall(f"{head}Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
        self.reply = b""
        self.closed_at: float | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.reply += chunk
        except OSError:
            pass
        self.closed_at = time.monotonic()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        self.sock.close()

    def running(self) -> bool:
        return self._thread.is_alive()


def _paused(rclient, seconds: float) -> float:
    """Redis stalls for `seconds` (longer than the whole deadline): every client's commands are
    postponed, CLIENT UNPAUSE's too, so the pause is only as long as the test needs and the
    test's `finally` waits it out with an UNPAUSE. Returns when it ends (monotonic)."""
    rclient.execute_command("CLIENT", "PAUSE", str(int(seconds * 1000)), "ALL")
    return time.monotonic() + seconds


@pytest.mark.parametrize("kafka", ["reachable", "unreachable"])
@pytest.mark.slow
def test_exits_within_the_deadline_with_redis_paused_under_requests(topics, rclient, tmp_path, kafka):
    settings = topics
    fill(settings, rclient)
    port = free_port()
    env = {"RANKSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"} if kafka == "unreachable" else {}
    api, base = _start(settings, port, tmp_path, **env)
    pause_ends: float | None = None
    try:
        if kafka == "reachable":  # the hot board (gift:room42) replayed: its thread follows Kafka
            wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
        else:  # the replay thread hangs in librdkafka, retrying; the node is alive, never ready
            wait_for(lambda: http_status(f"{base}/livez") == 200, 60, "the API alive")
            assert http_status(f"{base}/readyz") == 503
        upload = StalledUpload(port, "/v1/boards/gift:room7/members/lookup")
        pause_ends = _paused(rclient, DEADLINE_S + 3)
        request = InFlight(base + COLD_TOP).start()
        time.sleep(0.5)  # both handlers run: one blocked on Redis, one on the client
        assert request.running() and upload.running()
        code, took, exited_at = api.terminate_and_time()
        stderr = api.stderr()
        request.join(10)
        upload.join(10)
        _report(f"kafka {kafka}, Redis paused", code, took, DEADLINE_S, stderr)
        assert code == 0, stderr
        assert took <= DEADLINE_S + TOLERANCE_S, stderr
        assert time.monotonic() < pause_ends, "Redis was paused for less than the whole shutdown"
        # the orderly path, not the last-resort exit at the deadline
        assert not _logged(stderr, "shutdown deadline reached: exiting now"), stderr
        stopped = _logged(stderr, "api stopped")
        assert len(stopped) == 1 and stopped[0]["seconds"] < DEADLINE_S, stderr
        if kafka == "unreachable":
            assert _logged(stderr, "hot-board replay thread still blocked: abandoned"), stderr
        assert "Traceback" not in stderr
        # the request blocked on Redis ended within the drain (the client's socket timeout, 2 s):
        # answered, a 503, before the exit
        assert request.status == 503 and b"redis_unavailable" in request.body, (request.error, stderr)
        assert request.ended_at is not None and request.ended_at <= exited_at
        # the upload never completes: cut when the drain ran out, unanswered
        cut = _logged(stderr, "requests still in flight at the end of the drain: cancelling them")
        assert len(cut) == 1 and cut[0]["in_flight"] == 1, stderr
        assert upload.reply == b"" and upload.closed_at is not None
    finally:
        api.kill()
        if pause_ends is not None:  # returns when the pause ends (Redis postpones the UNPAUSE too)
            rclient.execute_command("CLIENT", "UNPAUSE")


def test_a_request_blocked_on_redis_past_the_deadline_is_cut(topics, rclient, tmp_path):
    """A deadline shorter than the Redis client's socket timeout: the request blocked on the paused
    Redis is still in flight when the drain runs out; it is cancelled mid-read, the process exits."""
    settings = topics
    fill(settings, rclient)
    deadline_s = 1.5
    api, base = _start(settings, free_port(), tmp_path, RANKSTREAM_SHUTDOWN_DEADLINE_S=str(deadline_s))
    pause_ends: float | None = None
    try:
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
        pause_ends = _paused(rclient, deadline_s + 3)
        request = InFlight(base + COLD_TOP).start()
        time.sleep(0.3)
        assert request.running()
        code, took, _ = api.terminate_and_time()
        stderr = api.stderr()
        request.join(10)
        _report("Redis paused, request cut", code, took, deadline_s, stderr)
        assert code == 0, stderr
        assert took <= deadline_s + TOLERANCE_S, stderr
        assert time.monotonic() < pause_ends
        assert not _logged(stderr, "shutdown deadline reached: exiting now"), stderr
        cut = _logged(stderr, "requests still in flight at the end of the drain: cancelling them")
        assert len(cut) == 1 and cut[0]["in_flight"] == 1, stderr
        stopped = _logged(stderr, "api stopped")
        assert len(stopped) == 1 and stopped[0]["seconds"] < deadline_s, stderr
        assert "Traceback" not in stderr
        assert request.status is None and isinstance(request.error, OSError)  # cut, unanswered
    finally:
        api.kill()
        if pause_ends is not None:
            rclient.execute_command("CLIENT", "UNPAUSE")


def test_a_request_in_flight_is_answered_before_the_exit(topics, rclient, tmp_path):
    settings = topics
    fill(settings, rclient)
    api, base = _start(settings, free_port(), tmp_path)
    try:
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
        rclient.execute_command("CLIENT", "PAUSE", "1500", "ALL")  # a short stall: the request waits
        request = InFlight(base + COLD_TOP).start()
        time.sleep(0.4)
        assert request.running()
        code, took, exited_at = api.terminate_and_time()
        stderr = api.stderr()
        request.join(10)
        _report("Redis healthy, request drained", code, took, DEADLINE_S, stderr)
        print(f"  the answer came {exited_at - (request.ended_at or exited_at):.2f}s before the exit")
        assert code == 0, stderr
        assert took <= DEADLINE_S + TOLERANCE_S, stderr
        assert request.status == 200 and len(request.body["items"]) == 10, (request.error, stderr)
        assert request.ended_at is not None and request.ended_at <= exited_at
        drained = _logged(stderr, "requests in flight drained")
        assert len(drained) == 1, stderr
        assert not _logged(stderr, "shutdown deadline reached: exiting now"), stderr
        assert "Traceback" not in stderr
    finally:
        api.kill()
