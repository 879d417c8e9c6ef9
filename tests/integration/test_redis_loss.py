"""Redis losing data under the worker (worker/sources.py): restored from a backup, killed -9 with its
append-only file, flushed. The worker never applies onto a Redis that lacks what Kafka's commits
say was applied: it blocks (readyz, metric, log line) until `rankstream recover` or
`rankstream accept-redis`; afterwards Redis equals the oracle's model exactly."""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
import redis
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from common.settings import Settings
from common.store.encoding import text
from common.store.keys import partition_sources
from rankstream.recover import accept_redis, recover
from rankstream.stack import LocalRedis, free_port
from rankstream.topics import UPDATE_PARTITIONS
from tests.helpers import applied_so_far, check_dlq, running_worker, wait_for, worker_env
from tests.integration.test_worker_oracle import ROOT
from tests.oracle import BOARDS, ORACLE_BOARDS, Message, Model, compare_redis, generate, now_ms, run_model
from worker.apply import Applier
from worker.sources import commits_reader, group_commits

pytestmark = [pytest.mark.integration, pytest.mark.slow]
Where = list[tuple[int, int]]  # each produced message's (partition, offset)


@pytest.fixture
def store(tmp_path) -> Iterator[LocalRedis]:
    """The test's own Redis, as `rankstream dev` runs it (devstack.py: persist=True, AOF on)."""
    server = LocalRedis("redis", tmp_path / "redis", port=free_port(), persist=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(make_settings, tmp_path, store) -> Settings:
    """Overrides conftest's: the oracle's boards on the private Redis (`topics`, `rclient` and
    `consumer_factory` follow)."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    built: Settings = make_settings(boards=boards, redis_url=store.url)
    return built


class Worker:
    """`rankstream worker` as a subprocess, its probes on a known port, its JSON log (stderr) kept."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.port, self.log = free_port(), log
        with log.open("ab") as out:
            argv = [sys.executable, "-m", "rankstream.cli", "worker"]
            env = worker_env(settings, http_port=self.port)
            self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:  # 503: not ready, the body says why
            with exc:
                return int(exc.code), exc.read()
        except OSError:  # not listening yet
            return 0, b""

    def readyz(self) -> tuple[int, dict[str, Any]]:
        status, body = self.get("/readyz")
        return status, orjson.loads(body) if body else {}

    def blocked_gauge(self) -> dict[tuple[str, str, str], float]:
        """rankstream_worker_partition_blocked: (partition, reason, board) -> value."""
        _, body = self.get("/metrics")
        return {
            (s.labels["partition"], s.labels["reason"], s.labels["board"]): s.value
            for family in text_string_to_metric_families(body.decode())
            if family.name == "rankstream_worker_partition_blocked"
            for s in family.samples
        }

    def logged(self, prefix: str) -> list[dict[str, Any]]:
        lines = [orjson.loads(x) for x in self.log.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if str(x.get("msg", "")).startswith(prefix)]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log.read_text()[-2000:]

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def produce_tracked(settings: Settings, messages: list[Message], every: int = 0, pause_s: float = 0) -> Where:
    """Produce in order (a pause after every `every` messages); each message's (partition, offset)."""
    where: Where = [(-1, -1)] * len(messages)
    errors: list[object] = []
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})

    def delivered(i: int, err: object, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            where[i] = (msg.partition(), msg.offset())

    for i, msg in enumerate(messages):
        producer.produce(
            settings.topic_updates, msg.value, key=msg.key, on_delivery=functools.partial(delivered, i)
        )
        if every and i % every == every - 1:
            producer.flush(10)
            time.sleep(pause_s)
    assert producer.flush(30) == 0 and not errors, errors
    return where


@dataclass
class Stream:
    """A paced production in a thread: `where` fills in when every message is delivered."""

    where: Where
    gate: threading.Event

    def release(self) -> None:
        """Let the held part go (a test does this once what it needed mid-stream has happened)."""
        self.gate.set()


@contextmanager
def producing(settings: Settings, messages: list[Message], every: int, pause_s: float) -> Iterator[Stream]:
    """Paced production in a thread while the block runs; the second half of `messages` is held
    until the block calls `release()` (or leaves), so whatever the block does while waiting for
    the worker happens mid-stream however fast or slow this machine is; afterwards every message
    is delivered."""
    held = len(messages) // 2
    stream = Stream([], threading.Event())

    def run() -> None:
        first = produce_tracked(settings, messages[:held], every, pause_s)
        stream.gate.wait(120)
        stream.where.extend(first + produce_tracked(settings, messages[held:], every, pause_s))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stream
    finally:
        stream.release()
    thread.join(60)
    assert len(stream.where) == len(messages), "the producer thread failed"


def committed(settings: Settings) -> dict[int, tuple[int, str | None]]:
    """The group's committed offsets (partition -> (offset, metadata)), as an operator reads them
    (`rankstream recover`; not through the admin client, see worker/sources.py)."""
    reader = commits_reader(settings)
    try:
        return group_commits(reader, settings.topic_updates, list(range(UPDATE_PARTITIONS)))
    finally:
        reader.close()


def committed_count(settings: Settings) -> int:
    return sum(offset for offset, _ in committed(settings).values())  # = messages committed (new topic)


def sources(client: redis.Redis, settings: Settings) -> dict[str, str]:
    key = partition_sources(settings.key_prefix, settings.worker_group, settings.topic_updates)
    return {str(text(k)): str(text(v)) for k, v in client.hgetall(key).items()}


def board_keys(client: redis.Redis, settings: Settings) -> dict[bytes, bytes | None]:
    """Every board key (sources and owners records aside) with its serialized value."""
    keys = [k for b in BOARDS for k in client.scan_iter(match=f"{settings.key_prefix}{{{b}}}:*", count=1000)]
    return {k: client.dump(k) for k in sorted(keys)}


def model_from(messages: list[Message], where: Where, start: int, floor: dict[int, int]) -> Model:
    """The model of the messages at offsets >= floor[partition]."""
    return run_model([m for m, (p, o) in zip(messages, where, strict=True) if o >= floor.get(p, 0)], start)


def total(model: Model) -> int:
    return sum(model.seq.values())


def assert_blocked(worker: Worker, reason: str) -> dict[str, str]:
    """readyz not ready naming the blocked partitions, the gauge at 1, an ERROR line naming a board."""
    seen: dict[str, Any] = {}

    def agree() -> bool:
        """readyz and the gauge name the same partitions (they block one batch at a time, so
        both are read again until a moment they agree)."""
        status, body = worker.readyz()
        if not body.get("blocked"):
            return False
        assert status == 503 and body["ok"] is False and set(body["blocked"].values()) == {reason}, body
        gauge = worker.blocked_gauge()
        seen["blocked"] = body["blocked"]
        return {p for (p, r, _), v in gauge.items() if r == reason and v == 1} == set(body["blocked"])

    wait_for(agree, 20, f"blocked partitions ({reason}) alike in readyz and the gauge")
    blocked: dict[str, str] = seen["blocked"]
    # a check while idle says so at once; the partition's next batch names the board it was for
    named = lambda: any(x["board"] in BOARDS for x in worker.logged("partition blocked"))  # noqa: E731
    wait_for(named, 20, "a log line naming a board the operator knows")
    logged = lambda: {str(x["partition"]) for x in worker.logged("partition blocked")} >= set(blocked)  # noqa: E731
    wait_for(logged, 20, "a log line for each blocked partition")
    lines = worker.logged("partition blocked")
    assert all(x["level"] == "error" and x["reason"] == reason for x in lines), lines
    return blocked


def assert_unblocked(worker: Worker) -> None:
    status, body = worker.readyz()
    assert status == 200 and body["blocked"] == {}, body
    assert not any(worker.blocked_gauge().values())


def wait_settled(done: Callable[[], bool], stuck: Callable[[], object], what: str) -> None:
    """Until `done()`; fails at once, with the evidence, when `stuck()` finds something."""
    found: list[object] = [None]

    def settled() -> bool:
        found[0] = stuck()
        return bool(found[0]) or done()

    wait_for(settled, 30, what)
    assert not found[0], found[0]


def test_backup_restore_then_recover_is_exact(topics, store, rclient, consumer_factory, tmp_path):
    settings, start = topics, now_ms()
    messages = list(generate(seed=21, total=7000, now_ms=start))
    first, late = messages[: len(messages) * 4 // 5], messages[len(messages) * 4 // 5 :]
    with Worker(settings, tmp_path / "w1.log") as w1:
        with producing(settings, first, every=100, pause_s=0.05) as stream:
            goal = total(run_model(first, start)) * 0.4
            wait_for(lambda: applied_so_far(rclient, settings) > goal, 60, "40% applied")
            rclient.save()  # the backup, taken mid-stream while the worker applies
            stream.release()
            backup = tmp_path / "backup"
            backup.mkdir()
            shutil.copy(store.folder / "dump.rdb", backup / "dump.rdb")
        where = stream.where
        wait_for(lambda: committed_count(settings) == len(first), 60, "the first part committed")
        w1.stop()
    # restore: the same port, a Redis that loads the backup's RDB and nothing else (no AOF)
    store.stop()
    store.folder, store.persist = backup, False
    store.start()
    rclient.connection_pool.disconnect()
    assert applied_so_far(rclient, settings) < total(run_model(first, start)), "the backup came too late"
    recorded = {
        int(p): int(v.rpartition("|")[2]) for p, v in sources(rclient, settings).items() if p.isdigit()
    }
    held = board_keys(rclient, settings)
    with Worker(settings, tmp_path / "w2.log") as w2:
        # Redis is checked before a batch: idle, this worker reports ready on the restored Redis
        # (observed); traffic goes on, the worker checks Redis and blocks
        where += produce_tracked(settings, late)
        blocked = assert_blocked(w2, "redis_behind")
        time.sleep(2)
        assert board_keys(rclient, settings) == held, "a blocked worker changed Redis"
        assert committed_count(settings) == len(first)
        w2.stop()
    lines = recover(settings)
    assert all(f"partition {p}:" in "\n".join(lines) for p in blocked), lines
    with Worker(settings, tmp_path / "w3.log") as w3:
        wait_for(lambda: committed_count(settings) == len(messages), 60, "everything committed")
        assert_unblocked(w3)
        w3.stop()
    model = run_model(messages, start)
    compare_redis(rclient, settings.key_prefix, model)
    # Dead letters of the replayed range (after the offset the backup recorded, before the commit
    # recover rewound): at c6910bd each went out twice (bad events and score_out_of_range alike);
    # since 7647a79 recover notes the old commit and the workers don't send them again: exactly once.
    replayed = [m for m, (p, o) in zip(first, where, strict=False) if o > recorded.get(p, -1)]
    assert sum(len(m.bad) for m in replayed) > 10, "the replayed range lacks bad events"
    check_dlq(consumer_factory, settings, model, exact=True)


def test_fresh_start_then_redis_kill_9_with_aof_recovers_by_itself(
    topics, store, rclient, consumer_factory, tmp_path
):
    settings, start = topics, now_ms()
    messages = list(generate(seed=22, total=7000, now_ms=start))
    first, second = messages[: len(messages) // 2], messages[len(messages) // 2 :]
    model = run_model(messages, start)
    with Worker(settings, tmp_path / "w.log") as worker:
        with producing(settings, first, every=100, pause_s=0.05) as stream:
            part = total(run_model(first, start))
            wait_for(lambda: applied_so_far(rclient, settings) > part * 0.3, 60, "30% applied")
            epoch = sources(rclient, settings).get("epoch")  # a fresh deployment starts one, unblocked
            assert epoch and worker.readyz()[0] == 200
            assert store.proc is not None
            store.proc.kill()  # SIGKILL mid-stream: what it acknowledged is in the append-only file
            store.proc.wait(10)
            stream.release()  # the rest of the first part arrives while Redis is down
        produce_tracked(settings, second)
        wait_for(lambda: worker.readyz()[1].get("redis") is False, 30, "the worker reporting Redis down")
        store.start()  # the same folder: the AOF is replayed
        rclient.connection_pool.disconnect()
        wait_for(lambda: committed_count(settings) == len(messages), 60, "everything committed")
        assert_unblocked(worker)
        assert worker.logged("partition blocked") == []
        worker.stop()
    assert sources(rclient, settings)["epoch"] == epoch
    assert {metadata for _, metadata in committed(settings).values()} == {epoch}  # commits carry it
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)


def test_flushall_blocks_until_accept_redis(topics, store, rclient, tmp_path):
    settings, start = topics, now_ms()
    messages = list(generate(seed=23, total=5000, now_ms=start))
    first, rest = messages[:1500], messages[1500:]
    with Worker(settings, tmp_path / "w.log") as worker:
        where = produce_tracked(settings, first)
        wait_for(lambda: committed_count(settings) == len(first), 60, "the first part committed")
        with producing(settings, rest, every=50, pause_s=0.05) as stream:
            wait_for(lambda: committed_count(settings) > len(first) + 300, 30, "the worker applying the rest")
            rclient.flushall()  # under the running worker, while events keep coming
            stream.release()
        where += stream.where
        assert_blocked(worker, "redis_lost")
        raced = board_keys(rclient, settings)  # from a batch checked before the flush, applied after
        time.sleep(2)
        assert board_keys(rclient, settings) == raced, "a blocked worker changed Redis"
        print(f"board keys written into the flushed Redis (race): {len(raced)}")  # for the report (-s)
        at_accept = {p: offset for p, (offset, _) in committed(settings).items()}
        accept_redis(settings)
        wait_for(lambda: worker.readyz()[0] == 200, 60, "the worker resuming after accept-redis")
        assert_unblocked(worker)
        wait_settled(
            lambda: committed_count(settings) == len(messages),
            lambda: {
                x["partition"]: x["detail"]
                for x in worker.logged("partition blocked")
                if x["reason"] == "epoch_mismatch"
            },
            "everything after accept-redis committed",
        )
        assert_unblocked(worker)
        worker.stop()
    if raced:  # part of a batch landed after the flush: which part is unknown, see the next test
        return
    model = model_from(messages, where, start, at_accept)
    assert total(model) > 0
    compare_redis(rclient, settings.key_prefix, model)


def test_batch_in_flight_during_flushall_then_accept_redis(topics, store, rclient):
    """Test 3's race made certain: FLUSHALL lands after the worker checked Redis and before the
    batch's scripts run. That batch writes into the empty Redis (with the old epoch) and commits;
    the next blocks (redis_lost). After accept-redis Redis holds that batch and everything after
    it: exactly the messages from the commits before the flush on."""
    settings, start = topics, now_ms()
    messages = list(generate(seed=25, total=3000, now_ms=start))
    n = len(messages) // 3
    first, second, third = messages[:n], messages[n : 2 * n], messages[2 * n :]
    where = produce_tracked(settings, first)
    flushed: list[bool] = []
    real = Applier.apply_isolated

    def flush_then_apply(self: Applier, *args: Any, **kwargs: Any) -> Any:
        if not flushed:
            flushed.append(rclient.flushall())
        return real(self, *args, **kwargs)

    with running_worker(settings) as loop:
        assert loop.guard is not None
        wait_for(lambda: committed_count(settings) == len(first), 60, "the first part committed")
        before = {p: offset for p, (offset, _) in committed(settings).items()}
        with mock.patch.object(Applier, "apply_isolated", flush_then_apply):
            where += produce_tracked(settings, second)
            wait_for(lambda: committed_count(settings) > len(first), 20, "the batch in flight committed")
        assert flushed and board_keys(rclient, settings), "the batch in flight wrote nothing after the flush"
        where += produce_tracked(settings, third)  # more events, for the boards that batch wrote too
        guard = loop.guard
        wait_for(lambda: bool(guard.blocked), 20, "partitions blocked")
        assert {b.reason for b in guard.blocked.values()} == {"redis_lost"}
        accept_redis(settings)
        wait_settled(
            lambda: committed_count(settings) == len(messages),
            lambda: {p: b for p, b in guard.blocked.items() if b.reason == "epoch_mismatch"},
            "everything after accept-redis committed",
        )
    compare_redis(rclient, settings.key_prefix, model_from(messages, where, start, before))
