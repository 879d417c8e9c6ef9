"""Period results, step by step on real Kafka and Redis (worker/results.py): the seal freezes a
closed period against late events the worker's clock still lets in, each declared period is
registered once with its due time, and the emitter sends one record per period whatever point a
predecessor died at: after its commit but before marking it sent, after noting the offset but
before producing, or alive but fenced (a zombie that still thinks it leads). `rankstream periods`
lists what was published, and `--republish` sends the same record again on purpose.
(tests/integration/test_period_results.py runs whole workers, killed and leaving, over days.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition

from common.boards import RESULT_SETTLE_MS, parse_boards
from common.events import Op, UpdateEvent
from common.results import result_key
from common.settings import Settings
from common.store import periodmark
from common.store.encoding import Status
from common.store.keys import BoardKeys, results_due, results_emitter
from rankstream.periods import closed_periods, republish
from rankstream.topics import RESULTS_PARTITIONS, ensure_topics
from tests.helpers import wait_for, worker_env
from worker.apply import Applier
from worker.main import results_emitter as make_emitter
from worker.results import FORGET_MS, UNDECLARED_MS, ResultEmitter

pytestmark = pytest.mark.integration
TZ = ZoneInfo("Asia/Shanghai")
GRACE = 600_000
CONFIG = """
timezone: Asia/Shanghai
types:
  gift:
    windows: [total, hour, day]
    late_grace: 10m
    period_results: {windows: [hour], top: 3}
  plain:
    windows: [total, hour]
  capped:
    windows: [total, hour]
    score_range: [0, 100]
    period_results: {windows: [hour]}
hot:
  - {board: "gift:hot", windows: [total, hour]}
"""


def local_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=TZ).timestamp() * 1000)


HOUR_10 = local_ms("2027-03-01T10:00")  # the hour whose result the tests follow
HOUR_11 = HOUR_10 + 3_600_000
DUE = HOUR_11 + GRACE + RESULT_SETTLE_MS
KEY = result_key("gift:r1", "hour", "2027-03-01T10")


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def ev(n: int, member: str, score: float, ts: int, board: str = "gift:r1") -> tuple[UpdateEvent, int]:
    return UpdateEvent(f"e{n}", board, board.split(":", 1)[0], member, Op.INCR, score, ts, None), ts


@contextmanager
def results_setup(
    make_settings: Callable[..., Settings], path: Path, config: str
) -> Iterator[tuple[Settings, redis.Redis]]:
    """Settings on board config `config` (written to `path`), its topics made and the results
    topic's leaders known, and a Redis client; the test's keys removed after."""
    path.write_text(config)
    settings = make_settings(boards=path)
    ensure_topics(settings)
    wait_for(lambda: leaders_known(settings), 30, "the results topic's partition leaders")
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    try:
        yield settings, client
    finally:
        keys = list(client.scan_iter(match=f"{settings.key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def setup(make_settings: Callable[..., Settings], tmp_path) -> Iterator[tuple[Settings, redis.Redis]]:
    with results_setup(make_settings, tmp_path / "boards.yaml", CONFIG) as got:
        yield got


def emitter(settings: Settings, client: redis.Redis, clock: Clock, owner: str) -> ResultEmitter:
    return make_emitter(settings, client, parse_boards(CONFIG), owner, clock=clock, metrics=None)


def step(emitter: ResultEmitter) -> int:
    """One pass, retried as ResultsThread retries it while Kafka is not ready (a new topic's
    leaders, a coordinator loading): what it settled in the pass that went through."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return emitter.step()
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def records(settings: Settings) -> list[tuple[str, dict[str, object], int]]:
    """(key, value, partition) of every committed record in the results topic."""
    reader = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "check",
                       "enable.partition.eof": True, "isolation.level": "read_committed"})  # fmt: skip
    try:
        meta = reader.list_topics(settings.topic_results, timeout=10).topics[settings.topic_results]
        parts = [TopicPartition(settings.topic_results, p, 0) for p in meta.partitions]
        reader.assign(parts)
        out: list[tuple[str, dict[str, object], int]] = []
        ended: set[int | None] = set()
        while len(ended) < len(parts):
            msg = reader.poll(10)
            assert msg is not None, "the results topic did not reach its end"
            if msg.error() is not None:
                ended.add(msg.partition())
                continue
            out.append(
                (bytes(msg.key() or b"").decode(), orjson.loads(msg.value() or b""), msg.partition() or 0)
            )
        return out
    finally:
        reader.close()


def leaders_known(settings: Settings) -> bool:
    reader = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "check"})
    try:
        for partition in range(RESULTS_PARTITIONS):
            reader.get_watermark_offsets(TopicPartition(settings.topic_results, partition), 5)
    except KafkaException:
        return False
    else:
        return True
    finally:
        reader.close()


