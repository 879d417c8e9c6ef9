"""Exactly once without the id window's help: redelivery (kill -9, rebalances) is stopped by the
boards' offset fences even when the id window (1 s) has long forgotten the ids; a producer retry
storm is dropped by the window, and counts again once the window is over; a recreated topic (new
topic id, offsets from 0 again) is applied, not mistaken for a redelivery."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from typing import cast

import orjson
import pytest
import redis
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from common.idwindow import key_ttl_ms
from common.settings import Settings
from rankstream.stack import free_port
from rankstream.topics import UPDATE_PARTITIONS, ensure_topics
from tests.helpers import (
    applied_so_far,
    check_dlq,
    committed_offsets,
    committed_total,
    event_counts,
    produce,
    running_worker,
    stop_workers,
    wait_for,
)
from tests.integration.test_worker_oracle import total_applied, worker_process
from tests.oracle import BOARDS, ORACLE_BOARDS, Message, Model, compare_redis, generate, now_ms, run_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EVENTS = 30_000
# a 1 s id window, and batches small enough (30k events) that each kill lands mid-stream
WINDOW_1S = {"RANKSTREAM_ID_WINDOW_S": "1", "RANKSTREAM_WORKER_BATCH_SIZE": "500"}


@pytest.fixture
def exact_topics(make_settings: Callable[..., Settings], tmp_path) -> Callable[..., Settings]:
    """Settings (with overrides) on the oracle's boards, their topics created."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)

    def build(**overrides: object) -> Settings:
        settings = make_settings(boards=boards, **overrides)
        ensure_topics(settings)
        return settings

    return build


def unique_stream(seed: int, total: int = EVENTS) -> tuple[list[Message], Model]:
    """The oracle's stream without its re-produced duplicates: every id appears once, so a double
    count can only come from redelivery."""
    start = now_ms()
    kept: dict[int, Message] = {}
    for msg in generate(seed, total, start):
        kept.setdefault(id(msg), msg)  # a re-produced duplicate is the same object again
    messages = list(kept.values())
    ids = [(e["board"], e["id"]) for m in messages for e, _ in m.valid]
    assert len(ids) == len(set(ids)) > total * 0.8
    return messages, run_model(messages, start)


def relabeled(messages: list[Message]) -> list[Message]:
    """The same bytes produced again, as the model must see them once the id window is over:
    new events (distinct ids for the model only)."""
    return [Message(m.key, m.value, [({**e, "id": f"{e['id']}#again"}, i) for e, i in m.valid], m.bad)
            for m in messages]  # fmt: skip


def events_counted(port: int, outcome: str) -> float:
    """rankstream_worker_events{outcome} of a worker subprocess, from its /metrics (0 while it
    is not serving them yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rankstream_worker_events_total" and sample.labels.get("outcome") == outcome:
                return float(sample.value)
    return 0.0


def partitions_owned(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(orjson.loads(resp.read())["partitions"])
    except OSError:  # not up yet (an HTTPError 503 is an OSError too: blocked, or no Redis)
        return 0


def assert_id_window_is_1s(client: redis.Redis, settings: Settings) -> None:
    """The running worker really uses a 1 s window: its id buckets expire (window + 1) s after use
    (common/idwindow.py key_ttl_ms: no slack in a window this short)."""
    ttls = [client.pttl(k) for k in client.scan_iter(match=f"{settings.key_prefix}*}}:i*", count=1000)]
    live = sorted(t for t in ttls if t != -2)  # -2: expired since the scan
    # 0: the key's expiry is this very millisecond (PTTL rounds a due key down to 0); -1 would be a
    # key without an expiry, which the window never writes
    longest = key_ttl_ms(1)
    assert live and all(0 <= t <= longest for t in live), f"id window keys' ttl (ms): {live[:3]}…{live[-3:]}"


def fences(client: redis.Redis, settings: Settings) -> dict[tuple[str, str], tuple[str, int]]:
    """(board, source) -> (topic id, offset) of every board's fence."""
    out = {}
    for board in BOARDS:
        raw = cast(dict[bytes, bytes], client.hgetall(f"{settings.key_prefix}{{{board}}}:fence"))
        for field, value in raw.items():
            name = field.decode()
            if name.startswith(settings.topic_updates) and not name.endswith("!r"):
                topic_id, offset, _ = value.decode().split("|")
                out[(board, name)] = (topic_id, int(offset))
    return out


