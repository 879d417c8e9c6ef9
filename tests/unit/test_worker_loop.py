"""The worker loop and the applier as pure logic: stub Kafka messages, a stub consumer, a stub
transactional producer and a stub apply.lua (tests/unit/stubs.py). No broker, no Redis.

Covered: a board's events reach the script in stream order (also across chunks and round trips),
the per-call limits, narrowing of a failed chunk, infrastructure errors that rewind instead of
dead-lettering, poison messages dead-lettered once while the rest commits, the rewind to the
earliest offset of every batch fetched, refused commits, the dead-letter size rule, Kafka
timestamps standing in for `ts`, and the shutdown deadline with a Redis that does not answer."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
import redis
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from redis._parsers.base import BaseParser

import worker.consumer as consumer_module
import worker.outputs as outputs_module
from common.boards import WindowKind, parse_boards
from common.deadline import Deadline
from common.errors import BadEvent, InfrastructureError
from common.events import MIN_TS_MS, Op, Reason, UpdateEvent, parse_message
from common.periods import period_at
from common.store.encoding import MemberState, Status
from common.store.keys import TOTAL_INSTANCE
from common.windows import Window
from tests.unit.stubs import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    UPDATES_TOPIC,
    ConsumerStub,
    MessageStub,
    ProducerStub,
    Record,
    ScriptStub,
    SentCall,
    SinkStub,
    explode_periods,
    fail_member,
    install_script,
    kafka_exception,
    unused_redis,
)
from worker.apply import MAX_EVENTS_PER_CALL, MAX_INSTANCES_PER_CALL, Applier, Outcome
from worker.consumer import WorkerLoop, exit_reserve
from worker.dlq import (
    HEADER_ERROR_CLASS,
    HEADER_ERROR_TEXT,
    HEADER_INDEX,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_ORIGINAL_SIZE,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
    HEADER_TRUNCATED,
    TRUNCATED_BYTES,
    DeadLetters,
)
from worker.metrics import WorkerMetrics
from worker.outputs import ProducerFenced, TransactionalOutputs
from worker.results import ResultEmitter, ResultsThread
from worker.rolling import PreparerThread, RollingPreparer

pytestmark = pytest.mark.timeout(30)

BOARDS = parse_boards(
    """
timezone: UTC
types:
  gift: {windows: [total, hour], retention: {hour: 2000}}
  level: {windows: [total]}
hot:
  - {board: "gift:hot", windows: [total, hour]}
