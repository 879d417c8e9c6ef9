"""The commands people type: `make run`'s supervisor end to end, and bad config failing in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import orjson
import pytest

from common.clock import TEST_CLOCK_ENV, ClockFile
from common.store.keys import BoardKeys, shard_counts
from rankstream.stack import free_port, free_port_pair
from tests.conftest import own_topics
from tests.helpers import api_env, http_status, produce, wait_for, worker_env
from tests.oracle import DAY_MS, Message

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _rankstream(
    *args: str, env: dict[str, str], merge_stderr: bool = False, new_session: bool = False
) -> subprocess.Popen[str]:
    stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    argv = [sys.executable, "-m", "rankstream.cli", *args]
    return subprocess.Popen(argv, env=env, text=True, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr,
                            start_new_session=new_session)  # fmt: skip


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        body: dict[str, object] = orjson.loads(resp.read())
        return body


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}


def _dev(
    folder: Path, boards: Path, rate: str, new_session: bool = False
) -> tuple[subprocess.Popen[str], int]:
    """`rankstream dev` on free ports with its stack in `folder`: the process and its API port."""
    api_port = free_port()
    env = {
        **_clean_env(),
        "RANKSTREAM_API_PORT": str(api_port),
        "RANKSTREAM_API_ADMIN_PORT": str(free_port()),
        "RANKSTREAM_WORKER_HTTP_PORT": str(free_port()),
        "RANKSTREAM_BOARDS": str(boards),
    }
    # Kafka's controller listens on --kafka-port + 1: both must be free (a CI run met + 1 taken)
    ports = ["--kafka-port", str(free_port_pair()), "--redis-port", str(free_port())]
    args = ["dev", "--dir", str(folder), *ports, "--rate", rate]
    return _rankstream(*args, env=env, merge_stderr=True, new_session=new_session), api_port


def _leftovers(folder: Path) -> str:
    """Processes still running from `folder` (the stack's servers name it in their arguments)."""
    return subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True, check=False).stdout


@pytest.mark.slow
def test_dev_serves_a_live_top10_and_stops_without_leftovers(tmp_path):
    folder = tmp_path / "stack"
    proc, api_port = _dev(folder, ROOT / "deploy" / "boards.yaml", "300")
    try:
        urls: list[str] = []
        printed: list[str] = []
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while len(urls) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"rankstream dev ended early ({proc.wait()}): {''.join(printed)[-2000:]}"
            printed.append(line)
            if line.strip().startswith("http://"):
                urls.append(line.strip())
        page, url = urls  # the live page first
        assert page == f"http://127.0.0.1:{api_port}/boards/gift:room42"
        assert http_status(page) == 200
        assert url == f"http://127.0.0.1:{api_port}/v1/boards/gift:room42/top?limit=10"
        first = _get(url)
        items = first["items"]
        assert isinstance(items, list) and 1 <= len(items) <= 10
        assert [i["rank"] for i in items] == list(range(1, len(items) + 1))
        # live: the producer keeps going
        wait_for(lambda: int(str(_get(url)["seq"])) > int(str(first["seq"])), 30, "the board's seq to move")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    assert _leftovers(folder) == ""


@pytest.mark.slow
def test_ctrl_c_while_dev_starts_stops_everything_at_once(tmp_path):
    """Ctrl-C before the demo board has a top-10 (here it never will: the boards declare no
    `gift` type) stops everything as it does later: exit 0, `stopped`, nothing left running. It
    used to go on waiting for the top-10 for 60 s, then fail."""
    boards = tmp_path / "boards.yaml"
    boards.write_text("timezone: UTC\ntypes:\n  level:\n    windows: [total]\n")
    folder = tmp_path / "stack"
    # its own process group, as a terminal's foreground job: Ctrl-C signals every process in it
    proc, api_port = _dev(folder, boards, "50", new_session=True)
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{api_port}/livez") == 200, 120, "the API up")
        assert http_status(f"http://127.0.0.1:{api_port}/v1/boards/gift:room42/top?limit=10") == 404
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert out.strip().endswith("stopped") and "rankstream is running" not in out, out
    assert _leftovers(folder) == ""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANKSTREAM_BOARDS": "/nonexistent/boards.yaml"}, "/nonexistent/boards.yaml"),
        ({"RANKSTREAM_BORADS": "x.yaml"}, "unknown setting RANKSTREAM_BORADS"),
        ({"RANKSTREAM_API_PORT": "http"}, "RANKSTREAM_API_PORT"),
        (
            {"RANKSTREAM_BOARDS": str(ROOT / "deploy" / "boards.yaml"), "RANKSTREAM_KAFKA_NO_SUCH_KEY": "1"},
            "No such configuration property",
        ),
        (
            {"RANKSTREAM_BOARDS": str(ROOT / "deploy" / "boards.yaml"), TEST_CLOCK_ENV: "/nonexistent/clock"},
            "RANKSTREAM_TEST_CLOCK_FILE: not a clock file",
        ),
    ],
)
def test_bad_config_exits_non_zero_with_one_readable_line(tmp_path, env, expected):
    for command in ("worker", "api"):
        proc = _rankstream(command, env={**_clean_env(), **env})
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rankstream: ") and expected in lines[0], err