def settled_offsets(settings: Settings) -> dict[int, int]:
    """The group's committed offsets once a transaction commit already on its way has landed:
    read until two reads 0.2 s apart agree (a loaded broker may take longer than one pause)."""
    committed = committed_offsets(settings, stable=False)
    while True:
        time.sleep(0.2)
        again = committed_offsets(settings, stable=False)
        if again == committed:
            return committed
        committed = again


def kill_while_redis_is_ahead(
    victim: subprocess.Popen[bytes], client: redis.Redis, settings: Settings
) -> None:
    """SIGKILL at a moment some board holds events at or past its partition's committed offset
    (applied, not committed), as seen with the worker stopped: they must be redelivered."""
    deadline = time.monotonic() + 30
    while True:
        seen = applied_so_far(client, settings)
        while applied_so_far(client, settings) == seen:  # a batch is being applied: its commit follows
            assert time.monotonic() < deadline, "Redis was never seen ahead of the commits"
        victim.send_signal(signal.SIGSTOP)
        committed = settled_offsets(settings)
        if any(
            off >= committed[int(src.rsplit(":", 1)[1])]
            for (_, src), (_, off) in fences(client, settings).items()
        ):
            break
        victim.send_signal(signal.SIGCONT)
    victim.kill()  # SIGKILL: applied in Redis, not committed in Kafka
    victim.wait(10)


def test_redelivery_after_kill_9_is_fenced_with_a_1s_id_window(exact_topics, rclient, consumer_factory):
    """Three kill -9 mid-stream, each while Redis is ahead of the commits and each restart more
    than the id window later: only the offset fences can tell the redelivered events."""
    settings = exact_topics()
    messages, model = unique_stream(seed=21)
    produce(settings, messages)
    target = total_applied(model)
    for n, share in enumerate((0.2, 0.45, 0.7)):
        port = free_port()  # one pod restarted: the same transactional id fences the dead one's
        victim = worker_process(settings, port, worker_id="pod-a", extra_env=WINDOW_1S)
        try:
            goal = target * share
            wait_for(lambda: applied_so_far(rclient, settings) > goal, 60, f"{share:.0%} applied")  # noqa: B023
            if n > 0:  # what the previous victim applied but never committed came again, and was fenced
                redelivered = partial(events_counted, port, "redelivered")
                wait_for(lambda: redelivered() > 0, 30, "the previous kill's events redelivered")  # noqa: B023
            assert_id_window_is_1s(rclient, settings)
            kill_while_redis_is_ahead(victim, rclient, settings)
            assert applied_so_far(rclient, settings) < target, "the kill came too late to test anything"
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait(10)
        time.sleep(1.5)  # every id the victim applied is out of the window before anyone restarts
    port = free_port()
    last = worker_process(settings, port, worker_id="pod-b", extra_env=WINDOW_1S)  # a new pod
    try:
        wait_for(lambda: applied_so_far(rclient, settings) >= target, 60, "every event applied")
        wait_for(lambda: committed_total(settings) == len(messages), 30, "everything committed")
        assert events_counted(port, "redelivered") > 0
        assert events_counted(port, "duplicate") == 0  # the window (1 s) saved nothing
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(30) == 0
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)


def test_redelivery_across_rebalances_is_fenced_with_a_1s_id_window(exact_topics, rclient, consumer_factory):
    settings = exact_topics()
    messages, model = unique_stream(seed=22, total=60_000)
    held_back = len(messages) * 2 // 3  # the last third is produced once a has left: however slow
    produce(settings, messages[:held_back])  # the join and the leave, they happen mid-stream
    target = total_applied(model)
    port_a, port_b = free_port(), free_port()
    # small batches: many commits, so the moves meet batches in flight
    slow = {**WINDOW_1S, "RANKSTREAM_WORKER_BATCH_SIZE": "100"}
    a = worker_process(settings, port_a, extra_env=slow)
    b = None
    try:
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.15, 60, "15% applied")
        b = worker_process(settings, port_b, extra_env=slow)  # joins: partitions move to it
        wait_for(lambda: partitions_owned(port_b) > 0, 60, "the second worker owns partitions")
        assert_id_window_is_1s(rclient, settings)
        time.sleep(1.5)  # what a applied before the move is out of the window when b applies
        a.send_signal(signal.SIGTERM)  # leaves: its partitions move back to b
        assert a.wait(30) == 0
        produce(settings, messages[held_back:])
        wait_for(lambda: applied_so_far(rclient, settings) >= target, 60, "every event applied")
        wait_for(lambda: committed_total(settings) == len(messages), 30, "everything committed")
        assert events_counted(port_b, "duplicate") == 0
    finally:
        stop_workers(a, b)
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)