"""
)
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00Z: the applier's "now", so every period is open
HOUR_MS = 3_600_000
DLQ_TOPIC = "updates.dlq"
SKEW_S = 86_400
BOOM = "ERR user_script:1: boom"


def hour_instance(ts: int) -> str:
    period = period_at(Window("hour", WindowKind.HOUR), ts, BOARDS.timezone)
    assert period is not None
    return f"hour:{period.id}"


# --- building events and messages -----------------------------------------------------------------


def event(
    eid: str, board: str, member: str = "m", score: float = 1, ts: int | None = BASE_MS
) -> dict[str, Any]:
    fields: dict[str, Any] = {"id": eid, "board": board, "member": member, "score": score}
    if ts is not None:
        fields["ts"] = ts
    return fields


def value(*events: dict[str, Any]) -> bytes:
    """One event as an object, several as a JSON array."""
    return orjson.dumps(events[0] if len(events) == 1 else list(events))


def msg(
    *events: dict[str, Any],
    offset: int,
    partition: int = 0,
    timestamp: tuple[int, int] = (TIMESTAMP_CREATE_TIME, BASE_MS),
) -> MessageStub:
    return MessageStub(value(*events), offset=offset, partition=partition, timestamp=timestamp)


def update(eid: str, board: str, member: str = "m", ts: int = BASE_MS) -> tuple[UpdateEvent, int]:
    board_type = board.split(":", 1)[0]
    return UpdateEvent(eid, board, board_type, member, Op.INCR, 1.0, ts, None), ts


def make_applier(script: ScriptStub, now_ms: int = BASE_MS) -> Applier:
    applier = Applier(unused_redis(), BOARDS, "t:", 60_000, now_ms=lambda: now_ms)
    install_script(applier, script)
    return applier


def of_board(calls: Sequence[SentCall], board: str) -> list[SentCall]:
    return [c for c in calls if c.board == board]


def ids_of(outcomes: Sequence[Outcome], board: str) -> list[str]:
    return [o.event.id for o in outcomes if o.event.board == board]


# --- the loop with stubs --------------------------------------------------------------------------


@dataclass
class Rig:
    loop: WorkerLoop
    consumer: ConsumerStub
    producer: ProducerStub
    script: ScriptStub
    applier: Applier
    metrics: WorkerMetrics
    deadline: Deadline

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    @property
    def dead_letters(self) -> list[Record]:
        return [r for r in self.producer.committed_records if r.topic == DLQ_TOPIC]


RigFactory = Callable[..., Rig]


@pytest.fixture
def rig() -> Iterator[RigFactory]:
    """Builds a loop wired like worker/main.py's build_loop, over stubs. When the consumer's
    batches run out the loop is asked to stop (the test's SIGTERM)."""
    made: list[Rig] = []

    def build(
        batches: Sequence[Sequence[MessageStub]] = (),
        *,
        script: ScriptStub | None = None,
        producer: ProducerStub | None = None,
        on_poll: Callable[[int], None] | None = None,
        stop_when_done: bool = True,
        dlq_limit: int = 1_000_000,
    ) -> Rig:
        deadline = Deadline()
        consumer = ConsumerStub(
            batches, on_exhausted=(lambda: deadline.start(5.0)) if stop_when_done else None, on_poll=on_poll
        )
        producer = producer or ProducerStub()
        script = script or ScriptStub()
        applier = make_applier(script)
        outputs = TransactionalOutputs(producer.as_producer, deadline)
        metrics = WorkerMetrics()
        loop = WorkerLoop(
            consumer=consumer.as_consumer(),
            boards=BOARDS,
            applier=applier,
            outputs=outputs,
            dead_letters=DeadLetters(outputs, DLQ_TOPIC, dlq_limit),
            metrics=metrics,
            deadline=deadline,
            batch_size=1000,
            batch_timeout_s=0.01,
            max_future_skew_s=SKEW_S,
            shutdown_deadline_s=5.0,
        )
        made.append(Rig(loop, consumer, producer, script, applier, metrics, deadline))
        return made[-1]

    yield build
    for r in made:
        if r.script.block is not None:
            r.script.block.set()
        with contextlib.suppress(ProducerFenced):
            r.loop.close()


# ==================================================================================================
# Ordering, chunking, rounds
# ==================================================================================================


def test_each_boards_events_reach_the_script_in_stream_order_in_one_round_trip():
    script = ScriptStub()
    boards = ["gift:a", "level:b", "gift:c"]
    pairs = [update(f"e{i}", boards[i * 7 % 3], member=f"m{i % 4}") for i in range(30)]

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    assert failures == []
    assert len(script.round_trips) == 1
    (trip,) = script.round_trips
    assert sorted(c.board for c in trip) == sorted(boards)  # one call per board
    for board in boards:
        expected = [e.id for e, _ in pairs if e.board == board]
        (call,) = of_board(trip, board)
        assert call.ids == expected
        assert [e.member for e in call.events] == [e.member for e, _ in pairs if e.board == board]
        assert ids_of(outcomes, board) == expected
        assert [o.seq for o in outcomes if o.event.board == board] == list(range(1, len(expected) + 1))
    assert {o.status for o in outcomes} == {Status.APPLIED}


@pytest.mark.parametrize(
    ("count", "expected_calls"),
    [(MAX_EVENTS_PER_CALL, [500]), (MAX_EVENTS_PER_CALL + 1, [500, 1]), (1201, [500, 500, 201])],
)
def test_at_most_500_events_per_call_and_a_boards_chunks_in_successive_round_trips(count, expected_calls):
    script = ScriptStub()
    big = [update(f"big{i}", "level:big", member=f"m{i % 13}") for i in range(count)]
    small = [update(f"small{i}", "level:small") for i in range(10)]
    pairs = [*big[:5], *small, *big[5:]]  # another board interleaved

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    assert failures == []
    big_calls = of_board(script.calls, "level:big")
    assert [len(c.events) for c in big_calls] == expected_calls
    assert max(len(c.events) for c in script.calls) <= MAX_EVENTS_PER_CALL
    # stream order across the chunks, and each chunk in its own round trip
    assert [i for c in big_calls for i in c.ids] == [e.id for e, _ in big]
    assert len(script.round_trips) == len(expected_calls)
    for trip in script.round_trips:
        assert len(of_board(trip, "level:big")) == 1
    # the other board rides along in the first round trip
    assert of_board(script.round_trips[0], "level:small")[0].ids == [e.id for e, _ in small]
    assert ids_of(outcomes, "level:big") == [e.id for e, _ in big]
    assert [o.seq for o in outcomes if o.event.board == "level:big"] == list(range(1, count + 1))


@pytest.mark.parametrize(
    ("hours", "expected_events", "expected_instances"),
    [
        (MAX_INSTANCES_PER_CALL - 1, [47], [48]),  # total + 47 hours: exactly the limit
        (MAX_INSTANCES_PER_CALL, [47, 1], [48, 2]),
        (100, [47, 47, 6], [48, 48, 7]),
    ],
)
def test_at_most_48_instances_per_call(hours, expected_events, expected_instances):
    script = ScriptStub()
    pairs = [update(f"e{i}", "gift:a", ts=BASE_MS + i * HOUR_MS + 1) for i in range(hours)]

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    assert failures == []
    calls = script.calls
    assert [len(c.events) for c in calls] == expected_events
    assert [len(c.instances) for c in calls] == expected_instances
    assert all(len(c.instances) <= MAX_INSTANCES_PER_CALL for c in calls)
    assert len(script.round_trips) == len(calls)  # one chunk of a board per round trip
    assert [i for c in calls for i in c.ids] == [e.id for e, _ in pairs]
    for call in calls:
        for sent in call.events:  # each event counts in total and its own hour, nothing else
            assert sent.instances == (TOTAL_INSTANCE, hour_instance(sent.ts))
        assert all(expire > BASE_MS for expire in call.expires[1:]) and call.expires[0] == 0
    assert ids_of(outcomes, "gift:a") == [e.id for e, _ in pairs]


def test_events_in_hours_a_chunk_already_holds_do_not_start_a_new_chunk():
    script = ScriptStub()
    first = [update(f"a{i}", "gift:a", ts=BASE_MS + i * HOUR_MS) for i in range(47)]
    again = [update(f"b{i}", "gift:a", ts=BASE_MS + i * HOUR_MS + 5) for i in range(47)]

    make_applier(script).apply_isolated([*first, *again])

    (call,) = script.calls
    assert len(call.instances) == 48 and len(call.events) == 94


# ==================================================================================================
# Narrowing a failed chunk; infrastructure errors
# ==================================================================================================


def test_a_failed_chunk_is_narrowed_one_event_at_a_time_in_order():
    boom = redis.ResponseError(BOOM)
    script = ScriptStub(failer=fail_member("poison", boom))
    members = ["m0", "m1", "poison", "m3", "poison", "m5"]
    pairs = [update(f"e{i}", "gift:a", member=m) for i, m in enumerate(members)]
    others = [update(f"o{i}", "level:b") for i in range(3)]

    outcomes, failures = make_applier(script).apply_isolated([*pairs, *others])

    first, *singles = script.round_trips
    assert [(c.board, c.ids) for c in first] == [
        ("gift:a", [f"e{i}" for i in range(6)]),
        ("level:b", ["o0", "o1", "o2"]),
    ]
    # then every event of the failed chunk alone, in stream order; the other board is not redone
    assert [[c.ids for c in trip] for trip in singles] == [[[f"e{i}"]] for i in range(6)]
    assert [(f.event.id, f.error) for f in failures] == [("e2", boom), ("e4", boom)]
    assert ids_of(outcomes, "gift:a") == ["e0", "e1", "e3", "e5"]
    assert [o.seq for o in outcomes if o.event.board == "gift:a"] == [1, 2, 3, 4]
    assert ids_of(outcomes, "level:b") == ["o0", "o1", "o2"]
    assert script.applied_ids("gift:a") == ["e0", "e1", "e3", "e5"]


def test_narrowing_a_hot_boards_chunk_keeps_each_events_instances_and_state():
    script = ScriptStub(failer=fail_member("poison", redis.ResponseError(BOOM)))
    pairs = [
        update("h0", "gift:hot", member="a", ts=BASE_MS),
        update("h1", "gift:hot", member="poison", ts=BASE_MS + HOUR_MS),
        update("h2", "gift:hot", member="a", ts=BASE_MS + 2 * HOUR_MS),
    ]

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    assert [f.event.id for f in failures] == ["h1"]
    singles = [trip[0] for trip in script.round_trips[1:]]
    assert [c.instances for c in singles] == [(TOTAL_INSTANCE, hour_instance(ts)) for _, ts in pairs]
    assert all(c.want_state for c in singles)
    assert [o.event.id for o in outcomes] == ["h0", "h2"]
    # member a after h2: 2 in total (h0 + h2), 1 in h2's hour; the poison event left nothing
    h2_ts = BASE_MS + 2 * HOUR_MS
    assert outcomes[1].states == {
        TOTAL_INSTANCE: MemberState(2.0, h2_ts),
        hour_instance(h2_ts): MemberState(1.0, h2_ts),
    }


def test_a_boards_later_chunk_waits_until_the_failed_earlier_one_is_narrowed():
    script = ScriptStub(failer=fail_member("poison", redis.ResponseError(BOOM)))
    pairs = [update(f"e{i}", "level:a", member="poison" if i == 10 else "m") for i in range(600)]

    outcomes, failures = make_applier(script).apply_isolated(pairs)

    trips = script.round_trips
    assert len(trips) == 1 + 500 + 1
    assert [len(c.events) for c in trips[0]] == [500]
    assert all(len(t) == 1 and len(t[0].events) == 1 for t in trips[1:501])
    assert trips[-1][0].ids == [f"e{i}" for i in range(500, 600)]  # only after the narrowing
    assert [f.event.id for f in failures] == ["e10"]
    expected = [f"e{i}" for i in range(600) if i != 10]
    assert script.applied_ids("level:a") == expected
    assert ids_of(outcomes, "level:a") == expected


def _parsed(raw: str) -> Exception:
    """The exception redis-py makes of an error reply (it strips mapped codes from the text)."""
    error = BaseParser.parse_error(raw)  # type: ignore[no-untyped-call]
    assert isinstance(error, Exception)
    return error


INFRASTRUCTURE_REPLIES = [
    pytest.param(redis.ConnectionError("Connection reset by peer"), id="ConnectionError"),
    pytest.param(redis.TimeoutError("Timeout reading from socket"), id="TimeoutError"),
    pytest.param(redis.ResponseError("BUSY Redis is busy running a script."), id="BUSY"),
    pytest.param(_parsed("OOM command not allowed when used memory > 'maxmemory'."), id="OOM"),
    pytest.param(redis.exceptions.OutOfMemoryError("command not allowed"), id="OutOfMemoryError"),
    pytest.param(_parsed("READONLY You can't write against a read only replica."), id="READONLY"),
    pytest.param(redis.exceptions.ReadOnlyError("read only replica"), id="ReadOnlyError"),
    pytest.param(_parsed("LOADING Redis is loading the dataset in memory"), id="LOADING"),
    pytest.param(_parsed("CLUSTERDOWN The cluster is down"), id="CLUSTERDOWN"),
    pytest.param(_parsed("TRYAGAIN Multiple keys request during rehashing of slot"), id="TRYAGAIN"),
    pytest.param(_parsed("MOVED 3999 127.0.0.1:6381"), id="MOVED"),
    pytest.param(_parsed("MASTERDOWN Link with MASTER is down"), id="MASTERDOWN"),
    pytest.param(redis.ResponseError("MISCONF Redis is configured to save RDB snapshots"), id="MISCONF"),
    pytest.param(_parsed("ASK 3999 127.0.0.1:6381"), id="ASK"),
    pytest.param(redis.exceptions.SlotNotCoveredError("slot 3999 is not covered"), id="SlotNotCovered"),
    pytest.param(redis.exceptions.RedisClusterException("Redis Cluster cannot be connected"), id="Cluster"),
    pytest.param(
        _parsed("ERR Script attempted to access a non local key in a cluster node script: f_1"),
        id="non-local-key",
    ),
]


@pytest.mark.parametrize("error", INFRASTRUCTURE_REPLIES)
def test_an_infrastructure_error_reply_propagates_instead_of_narrowing(error):
    script = ScriptStub(failer=lambda call: error if call.board == "gift:a" else None)
    pairs = [update(f"e{i}", "gift:a") for i in range(3)] + [update("o", "level:b")]

    with pytest.raises(type(error)) as raised:
        make_applier(script).apply_isolated(pairs)

    assert raised.value is error
    assert len(script.round_trips) == 1  # no narrowing: the batch is rewound and retried whole


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("Error 111 connecting"), redis.TimeoutError("Timeout reading")]
)
def test_a_round_trip_that_raises_propagates(error):
    script = ScriptStub(raise_next=[error])

    with pytest.raises(type(error)) as raised:
        make_applier(script).apply_isolated([update("e0", "gift:a")])

    assert raised.value is error