def fill(settings: Settings, client: redis.Redis, clock: Clock) -> Applier:
    """Hour 10 of gift:r1: a 4, b 9, c 9 (c later: behind b), d 1; a plain board too."""
    applier = Applier(client, parse_boards(CONFIG), settings.key_prefix, 3600, now_ms=clock, epoch="E")
    applier.apply([ev(1, "a", 4, HOUR_10 + 1), ev(2, "b", 9, HOUR_10 + 2), ev(3, "c", 9, HOUR_10 + 3),
                   ev(4, "d", 1, HOUR_10 + 4), ev(5, "p", 1, HOUR_10 + 5, "plain:x")])  # fmt: skip
    return applier


def test_a_sealed_period_takes_no_more_late_events(setup):
    settings, client = setup
    clock = Clock(HOUR_10 + 60_000)
    applier = fill(settings, client, clock)
    due = client.zrange(results_due(settings.key_prefix), 0, -1, withscores=True)
    assert due == [(KEY.encode(), float(DUE))], "one period of one declared window, due after its grace"

    clock.now = HOUR_11 + GRACE - 1  # the worker still takes late events for hour 10
    (counted,) = applier.apply([ev(6, "d", 10, HOUR_10 + 9)])  # counts: d 11
    assert counted.late_windows == 0
    keys = BoardKeys(settings.key_prefix, "gift:r1")
    assert periodmark.seal(client, keys, "hour:2027-03-01T10", DUE + 3_600_000).state == "sealed"
    (ignored,) = applier.apply([ev(7, "a", 100, HOUR_10 + 10)])  # in grace by the worker's clock
    assert ignored.late_windows == 1  # sealed: hour 10 ignores it (counted late), day and total take it
    rank = f"{settings.key_prefix}{{gift:r1}}:z:hour:2027-03-01T10"
    members = {m.decode()[-1:]: s for m, s in client.zrange(rank, 0, -1, withscores=True)}
    assert members == {"a": 4, "b": 9, "c": 9, "d": 11}
    total = f"{settings.key_prefix}{{gift:r1}}:z:total"
    assert {m.decode()[-1:]: s for m, s in client.zrange(total, 0, -1, withscores=True)}["a"] == 104


def test_one_record_per_period_and_none_for_undeclared(setup):
    settings, client = setup
    clock = Clock(HOUR_10 + 60_000)
    fill(settings, client, clock)
    first = emitter(settings, client, clock, "w1")
    clock.now = DUE - 1
    assert step(first) == 0 and records(settings) == []  # not due yet
    clock.now = DUE
    assert step(first) == 1
    assert step(first) == 0  # settled: nothing due
    (got,) = records(settings)
    assert got[0] == KEY
    assert got[1] == {
        "board": "gift:r1", "window": "hour", "period": "2027-03-01T10", "closed_at": HOUR_11,
        "members": 4, "seq": 4,
        "top": [{"rank": 1, "member": "b", "score": 9}, {"rank": 2, "member": "c", "score": 9},
                {"rank": 3, "member": "a", "score": 4}],
    }  # fmt: skip
    (closed,) = closed_periods(settings, client, "gift:r1", now_ms=DUE)
    assert (closed.window, closed.period.id, closed.state) == ("hour", "2027-03-01T10", "published")
    assert closed.detail.startswith(f"partition {got[2]} offset "), closed.detail

    # on purpose: the same record again, same partition, flagged
    line = republish(settings, "gift:r1", "2027-03-01T10")
    assert "republished gift:r1|hour|2027-03-01T10" in line
    again = records(settings)
    assert len(again) == 2 and again[1][:2] == got[:2] and again[1][2] == got[2]


def _after_commit_before_sent(settings: Settings, client: redis.Redis, clock: Clock) -> None:
    """A leader that died after committing the record, before marking it sent."""
    dead = emitter(settings, client, clock, "dead")
    assert step(dead) == 1
    keys = BoardKeys(settings.key_prefix, "gift:r1")
    sent = periodmark.read_mark(client, keys, "hour:2027-03-01T10")
    client.set(keys.prepared("hour:2027-03-01T10"), periodmark.sending(sent.partition, sent.offset))
    client.zadd(results_due(settings.key_prefix), {KEY: DUE})


def _after_sending_before_produce(settings: Settings, client: redis.Redis, clock: Clock) -> None:
    """A leader that died after noting the partition's end, before producing."""
    keys = BoardKeys(settings.key_prefix, "gift:r1")
    client.set(keys.prepared("hour:2027-03-01T10"), periodmark.sending(0, 0))


@pytest.mark.parametrize("death", [_after_commit_before_sent, _after_sending_before_produce])
def test_a_successor_sends_what_its_predecessor_did_not_and_nothing_it_did(setup, death):
    settings, client = setup
    clock = Clock(HOUR_10 + 60_000)
    fill(settings, client, clock)
    clock.now = DUE
    death(settings, client, clock)
    client.delete(results_emitter(settings.key_prefix))  # its lease lapsed
    successor = emitter(settings, client, clock, "w2")
    assert step(successor) == 1
    assert [k for k, _, _ in records(settings)] == [KEY]
    keys = BoardKeys(settings.key_prefix, "gift:r1")
    assert periodmark.read_mark(client, keys, "hour:2027-03-01T10").state == "sent"
    assert client.zcard(results_due(settings.key_prefix)) == 0


