"""SIGTERM: the worker finishes its batch, commits and exits inside the deadline; a successor
then sees no redelivery at all. Its probes and metrics answer over HTTP."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import orjson
import pytest

from rankstream.stack import free_port
from rankstream.topics import ensure_topics
from tests.helpers import applied_so_far, produce, running_worker, wait_for
from tests.integration.test_worker_oracle import worker_process
from tests.oracle import BOARDS, ORACLE_BOARDS, Message, now_ms

pytestmark = pytest.mark.integration


def unique_stream(n: int) -> list[Message]:
    """n single events with unique ids: any duplicate a worker sees is a redelivery."""
    start = now_ms()
    out = []
    for i in range(n):
        board = BOARDS[i % len(BOARDS)]
        event = {"id": f"u{i}", "board": board, "member": f"m{i % 97}", "score": 1 + i % 5, "ts": start - i}
        out.append(Message(board.encode(), orjson.dumps(event), [(event, None)], []))
    return out


def http(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_sigterm_commits_everything_applied_and_exits_in_time(make_settings, tmp_path, rclient):
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    settings = make_settings(boards=boards)
    ensure_topics(settings)
    events = unique_stream(60_000)
    produce(settings, events)
    port = free_port()
    first = worker_process(settings, http_port=port)
    wait_for(lambda: applied_so_far(rclient, settings) > 10_000, 60, "some events applied")
    status, body = http(port, "/livez")
    assert status == 200 and orjson.loads(body)["ok"] is True
    status, body = http(port, "/readyz")
    assert status == 200 and orjson.loads(body)["redis"] is True
    status, body = http(port, "/metrics")
    assert (
        status == 200
        and b"rankstream_worker_events_total" in body
        and b"rankstream_worker_apply_seconds" in body
    )
    first.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert first.wait(30) == 0
    assert time.monotonic() - started < settings.shutdown_deadline_s
    stopped_at = applied_so_far(rclient, settings)
    assert stopped_at < len(events), "the worker finished before SIGTERM: nothing was tested"

    with running_worker(settings) as successor:
        wait_for(lambda: applied_so_far(rclient, settings) >= len(events), 120, "the rest applied")
        duplicates = successor.metrics.registry.get_sample_value(
            "rankstream_worker_events_total", {"outcome": "duplicate"}
        )
    assert duplicates == 0  # everything the first worker applied, it had committed
    assert applied_so_far(rclient, settings) == len(events)