def test_an_infrastructure_error_while_narrowing_propagates():
    lost = redis.ConnectionError("Connection reset by peer")

    def failer(call: SentCall) -> Exception | None:
        if any(e.member == "poison" for e in call.events):
            return redis.ResponseError(BOOM)
        return lost if call.ids == ["e3"] else None  # Redis goes away mid-narrowing

    script = ScriptStub(failer=failer)
    members = ["m0", "poison", "m2", "m3", "m4"]

    with pytest.raises(redis.ConnectionError) as raised:
        make_applier(script).apply_isolated([update(f"e{i}", "gift:a", m) for i, m in enumerate(members)])

    assert raised.value is lost
    assert [t[0].ids for t in script.round_trips[1:]] == [["e0"], ["e1"], ["e2"], ["e3"]]  # stopped there


def test_an_event_whose_periods_cannot_be_computed_fails_alone():
    script = ScriptStub()
    applier = make_applier(script)
    bad_ts = BASE_MS + 5 * HOUR_MS
    explode_periods(applier, {bad_ts}, OverflowError("date value out of range"))
    pairs = [update("e0", "gift:a"), update("e1", "gift:a", ts=bad_ts), update("e2", "gift:a")]

    outcomes, failures = applier.apply_isolated(pairs)

    assert [(f.event.id, type(f.error)) for f in failures] == [("e1", OverflowError)]
    assert [o.event.id for o in outcomes] == ["e0", "e2"]
    assert script.applied_ids("gift:a") == ["e0", "e2"]


