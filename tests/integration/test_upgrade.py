"""Upgrade while producing: the previous release (per-event `:id:` dedupe keys, no fences, commits
without metadata) applies part of a stream and is killed -9 with a batch applied but not
committed; the new release adopts its Redis (an epoch, `legacy_until`), keeps producing, and ends
exactly at the model: the redelivered tail and producer retries of ids the old release applied
are caught by the old `:id:` keys, each bad event is dead-lettered once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from common.settings import Settings
from common.store.keys import partition_sources
from rankstream.stack import free_port
from tests.helpers import (
    applied_so_far,
    check_dlq,
    http_status,
    stop_workers,
    wait_applied_and_committed,
    wait_for,
    worker_env,
)
from tests.integration.test_worker_oracle import total_applied, worker_process
from tests.oracle import BOARDS, ORACLE_BOARDS, Message, compare_redis, generate, now_ms, run_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 24_000


def previous_release(dest: Path) -> Path:
    """The tree of the release before offset fences: the parent of the commit adding idwindow.lua."""
    log = ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--", "common/lua/idwindow.lua"]
    added = subprocess.run(log, capture_output=True, text=True, check=True).stdout.split()
    assert added, "no git history of common/lua/idwindow.lua: the upgrade test needs a full clone"
    release_tree(f"{added[-1]}^", dest)
    assert not (dest / "common" / "lua" / "idwindow.lua").exists()
    return dest


def release_tree(commit: str, dest: Path) -> Path:
    """The tree of `commit`, extracted to `dest`."""
    tree = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tree, check=True)
    return dest


def old_worker(
    settings: Settings, release: Path, log: Path, worker_id: str = "pod-a"
) -> subprocess.Popen[bytes]:
    """`rankstream worker` of an earlier release: its tree is cwd and PYTHONPATH, so its modules
    shadow the editable install of this one."""
    # the release before offset fences refuses settings it does not know: the results topic and
    # the dead-letter replay ledger
    unknown = ("PYTHON", "RANKSTREAM_TOPIC_RESULTS", "RANKSTREAM_TOPIC_DLQ_REPLAYED")
    env = {k: v for k, v in worker_env(settings, worker_id=worker_id).items() if not k.startswith(unknown)}
    env["PYTHONPATH"] = str(release)
    argv = [sys.executable, "-m", "rankstream.cli", "worker"]
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, cwd=release, stdout=out, stderr=subprocess.STDOUT)


def produce(settings: Settings, messages: list[Message], pace_s: float = 0.0) -> list[tuple[int, int]]:
    """Produce in order (paced in chunks of 400 when `pace_s`); returns each (partition, offset)."""
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20, "enable.idempotence": True}
    )
    where: list[tuple[int, int]] = [(-1, -1)] * len(messages)

    def report(i: int):
        return lambda err, msg: where.__setitem__(i, (msg.partition(), msg.offset()))

    for i, msg in enumerate(messages):
        producer.produce(settings.topic_updates, msg.value, key=msg.key, on_delivery=report(i))
        if i % 400 == 399:
            producer.poll(0)
            time.sleep(pace_s)
    assert producer.flush(30) == 0
    return where


def committed(settings: Settings) -> dict[int, tuple[int, str | None]]:
    """The group's committed (next offset, metadata) per partition, without joining the group."""
    conf = {"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.worker_group}
    reader = Consumer({**conf, "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    try:
        topic = settings.topic_updates
        parts = reader.list_topics(topic, timeout=10).topics[topic].partitions
        found = reader.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: (tp.offset, tp.metadata) for tp in found}
    finally:
        reader.close()


def freeze_in_gap(
    old: subprocess.Popen[bytes],
    log: Path,
    *,
    rclient: redis.Redis,
    settings: Settings,
    sent: list[Message],
    where: list[tuple[int, int]],
    start: int,
    after: float,
) -> tuple[int, list[Message]]:
    """SIGSTOP the worker as soon as Redis moves past `after` until Redis holds more than the
    group committed; returns what Redis holds (events applied) and the committed messages."""
    seen = after
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert old.poll() is None, f"the previous release died: {log.read_text()[-2000:]}"
        if applied_so_far(rclient, settings) <= seen:
            time.sleep(0.001)
            continue
        old.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # what it sent before it froze lands
        applied, offsets = applied_so_far(rclient, settings), committed(settings)
        assert all(not md for _, md in offsets.values()), "commits with metadata: not the previous release"
        done = [m for m, (p, o) in zip(sent, where, strict=True) if o < offsets.get(p, (-1, None))[0]]
        if total_applied(run_model(done, start)) < applied:
            return applied, done
        seen = applied
        old.send_signal(signal.SIGCONT)
    raise AssertionError("never caught the previous release with a batch applied but not committed")


def test_upgrade_from_the_previous_release_while_producing(
    topics, make_settings, tmp_path, rclient, consumer_factory
):
    (tmp_path / "boards.yaml").write_text(ORACLE_BOARDS)
    settings: Settings = make_settings(boards=tmp_path / "boards.yaml")
    prefix = settings.key_prefix
    release = previous_release(tmp_path / "previous")
    start = now_ms()
    stream = list(generate(7, EVENTS, start))
    part_a, part_b = stream[: len(stream) * 2 // 3], stream[len(stream) * 2 // 3 :]
    where = produce(settings, part_a)
    target_a = total_applied(run_model(part_a, start))

    # 1. the previous release applies part of the backlog and is killed -9 with a batch applied
    # but not committed: frozen (SIGSTOP) just after Redis moved, until Kafka shows the gap
    log = tmp_path / "previous.log"
    old = old_worker(settings, release, log)
    try:
        applied, done = freeze_in_gap(
            old,
            log,
            rclient=rclient,
            settings=settings,
            sent=part_a,
            where=where,
            start=start,
            after=target_a * 0.4,
        )
    finally:
        old.kill()
        old.wait(10)
    assert applied < target_a, "the kill came too late to test anything"
    assert next(rclient.scan_iter(match=f"{prefix}*:id:*", count=1000), None) is not None
    assert not list(rclient.scan_iter(match=f"{prefix}*:fence", count=1000)), "the new release ran"
    retries = [m for m in done if m.valid and not m.bad][::7][:300]  # applied and committed by the old
    assert len(retries) >= 50
    rest: list[Message] = []
    for i, msg in enumerate(part_b):
        rest.append(msg)
        if i % 20 == 0 and retries:
            rest.append(retries.pop())
    model = run_model(part_a + rest, start)

    # 2. the new release takes over (same pod name) while the rest is produced
    port = free_port()
    new = worker_process(settings, http_port=port, worker_id="pod-a")
    try:
        produce(settings, rest, pace_s=0.1)
        wait_for(lambda: applied_so_far(rclient, settings) >= total_applied(model), 90, "every event applied")
        assert new.poll() is None
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        blocked = [ln for ln in metrics.splitlines() if ln.startswith("rankstream_worker_partition_blocked{")]
        assert all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in blocked), blocked
    finally:
        new.send_signal(signal.SIGTERM)
        assert new.wait(30) == 0

    # 3. exact: each unique id once, each bad event dead-lettered once
    compare_redis(rclient, prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
    key = partition_sources(prefix, settings.worker_group, settings.topic_updates)
    sources = {k.decode(): v.decode() for k, v in rclient.hgetall(key).items()}
    assert sources.get("epoch"), sources
    assert int(sources["legacy_until"]) > time.time() * 1000, sources
    boards_after = {m.key.decode() for m in part_b if m.valid}
    for board in sorted(boards_after & set(BOARDS)):
        assert rclient.hget(f"{prefix}{{{board}}}:fence", "e") == sources["epoch"].encode(), board


RELEASE_0_1_0 = "cba386c"  # every event decided in Redis by apply.lua


def test_rolling_update_from_0_1_0_while_producing(
    topics, make_settings, tmp_path, rclient, consumer_factory
):
    """A rolling update from 0.1.0 while events flow: a 0.1.0 worker applies, a new one joins and
    takes half the partitions (both write, each release its own way: the new worker must see the
    old one's writes on boards it keeps a state of), the old one leaves, its replacement is new.
    Ends exactly at the model; each bad event dead-lettered once."""
    (tmp_path / "boards.yaml").write_text(ORACLE_BOARDS)
    settings: Settings = make_settings(boards=tmp_path / "boards.yaml")
    release = release_tree(RELEASE_0_1_0, tmp_path / "0.1.0")
    start = now_ms()
    stream = list(generate(11, EVENTS, start))
    model = run_model(stream, start)
    target = total_applied(model)
    thirds = [
        stream[: len(stream) // 3],
        stream[len(stream) // 3 : 2 * len(stream) // 3],
        stream[2 * len(stream) // 3 :],
    ]
    old = old_worker(settings, release, tmp_path / "0.1.0.log")
    new_b = new_a = None
    try:
        produce(settings, thirds[0], pace_s=0.05)
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.15, 90, "0.1.0 applying")
        new_b = worker_process(settings, worker_id="pod-b")  # joins: partitions split between releases
        produce(settings, thirds[1], pace_s=0.05)
        wait_for(lambda: applied_so_far(rclient, settings) > target * 0.5, 90, "half applied")
        assert old.poll() is None, (tmp_path / "0.1.0.log").read_text()[-2000:]
        old.send_signal(signal.SIGTERM)  # rolled: its replacement runs this release
        try:
            assert old.wait(settings.shutdown_deadline_s + 10) == 0
        except subprocess.TimeoutExpired:  # its own deadline did not end it: what was it doing?
            raise AssertionError((tmp_path / "0.1.0.log").read_text()[-6000:]) from None
        new_a = worker_process(settings, worker_id="pod-a")
        produce(settings, thirds[2], pace_s=0.05)
        wait_applied_and_committed(rclient, settings, target)
    finally:
        stop_workers(new_a, new_b)
        if old.poll() is None:
            old.kill()
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