def test_a_config_changing_a_types_shards_over_its_data_stops_worker_and_api_in_one_line(settings, rclient):
    """The shard count Redis recorded for a type holding data (here 3, deploy/boards.yaml says
    1): neither process starts, each says which type in one line."""
    rclient.hset(shard_counts(settings.key_prefix), "gift", 3)
    env = {
        **_clean_env(),
        "RANKSTREAM_REDIS_URL": settings.redis_url.get_secret_value(),
        "RANKSTREAM_KEY_PREFIX": settings.key_prefix,
        "RANKSTREAM_BOARDS": str(ROOT / "deploy" / "boards.yaml"),
    }
    for command in ("worker", "api"):
        proc = _rankstream(command, env=env)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"rankstream: {ROOT / 'deploy' / 'boards.yaml'}: types.gift.shards: its boards hold data written "
            "with shards: 3, the config says 1"
        ), err


def test_bad_board_file_names_file_key_and_reason(tmp_path):
    bad = tmp_path / "boards.yaml"
    bad.write_text("types:\n  gift:\n    order: upward\n")
    proc = _rankstream("worker", env={**_clean_env(), "RANKSTREAM_BOARDS": str(bad)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip() == err.strip().splitlines()[0]
    assert str(bad) in err and "types.gift.order" in err and "upward" in err


def test_worker_without_a_reachable_kafka_exits_1_with_one_error_line(settings):
    """A wrong bootstrap (or Kafka down at start): the worker says so in one line and exits 1
    (its pod restarts with back-off), instead of a traceback after a silent wait."""
    bootstrap = f"127.0.0.1:{free_port()}"
    env = {
        **_clean_env(),
        "RANKSTREAM_KAFKA_BOOTSTRAP": bootstrap,
        "RANKSTREAM_REDIS_URL": settings.redis_url.get_secret_value(),
        "RANKSTREAM_BOARDS": str(ROOT / "deploy" / "boards.yaml"),
        "RANKSTREAM_WORKER_HTTP_PORT": str(free_port()),
        "RANKSTREAM_WORKER_START_TIMEOUT_S": "3",  # the default 30 s is for a broker still starting
    }
    proc = _rankstream("worker", env=env, merge_stderr=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    errors = [orjson.loads(line) for line in out.splitlines() if '"level":"error"' in line.replace(" ", "")]
    assert len(errors) == 1 and bootstrap in errors[0]["msg"] and "did not answer" in errors[0]["msg"], out


def test_the_worker_and_the_api_run_on_the_test_clock_file(make_settings, rclient, tmp_path):
    """`rankstream worker` and `rankstream api` read RANKSTREAM_TEST_CLOCK_FILE at every call
    (common/clock.py). The file says noon five days ago: an event an hour before it counts in its
    day (by the real clock that day closed long ago: total only), one two days before it is late
    (total only); the API's current day is the file's, and moves when the test moves it."""
    boards = tmp_path / "boards.yaml"
    boards.write_text("timezone: UTC\ntypes:\n  gift: {windows: [total, day], late_grace: 10m}\n")
    settings = make_settings(boards=boards)
    now = int(time.time() * 1000) // DAY_MS * DAY_MS - 5 * DAY_MS + 12 * 3_600_000  # days kept: 31
    clock = ClockFile.create(tmp_path / "clock", now)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with own_topics(settings):
        try:
            for argv, env in (("worker", worker_env(settings)), ("api", api_env(settings, port))):
                env[TEST_CLOCK_ENV] = str(clock.path)
                procs.append(
                    subprocess.Popen([sys.executable, "-m", "rankstream.cli", argv], env=env, cwd=ROOT)
                )
            events = [
                {"id": "on-time", "board": "gift:x", "member": "m1", "score": 5, "ts": now - 3_600_000},
                {"id": "late", "board": "gift:x", "member": "m2", "score": 7, "ts": now - 2 * DAY_MS},
            ]
            produce(settings, [Message(b"gift:x", orjson.dumps(e), [(e, None)], []) for e in events])
            seq = BoardKeys(settings.key_prefix, "gift:x").seq
            wait_for(lambda: int(rclient.get(seq) or 0) == 2, 60, "both events applied")
            base = f"http://127.0.0.1:{port}/v1/boards/gift:x/top"
            wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 60, "the API ready")
            assert _top(f"{base}?window=day") == (_day(now), ["m1"])
            assert _top(f"{base}?window=total") == ("all", ["m2", "m1"])
            clock.set(now + DAY_MS)
            assert _top(f"{base}?window=day") == (_day(now + DAY_MS), [])
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                assert proc.wait(30) == 0


def _top(url: str) -> tuple[object, list[object]]:
    """An answer's period and its members in rank order."""
    body = _get(url)
    return body.get("period"), [item["member"] for item in cast(list[dict[str, object]], body["items"])]


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")