# ==================================================================================================
# The loop: poison messages, rewinds, commits
# ==================================================================================================


def test_a_message_whose_processing_raises_is_dead_lettered_once_and_the_rest_committed(rig):
    bad_ts = BASE_MS + 7 * HOUR_MS
    script = ScriptStub(failer=fail_member("poison", redis.ResponseError(BOOM)))
    batch = [
        msg(event("a0", "gift:a"), offset=10),
        msg(event("a1", "gift:a", ts=bad_ts), offset=11),  # the period math raises for it
        msg(event("a2", "gift:a"), offset=12),
        msg(event("b0", "level:b"), offset=40, partition=1),
        msg(event("b1", "level:b"), event("b2", "level:b", member="poison"), offset=41, partition=1),
    ]
    r = rig([batch], script=script)
    explode_periods(r.applier, {bad_ts}, OverflowError("date value out of range"))

    r.loop.run()

    assert script.applied_ids("gift:a") == ["a0", "a2"]
    assert script.applied_ids("level:b") == ["b0", "b1"]
    overflow, poison = r.dead_letters  # each once, nothing else
    assert overflow.value == batch[1].value()
    assert overflow.header(HEADER_REASON) == Reason.INTERNAL_ERROR.encode()
    assert overflow.header(HEADER_ERROR_CLASS) == b"OverflowError"
    assert overflow.header(HEADER_ERROR_TEXT) == b"date value out of range"
    assert overflow.header(HEADER_MESSAGE) == b"processing raised OverflowError: date value out of range"
    assert (overflow.header(HEADER_TOPIC), overflow.header(HEADER_PARTITION)) == (b"updates", b"0")
    assert overflow.header(HEADER_OFFSET) == b"11"
    assert overflow.header(HEADER_INDEX) is None  # a single-object message
    assert poison.value == batch[4].value()
    assert poison.header(HEADER_REASON) == b"internal_error"
    assert poison.header(HEADER_ERROR_CLASS) == b"ResponseError"
    assert poison.header(HEADER_ERROR_TEXT) == BOOM.encode()
    assert (poison.header(HEADER_PARTITION), poison.header(HEADER_OFFSET)) == (b"1", b"41")
    assert poison.header(HEADER_INDEX) == b"1"  # its position in the message's array
    # one transaction: the dead letters and offset+1 of the last message of each partition
    assert r.producer.commits == 1
    assert sorted(r.producer.committed_offsets) == [(UPDATES_TOPIC, 0, 13), (UPDATES_TOPIC, 1, 42)]
    assert r.producer.group_metadata == [r.consumer.metadata]
    assert r.consumer.seeks == []
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 4
    assert r.metric("rankstream_worker_dead_lettered_total", reason="internal_error") == 2
    assert r.metric("rankstream_worker_batch_retries_total") == 0


def test_a_parser_crash_dead_letters_that_message_only(rig, monkeypatch):
    def parse(raw: bytes | None, boards: Any, max_ts: int) -> Any:
        if raw is not None and b'"crash"' in raw:
            raise RecursionError("maximum recursion depth exceeded")
        return parse_message(raw, boards, max_ts)

    monkeypatch.setattr(consumer_module, "parse_message", parse)
    batch = [
        msg(event("e0", "level:a"), offset=0),
        msg(event("e1", "level:a", member="crash"), offset=1),
        msg(event("e2", "level:a"), offset=2),
    ]
    r = rig([batch])

    r.loop.run()

    assert r.script.applied_ids("level:a") == ["e0", "e2"]
    (dead,) = r.dead_letters
    assert dead.value == batch[1].value()
    assert dead.header(HEADER_REASON) == b"internal_error"
    assert dead.header(HEADER_ERROR_CLASS) == b"RecursionError"
    assert dead.header(HEADER_OFFSET) == b"1" and dead.header(HEADER_INDEX) is None
    assert r.producer.committed_offsets == [(UPDATES_TOPIC, 0, 3)]