def test_a_retry_storm_within_the_window_is_dropped(exact_topics, rclient, consumer_factory):
    """The whole stream (itself 10% re-produced duplicates) produced twice, the second copy while
    the first is being applied: the second copy changes nothing."""
    settings = exact_topics()
    start = now_ms()
    messages = list(generate(seed=23, total=20_000, now_ms=start))
    once, twice = run_model(messages, start), run_model(messages + messages, start)
    assert twice.state == once.state and twice.seq == once.seq and len(twice.dlq) == 2 * len(once.dlq)
    produce(settings, messages)
    with running_worker(settings) as loop:
        wait_for(lambda: applied_so_far(rclient, settings) > total_applied(once) * 0.3, 60, "30% applied")
        produce(settings, messages)
        wait_for(lambda: committed_total(settings) == 2 * len(messages), 60, "both copies committed")
    counts = event_counts(loop.metrics)  # counted after the commit: read once the loop stopped
    compare_redis(rclient, settings.key_prefix, twice)
    check_dlq(consumer_factory, settings, twice, exact=True)
    valid = 2 * sum(len(m.valid) for m in messages)
    out_of_range = len(twice.dlq) - 2 * sum(len(m.bad) for m in messages)  # refused by the script
    assert counts["applied"] == total_applied(once)
    assert counts["redelivered"] == 0
    assert counts["duplicate"] == valid - total_applied(once) - out_of_range


def test_the_same_stream_after_the_window_counts_again(exact_topics, rclient, consumer_factory):
    settings = exact_topics(id_window_s=1)
    messages, once = unique_stream(seed=24, total=15_000)
    twice = run_model(messages + relabeled(messages), once.now_ms)
    assert total_applied(twice) == 2 * total_applied(once)
    produce(settings, messages)
    with running_worker(settings) as loop:
        wait_for(lambda: committed_total(settings) == len(messages), 60, "the first copy committed")
        assert applied_so_far(rclient, settings) == total_applied(once)
        time.sleep(2.5)  # the window (1 s, at whole-second resolution) is over for every id
        produce(settings, messages)
        wait_for(lambda: committed_total(settings) == 2 * len(messages), 60, "the second copy committed")
    counts = event_counts(loop.metrics)
    compare_redis(rclient, settings.key_prefix, twice)
    check_dlq(consumer_factory, settings, twice, exact=True)
    assert counts == {"applied": total_applied(twice), "duplicate": 0, "redelivered": 0}


def recreate_updates_topic(settings: Settings) -> None:
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.delete_topics([settings.topic_updates], operation_timeout=30)[settings.topic_updates].result(30)
    wait_for(
        lambda: settings.topic_updates not in admin.list_topics(timeout=10).topics, 30, "the topic deleted"
    )
    deadline = time.monotonic() + 30
    while settings.topic_updates not in ensure_topics(settings):
        assert time.monotonic() < deadline, "the topic was never recreated"
        time.sleep(0.5)  # still marked for deletion

    def ready() -> bool:
        topic = admin.list_topics(settings.topic_updates, timeout=10).topics[settings.topic_updates]
        return topic.error is None and len(topic.partitions) == UPDATE_PARTITIONS

    wait_for(ready, 30, "the new topic's partitions")


def test_a_recreated_topic_is_applied_not_taken_for_redelivery(exact_topics, rclient, consumer_factory):
    settings = exact_topics()
    start = now_ms()
    first = list(generate(seed=25, total=10_000, now_ms=start))
    # new ids, but for `big-set`: produced again within the id window, it is (and must be) dropped
    second = list(generate(seed=26, total=10_000, now_ms=start))
    model_first, model = run_model(first, start), run_model(first + second, start)
    with running_worker(settings):
        produce(settings, first)
        wait_for(lambda: committed_total(settings) == len(first), 60, "the first stream committed")
    assert applied_so_far(rclient, settings) == total_applied(model_first)
    before = fences(rclient, settings)
    recreate_updates_topic(settings)
    assert committed_total(settings) == 0  # the group's offsets went with the old topic
    produce(settings, second)
    with running_worker(settings) as loop:
        wait_for(
            lambda: applied_so_far(rclient, settings) >= total_applied(model), 60, "both streams applied"
        )
        wait_for(lambda: committed_total(settings) == len(second), 30, "the second stream committed")
    counts = event_counts(loop.metrics)
    after = fences(rclient, settings)
    assert {tid for tid, _ in after.values()}.isdisjoint({tid for tid, _ in before.values()})
    # the new offsets overlap the old ones: without the topic id they would look redelivered
    assert any(after[k][1] <= before[k][1] for k in before.keys() & after.keys())
    assert counts["redelivered"] == 0
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
