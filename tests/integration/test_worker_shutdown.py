"""SIGTERM: the worker finishes its batch, commits and exits inside the deadline; a successor
then sees no redelivery at all. Its probes and metrics answer over HTTP."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import orjson
import pytest
import redis

from rankstream.stack import LocalKafka, LocalRedis, free_port
from rankstream.topics import ensure_topics
from tests.helpers import applied_so_far, event_counts, produce, running_worker, wait_for
from tests.integration.test_worker_oracle import worker_process
from tests.oracle import BOARDS, ORACLE_BOARDS, Message, now_ms

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
        rest = len(events) - stopped_at
        wait_for(lambda: sum(event_counts(successor.metrics).values()) >= rest, 30, "the rest counted")
        duplicates = event_counts(successor.metrics)["duplicate"]
    assert duplicates == 0  # everything the first worker applied, it had committed
    assert applied_so_far(rclient, settings) == len(events)


def test_sigterm_with_redis_paused_and_the_broker_gone_exits_inside_the_deadline(make_settings, tmp_path):
    """The deadline bounds every blocking call: with Redis paused (CLIENT PAUSE) and the broker
    unreachable, SIGTERM still ends the worker inside RANKSTREAM_SHUTDOWN_DEADLINE_S, and what it
    left uncommitted is redone exactly by a successor."""
    store = LocalRedis("redis", tmp_path / "redis", port=free_port())
    broker = LocalKafka("kafka", tmp_path / "kafka", port=free_port(), controller_port=free_port())
    store.start()
    broker.start()
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    settings = make_settings(boards=boards, redis_url=store.url, kafka_bootstrap=broker.bootstrap)
    ensure_topics(settings)
    client = redis.Redis.from_url(store.url)
    deadline_s = 2.5  # shorter than the worker's Redis socket timeout (5 s): only the deadline ends it
    try:
        events = unique_stream(40_000)
        produce(settings, events)
        worker = worker_process(settings, extra_env={"RANKSTREAM_SHUTDOWN_DEADLINE_S": str(deadline_s)})
        wait_for(lambda: applied_so_far(client, settings) > 5_000, 60, "some events applied")
        client.client_pause(10_000, all=True)  # every command now waits up to 10 s
        broker.stop()  # and the broker is gone
        time.sleep(1.0)  # the worker is blocked on Redis by now
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = worker.wait(30)
        took = time.monotonic() - started
        print(f"worker exit, Redis paused and Kafka gone: {took:.2f} s (deadline {deadline_s} s)")
        assert code == 0
        assert took < deadline_s
        broker.start()  # (Redis' own pause ends by itself: CLIENT UNPAUSE would wait for it anyway)
        assert applied_so_far(client, settings) < len(events)
        with running_worker(settings) as successor:
            wait_for(lambda: applied_so_far(client, settings) >= len(events), 120, "the rest applied")
            assert successor.metrics.registry.get_sample_value("rankstream_worker_messages_consumed_total")
        assert applied_so_far(client, settings) == len(events)  # nothing lost, nothing twice
    finally:
        client.close()
        broker.stop()
        store.stop()