def test_a_failed_batch_rewinds_to_the_earliest_offset_of_it_and_the_batch_fetched_after_it(rig):
    script = ScriptStub(raise_next=[redis.ConnectionError("Connection reset by peer")])
    batch_n = [
        msg(event("n0", "level:a"), offset=10),
        msg(event("n1", "level:a"), offset=11),
        msg(event("n2", "level:b"), offset=7, partition=1),
    ]
    batch_n1 = [
        msg(event("n3", "level:a"), offset=12),
        msg(event("n4", "level:b"), offset=8, partition=1),
        msg(event("n5", "level:c"), offset=3, partition=2),  # a partition only N+1 has
    ]
    seen: list[int] = []
    r = rig([batch_n, batch_n1], script=script, on_poll=seen.append)
    # what the consumer redelivers after the seeks: N and N+1 again
    r.consumer.add([], [*batch_n, *batch_n1])

    r.loop.run()

    assert sorted(r.consumer.seeks) == [(UPDATES_TOPIC, 0, 10), (UPDATES_TOPIC, 1, 7), (UPDATES_TOPIC, 2, 3)]
    # N failed once; N+1 was never applied before the redelivery; then all of it once
    assert [c.ids for c in script.round_trips[0]] == [["n0", "n1"], ["n2"]]
    assert [i for _, i in script.applied] == ["n0", "n1", "n3", "n2", "n4", "n5"]
    assert r.producer.commits == 1
    assert sorted(r.producer.committed_offsets) == [
        (UPDATES_TOPIC, 0, 13),
        (UPDATES_TOPIC, 1, 9),
        (UPDATES_TOPIC, 2, 4),
    ]
    assert r.dead_letters == []
    assert r.metric("rankstream_worker_batch_retries_total") == 1
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 6


def test_rewind_takes_the_earliest_offset_even_when_the_later_batch_is_listed_first(rig):
    """N+1 may hold a partition's lower offsets (N was a partial fetch of another partition)."""
    script = ScriptStub(failer=lambda call: redis.ResponseError("BUSY Redis is busy running a script."))
    r = rig(
        [
            [msg(event("a", "level:a"), offset=20), msg(event("b", "level:b"), offset=5, partition=1)],
            [msg(event("c", "level:b"), offset=4, partition=1)],
        ],
        script=script,
    )

    r.loop.run()

    assert sorted(r.consumer.seeks) == [(UPDATES_TOPIC, 0, 20), (UPDATES_TOPIC, 1, 4)]
    assert len({p for _, p, _ in r.consumer.seeks}) == len(r.consumer.seeks)  # once per partition


@pytest.mark.parametrize(
    "error",
    [
        redis.ResponseError("BUSY Redis is busy running a script."),
        _parsed("OOM command not allowed when used memory > 'maxmemory'."),
        _parsed("LOADING Redis is loading the dataset in memory"),
    ],
    ids=["BUSY", "OOM", "LOADING"],
)
def test_infrastructure_errors_are_never_dead_lettered(rig, error):
    attempts: list[int] = []

    def failer(call: SentCall) -> Exception | None:
        attempts.append(1)
        return error if len(attempts) == 1 else None  # Redis recovers after the first attempt

    script = ScriptStub(failer=failer)
    batch = [
        msg(event("e0", "level:a"), offset=3),
        MessageStub(b"{not json", offset=4),
        msg(event("e1", "level:a"), offset=5),
    ]
    r = rig([batch, [], batch], script=script)

    r.loop.run()

    assert r.consumer.seeks == [(UPDATES_TOPIC, 0, 3)]
    assert r.producer.count("produce") == 1  # the failed attempt produced nothing
    assert [d.header(HEADER_REASON) for d in r.dead_letters] == [b"bad_json"]  # never internal_error
    assert script.applied_ids("level:a") == ["e0", "e1"]
    assert r.producer.committed_offsets == [(UPDATES_TOPIC, 0, 6)]
    assert r.metric("rankstream_worker_batch_retries_total") == 1


def test_a_retriable_commit_refusal_is_retried_until_it_succeeds(rig):
    producer = ProducerStub()
    producer.fail("send_offsets_to_transaction", kafka_exception(KafkaError._TIMED_OUT, retriable=True))
    producer.fail(
        "commit_transaction",
        kafka_exception(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True),
        kafka_exception(KafkaError._TIMED_OUT, retriable=True),
    )
    r = rig(
        [[msg(event("e0", "level:a"), offset=0), msg(event("e1", "level:a"), offset=1)]], producer=producer
    )

    r.loop.run()

    assert producer.count("send_offsets_to_transaction") == 2
    assert producer.count("commit_transaction") == 3
    assert producer.aborts == 0 and producer.commits == 1
    assert producer.committed_offsets == [(UPDATES_TOPIC, 0, 2)]
    assert r.consumer.seeks == []
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 2
    assert r.metric("rankstream_worker_batch_retries_total") == 0