def test_a_fenced_zombie_cannot_commit(setup):
    settings, client = setup
    clock = Clock(HOUR_10 + 60_000)
    fill(settings, client, clock)
    zombie = emitter(settings, client, clock, "zombie")
    assert step(zombie) == 0 and zombie.leading  # leads, nothing due yet
    lease_key = results_emitter(settings.key_prefix)
    client.delete(lease_key)  # paused past its lease
    clock.now = DUE - 1
    successor = emitter(settings, client, clock, "w2")
    assert step(successor) == 0 and successor.leading  # its init_transactions fenced the zombie...
    client.set(lease_key, "zombie")  # ...which wakes while the lease is free again and takes it,
    with pytest.raises(KafkaException):  # seals, notes the offset, and can't commit
        zombie.emit(KEY, DUE)
    keys = BoardKeys(settings.key_prefix, "gift:r1")
    noted = periodmark.read_mark(client, keys, "hour:2027-03-01T10")
    assert noted.state == "sending"
    client.set(lease_key, "w2")
    clock.now = DUE
    assert step(successor) == 1  # finds no committed record from the zombie: sends it
    ((key, _, partition),) = records(settings)
    assert (key, partition) == (KEY, noted.partition)
    sent = periodmark.read_mark(client, keys, "hour:2027-03-01T10")
    assert sent.state == "sent" and sent.offset >= noted.offset  # sent under the noted offset


def test_a_sealed_period_still_reports_its_state_to_hot_boards(setup):
    """On a hot board an event that meets a sealed period (a redelivery, a producer retry) reports
    the period's final state, so a worker that crashed before publishing it to update_cache
    publishes it then. (An event the script refuses, out of the declared range, registered its
    period before the apply: by then it can't tell.)"""
    settings, client = setup
    clock = Clock(HOUR_10 + 60_000)
    applier = Applier(client, parse_boards(CONFIG), settings.key_prefix, 3600, now_ms=clock, epoch="E")
    (refused,) = applier.apply([ev(1, "a", 1000, HOUR_10 + 1, "capped:x")])
    assert refused.status is Status.OUT_OF_RANGE
    capped_key = result_key("capped:x", "hour", "2027-03-01T10")
    assert client.zrange(results_due(settings.key_prefix), 0, -1) == [capped_key.encode()]
    client.delete(results_due(settings.key_prefix))
    (first,) = applier.apply([ev(2, "a", 7, HOUR_10 + 2, "gift:hot")])
    hot_key = result_key("gift:hot", "hour", "2027-03-01T10")
    assert client.zrange(results_due(settings.key_prefix), 0, -1) == [hot_key.encode()]
    periodmark.seal(client, BoardKeys(settings.key_prefix, "gift:hot"), "hour:2027-03-01T10", DUE + 3_600_000)
    (again,) = applier.apply([ev(2, "a", 7, HOUR_10 + 2, "gift:hot")])
    assert again.status is Status.DUPLICATE
    assert again.states == first.states
    state = again.states["hour:2027-03-01T10"]
    assert state is not None and state.score == 7


def test_the_periods_command_refuses_what_it_cannot_do(setup):
    """One line and a non-zero exit: a type without period_results (2), a result not yet
    published (1, nothing produced)."""
    settings, client = setup
    fill(settings, client, Clock(HOUR_10 + 60_000))
    env = worker_env(settings)
    cli = [sys.executable, "-m", "rankstream.cli", "periods"]
    plain = subprocess.run(
        [*cli, "plain:x"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr == "rankstream: board type 'plain' declares no period_results: it emits no results\n"
    early = subprocess.run([*cli, "gift:r1", "--republish", "2027-03-01T10"], env=env, capture_output=True,
                           text=True, timeout=60, check=False)  # fmt: skip
    assert early.returncode == 1, early.stderr
    assert "is not published (none)" in early.stderr and "nothing republished" in early.stderr
    assert records(settings) == []


def test_a_result_no_config_here_declares_waits_then_is_dropped(setup):
    """A due period the emitting worker's config does not declare (a rolling deploy that adds
    period_results) waits for a worker whose config does; once its period ended a week ago it
    is dropped, and a season's, which its name alone does not place, at once."""
    settings, client = setup
    clock = Clock(DUE)
    other = make_emitter(settings, client, parse_boards(f"timezone: {TZ.key}\ntypes: {{gift: {{}}}}"), "w9",
                         clock=clock, metrics=None)  # fmt: skip
    due = results_due(settings.key_prefix)
    season = result_key("gift:r1", "season", "s1")
    client.zadd(due, {KEY: DUE, season: DUE})
    assert step(other) == 1  # the season's: dropped
    assert client.zrange(due, 0, -1, withscores=True) == [(KEY.encode(), float(DUE + UNDECLARED_MS))]
    assert records(settings) == []
    clock.now = HOUR_11 + FORGET_MS + 1
    assert step(other) == 1
    assert client.zcard(due) == 0