def test_a_commit_refusal_that_requires_abort_aborts_and_rewinds(rig):
    producer = ProducerStub()
    producer.fail(
        "commit_transaction", kafka_exception(KafkaError.INVALID_PRODUCER_EPOCH, txn_requires_abort=True)
    )
    batch = [
        msg(event("e0", "level:a"), offset=5),
        MessageStub(b"{not json", offset=6, timestamp=(TIMESTAMP_CREATE_TIME, BASE_MS)),
        msg(event("e1", "level:a"), offset=7),
    ]
    r = rig([batch, [], batch], producer=producer)

    r.loop.run()

    assert producer.aborts == 1
    assert r.consumer.seeks == [(UPDATES_TOPIC, 0, 5)]
    # the first transaction (its dead letter and offsets) left nothing; the redelivery commits once
    assert producer.commits == 1
    assert producer.committed_offsets == [(UPDATES_TOPIC, 0, 8)]
    (dead,) = r.dead_letters
    assert dead.header(HEADER_REASON) == b"bad_json" and dead.header(HEADER_OFFSET) == b"6"
    # sent twice, applied once: the redelivery finds the dedupe records (as apply.lua would)
    assert [c.ids for c in r.script.calls] == [["e0", "e1"], ["e0", "e1"]]
    assert r.script.applied_ids("level:a") == ["e0", "e1"]
    # counted for the committed batch only (the stub reports the re-applied events as duplicates)
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 0
    assert r.metric("rankstream_worker_events_total", outcome="duplicate") == 2
    assert r.metric("rankstream_worker_dead_lettered_total", reason="bad_json") == 1
    assert r.metric("rankstream_worker_batch_retries_total") == 1


def test_a_fatal_commit_refusal_raises_producer_fenced_out_of_the_loop(rig):
    producer = ProducerStub()
    producer.fail("commit_transaction", kafka_exception(KafkaError._FENCED, fatal=True))
    r = rig(
        [[msg(event("e0", "level:a"), offset=0)], [msg(event("e1", "level:a"), offset=1)]], producer=producer
    )

    with pytest.raises(ProducerFenced, match="fenced"):
        r.loop.run()

    assert producer.commits == 0 and producer.committed_offsets == []
    assert r.consumer.seeks == []  # not rewound: the process exits and its successor takes over
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 0
    assert r.script.applied_ids("level:a") == ["e0"]  # batch N+1 was fetched, never applied


def test_close_after_the_producer_was_fenced_leaves_the_group(rig):
    producer = ProducerStub()  # librdkafka: after a fatal error every transactional call fails so
    producer.fail("commit_transaction", kafka_exception(KafkaError._FENCED, fatal=True))
    r = rig([[msg(event("e0", "level:a"), offset=0)]], producer=producer)
    with pytest.raises(ProducerFenced):
        r.loop.run()

    r.loop.close()

    assert r.consumer.closed


def test_fatal_consumer_error_raises_and_partition_eof_is_skipped(rig):
    eof = MessageStub(None, offset=9, error=KafkaError(KafkaError._PARTITION_EOF))
    r = rig([[msg(event("e0", "level:a"), offset=8), eof]])
    r.loop.run()
    assert r.producer.committed_offsets == [(UPDATES_TOPIC, 0, 9)]  # the EOF event is not a message

    fatal = MessageStub(None, error=KafkaError(KafkaError._FATAL, fatal=True))
    r2 = rig([[fatal]])
    with pytest.raises(KafkaException) as raised:
        r2.loop.run()
    assert raised.value.args[0].fatal()


# ==================================================================================================
# Dead letters: the size rule
# ==================================================================================================


def _bad(reason: Reason = Reason.BAD_JSON) -> BadEvent:
    return BadEvent(reason, "not valid JSON", None)


def test_a_dead_letter_over_the_limit_goes_out_truncated_with_its_original_size():
    sink = SinkStub()
    dlq = DeadLetters(sink, DLQ_TOPIC, max_record_bytes=1_000_000)
    huge = b"x" * 2_000_000
    dlq.send(MessageStub(huge, offset=3, key=b"k" * 5000), _bad())

    (record,) = sink.records
    assert record.value == huge[:TRUNCATED_BYTES] and len(record.value) == 64 * 1024
    assert record.header(HEADER_TRUNCATED) == b"1"
    assert record.header(HEADER_ORIGINAL_SIZE) == b"2000000"
    assert record.key == b"k" * 1024
    assert record.header(HEADER_REASON) == b"bad_json" and record.header(HEADER_OFFSET) == b"3"


def test_a_dead_letter_within_the_limit_goes_out_whole():
    sink = SinkStub()
    dlq = DeadLetters(sink, DLQ_TOPIC, max_record_bytes=1_000_000)
    large_but_fine = b"y" * 200_000  # over 64 KiB, within the limit: not truncated
    dlq.send(MessageStub(large_but_fine, offset=4, key=b"key"), _bad())

    (record,) = sink.records
    assert record.value == large_but_fine and record.key == b"key"
    assert record.header(HEADER_TRUNCATED) is None and record.header(HEADER_ORIGINAL_SIZE) is None


def test_the_limit_counts_key_headers_and_overhead():
    limit = 100_000
    sink = SinkStub()
    dlq = DeadLetters(sink, DLQ_TOPIC, max_record_bytes=limit)
    dlq.send(MessageStub(b"z" * (limit - 1000), offset=1), _bad())  # the value alone would fit
    assert sink.records[0].header(HEADER_TRUNCATED) == b"1"


def test_a_dead_letter_the_producer_refuses_as_too_large_goes_out_truncated():
    sink = SinkStub(refuse_above=100_000)  # the producer's own limit is lower than configured
    dlq = DeadLetters(sink, DLQ_TOPIC, max_record_bytes=1_000_000)
    dlq.send(MessageStub(b"w" * 300_000, offset=2), _bad())

    assert sink.refused == 1
    (record,) = sink.records
    assert len(record.value or b"") == TRUNCATED_BYTES
    assert record.header(HEADER_ORIGINAL_SIZE) == b"300000"


def test_an_oversized_message_is_dead_lettered_truncated_through_the_loop(rig):
    raw = b"[" + b" " * 150_000 + b"]"  # an empty array: dead-lettered as empty_batch
    huge = MessageStub(raw, offset=0, timestamp=(TIMESTAMP_CREATE_TIME, BASE_MS))
    r = rig([[huge, msg(event("e0", "level:a"), offset=1)]], dlq_limit=100_000)

    r.loop.run()

    (dead,) = r.dead_letters
    assert dead.header(HEADER_REASON) == b"empty_batch"
    assert dead.value == raw[:TRUNCATED_BYTES]
    assert dead.header(HEADER_ORIGINAL_SIZE) == b"150002"
    assert r.producer.committed_offsets == [(UPDATES_TOPIC, 0, 2)]


# ==================================================================================================
# ts from the Kafka timestamp
# ==================================================================================================


def test_an_event_without_ts_takes_the_kafka_message_timestamp(rig):
    r = rig()
    created, appended = BASE_MS + 1234, BASE_MS + 99_999
    messages = [
        msg(event("e0", "level:a", ts=None), offset=0, timestamp=(TIMESTAMP_CREATE_TIME, created)),
        msg(event("e1", "level:a", ts=None), offset=1, timestamp=(TIMESTAMP_LOG_APPEND_TIME, appended)),
        msg(event("e2", "level:a", ts=BASE_MS + 5), offset=2, timestamp=(TIMESTAMP_CREATE_TIME, created)),
        msg(event("e3", "level:a", ts=None), offset=3, timestamp=(TIMESTAMP_CREATE_TIME, MIN_TS_MS)),
    ]

    prepared = r.loop.prepare(messages)

    assert prepared.rejections == []
    assert [(e.id, ts) for e, ts in prepared.pairs] == [
        ("e0", created),
        ("e1", appended),
        ("e2", BASE_MS + 5),  # its own ts wins
        ("e3", MIN_TS_MS),  # the lower bound is inclusive
    ]


def test_an_event_without_ts_in_a_message_without_timestamp_takes_now(rig):
    r = rig()
    before = int(time.time() * 1000)
    prepared = r.loop.prepare(
        [msg(event("e0", "level:a", ts=None), offset=0, timestamp=(TIMESTAMP_NOT_AVAILABLE, -1))]
    )
    after = int(time.time() * 1000)

    ((_, ts),) = prepared.pairs
    assert before <= ts <= after


def test_a_kafka_timestamp_out_of_range_rejects_only_the_events_that_use_it(rig):
    r = rig()
    future = int(time.time() * 1000) + SKEW_S * 1000 + 60_000
    mixed = msg(
        event("in", "level:a", ts=BASE_MS), event("out", "level:a", ts=None), offset=0, timestamp=(1, 1000)
    )
    early = msg(event("early", "level:a", ts=None), offset=1, timestamp=(1, MIN_TS_MS - 1))
    late = msg(event("late", "level:a", ts=None), offset=2, timestamp=(1, future))
    fine = msg(event("fine", "level:a", ts=None), offset=3, timestamp=(1, BASE_MS))

    prepared = r.loop.prepare([mixed, early, late, fine])

    assert [(e.id, ts) for e, ts in prepared.pairs] == [("in", BASE_MS), ("fine", BASE_MS)]
    assert [(m.offset(), bad.reason, bad.index) for m, bad, _ in prepared.rejections] == [
        (0, Reason.TS_OUT_OF_RANGE, 1),
        (1, Reason.TS_OUT_OF_RANGE, None),
        (2, Reason.TS_OUT_OF_RANGE, None),
    ]
    assert "Kafka message timestamp" in prepared.rejections[0][1].message


def test_kafka_timestamps_through_the_loop(rig):
    created = BASE_MS + 777
    batch = [
        msg(
            event("a", "level:a", ts=None),
            event("b", "level:a", ts=BASE_MS + 1),
            offset=0,
            timestamp=(1, created),
        ),
        msg(
            event("c", "level:a", ts=None), event("d", "level:a", ts=BASE_MS + 2), offset=1, timestamp=(1, 5)
        ),
    ]
    r = rig([batch])

    r.loop.run()

    assert [(e.id, e.ts) for c in r.script.calls for e in c.events] == [
        ("a", created),
        ("b", BASE_MS + 1),
        ("d", BASE_MS + 2),
    ]
    (dead,) = r.dead_letters
    assert dead.header(HEADER_REASON) == b"ts_out_of_range"
    assert (dead.header(HEADER_OFFSET), dead.header(HEADER_INDEX)) == (b"1", b"0")
    assert r.producer.committed_offsets == [(UPDATES_TOPIC, 0, 2)]


# ==================================================================================================
# The shutdown deadline with a Redis that does not answer
# ==================================================================================================


# long enough that the exit reserve (0.5 s) leaves room for a loaded box's scheduling: the
# margins below are half a second, not the 75 ms a 0.3 s deadline left
STOP_DEADLINE_S = 2.0


def test_the_exit_reserve_is_a_quarter_of_a_small_deadline_and_half_a_second_at_most():
    """The tests below use a 2 s deadline (a reserve of 0.5 s either way): the small-deadline
    rule is pinned here, without a clock."""
    assert exit_reserve(0.3) == pytest.approx(0.075)
    assert exit_reserve(2.0) == pytest.approx(0.5)
    assert exit_reserve(30.0) == pytest.approx(0.5)


def _blocked_script() -> ScriptStub:
    """run_many blocks until released, then fails, so a released batch can't commit later."""
    return ScriptStub(block=threading.Event(), after_block=redis.ConnectionError("released at teardown"))


def test_stop_with_a_blocked_apply_abandons_the_batch_within_the_deadline(rig):
    script = _blocked_script()
    stopped: list[float] = []
    deadline_s = STOP_DEADLINE_S

    def on_poll(n: int) -> None:
        if n == 2:  # batch 1 is in flight, blocked in Redis: SIGTERM
            assert script.entered.wait(5)
            stopped.append(time.monotonic())
            r.loop.request_stop(deadline_s)

    r = rig([[msg(event("e0", "level:a"), offset=0)]], script=script, on_poll=on_poll, stop_when_done=False)

    r.loop.run()
    ran_out = time.monotonic() - stopped[0]
    r.loop.close()
    closed = time.monotonic() - stopped[0]

    assert r.loop.abandoned is True
    # the loop's budget is the deadline less the exit reserve
    assert deadline_s - exit_reserve(deadline_s) - 0.05 <= ran_out < deadline_s
    assert closed < deadline_s
    assert "commit_transaction" not in r.producer.calls
    assert r.producer.committed_offsets == [] and r.producer.committed_records == []
    assert r.metric("rankstream_worker_events_total", outcome="applied") == 0


def test_close_with_a_blocked_apply_returns_within_the_deadline(rig):
    """run() left by an exception (a fatal consumer error) with a batch in flight: close() waits
    for it only as long as the deadline allows."""
    script = _blocked_script()
    fatal = MessageStub(None, error=KafkaError(KafkaError._FATAL, fatal=True))
    r = rig([[msg(event("e0", "level:a"), offset=0)], [fatal]], script=script, stop_when_done=False)
    with pytest.raises(KafkaException):
        r.loop.run()
    assert script.entered.wait(5)

    started = time.monotonic()
    r.loop.request_stop(STOP_DEADLINE_S)
    r.loop.close()
    elapsed = time.monotonic() - started

    assert r.loop.abandoned is True
    assert STOP_DEADLINE_S - exit_reserve(STOP_DEADLINE_S) - 0.05 <= elapsed < STOP_DEADLINE_S
    assert "commit_transaction" not in r.producer.calls and r.producer.committed_offsets == []
    assert not r.consumer.closed  # left at the deadline: the process exits, the group times it out


def test_stop_while_the_loop_already_waits_for_a_blocked_apply_is_bounded(rig):
    release = threading.Event()
    script = ScriptStub(block=release, after_block=redis.ConnectionError("released at teardown"))
    polled_twice = threading.Event()

    def on_poll(n: int) -> None:
        if n == 2:
            polled_twice.set()

    r = rig([[msg(event("e0", "level:a"), offset=0)]], script=script, on_poll=on_poll, stop_when_done=False)
    runner = threading.Thread(target=r.loop.run, name="test-loop", daemon=True)
    runner.start()
    try:
        assert polled_twice.wait(5) and script.entered.wait(5)
        time.sleep(0.1)  # the loop is now in _settle(), waiting for batch 1 with no deadline yet
        r.loop.request_stop(STOP_DEADLINE_S)
        runner.join(STOP_DEADLINE_S)
        assert not runner.is_alive(), "run() did not return within the shutdown deadline"
        assert r.loop.abandoned is True
    finally:
        release.set()
        runner.join(5)


class _StuckPass:
    """A rolling preparer or results emitter whose pass blocks (Redis or Kafka not answering)."""

    metrics = None

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def step(self) -> int:
        self.entered.set()
        self.release.wait(30)
        return 0

    def close(self) -> None:  # the emitter gives its lease back once its pass stopped
        pass


def test_close_with_both_passes_stuck_returns_within_the_deadline(rig):
    """The preparer's and the emitter's passes are stopped together, each wait bounded by what is
    left of the deadline (not 10 s each, one after the other)."""
    r = rig(stop_when_done=False)
    preparer, emitter = _StuckPass(), _StuckPass()
    r.loop.preparer = PreparerThread(cast(RollingPreparer, preparer), interval_s=0.01)
    r.loop.results = ResultsThread(cast(ResultEmitter, emitter), interval_s=0.01)
    r.loop.preparer.start()
    r.loop.results.start()
    try:
        assert preparer.entered.wait(5) and emitter.entered.wait(5)
        started = time.monotonic()
        r.loop.request_stop(STOP_DEADLINE_S)
        r.loop.close()
        elapsed = time.monotonic() - started
        assert elapsed < STOP_DEADLINE_S  # the loop's budget: the deadline less the exit reserve
        assert r.loop.abandoned is True  # the process exits without waiting for the passes
    finally:
        preparer.release.set()
        emitter.release.set()


class _StuckOffsetsProducer(ProducerStub):
    """librdkafka#5456: send_offsets_to_transaction ignores its timeout while the coordinator is away."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], group_metadata: object, timeout: float | None = None
    ) -> None:
        self.calls.append("send_offsets_to_transaction")
        self.release.wait(10)


def test_a_stuck_transactional_call_gets_its_producer_replaced(monkeypatch):
    monkeypatch.setattr(outputs_module, "CALL_TIMEOUT_S", 0.05)
    monkeypatch.setattr(outputs_module, "WATCHDOG_GRACE_S", 0.1)
    stuck, fresh = _StuckOffsetsProducer(), ProducerStub()
    made = iter([stuck, fresh])
    outputs = TransactionalOutputs(lambda: next(made).as_producer(), Deadline())
    outputs.init()
    outputs.produce("dlq", value=b"v", key=None)
    started = time.monotonic()
    with pytest.raises(InfrastructureError, match="producer replaced"):
        outputs.commit([TopicPartition("t", 0, 5)], object())
    assert time.monotonic() - started < 2  # the watchdog, not the stuck call, decides
    assert outputs.replaced == 1 and stuck.commits == 0
    # the batch is redone on a new producer with the same transactional.id: init first (it fences
    # the stuck one and aborts its transaction), then the records and offsets, committed once
    outputs.produce("dlq", value=b"v", key=None)
    outputs.commit([TopicPartition("t", 0, 5)], object())
    assert fresh.calls[0] == "init_transactions"
    assert fresh.commits == 1 and fresh.committed_offsets == [("t", 0, 5)]
    assert [r.value for r in fresh.committed_records] == [b"v"]
    stuck.release.set()
