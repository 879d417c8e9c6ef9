"""No poison pill: messages that raise while they are processed, events at the edges of the
accepted range and 1 MiB messages go through real Kafka and real Redis with two workers; every
other board ends exact, each bad message is dead-lettered once (read_committed), nothing stalls.

The poison is injected, not mocked: the worker's own decision raises for members named
`poison…` (so their chunk goes to apply.lua), apply.lua on the real Redis receives a corrupted
argument for them and raises, and the period math raises for one magic timestamp."""

from __future__ import annotations

import random
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from common.events import MIN_TS_MS
from common.settings import Settings
from common.store import apply as store_apply
from common.store.scripts import ArgT
from rankstream.topics import ensure_topics
from tests.helpers import (
    check_dlq,
    header_map,
    kafka_lag,
    produce,
    read_all,
    running_worker,
    wait_applied_and_committed,
    wait_for,
)
from tests.oracle import (
    BOARDS,
    DAY_MS,
    ORACLE_BOARDS,
    Message,
    compare_redis,
    generate,
    now_ms,
    run_model,
)
from worker import decide as decide_module
from worker.apply import Applier
from worker.dlq import (
    HEADER_ERROR_CLASS,
    HEADER_ERROR_TEXT,
    HEADER_INDEX,
    HEADER_ORIGINAL_SIZE,
    HEADER_REASON,
    HEADER_TRUNCATED,
    TRUNCATED_BYTES,
)

pytestmark = pytest.mark.integration
MAGIC_TS_OFFSET = 4242  # an event at now - this raises inside the period math


@pytest.fixture
def oracle_settings(make_settings, tmp_path) -> Settings:
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS)
    settings: Settings = make_settings(boards=boards)
    ensure_topics(settings)
    return settings


@dataclass
class Poison:
    """Faults inside the real apply path, and how often each fired."""

    magic_ts: int | None = None  # an event at exactly this ts raises inside the period math
    lua: int = 0
    periods: int = 0


@pytest.fixture
def poisoned(monkeypatch) -> Poison:
    poison = Poison()
    real_args, real_slots = store_apply._event_args, Applier._slots

    def corrupt_args(ev: store_apply.ApplyEvent) -> tuple[ArgT, ...]:
        args = real_args(ev)
        if not ev.member.startswith("poison"):
            return args
        poison.lua += 1
        score = store_apply.EV.index("SCORE")
        return (*args[:score], "not-a-number", *args[score + 1 :])  # apply.lua's arithmetic raises

    def failing_slots(self: Applier, board_type: Any, ts: int) -> Any:
        if ts == poison.magic_ts:
            poison.periods += 1
            raise OverflowError("date value out of range (injected)")
        return real_slots(self, board_type, ts)

    def failing_plan(req: Any, cell: Any, ev: store_apply.ApplyEvent, i: int) -> Any:
        if ev.member.startswith("poison"):
            raise ArithmeticError("injected")
        return real_plan(req, cell, ev, i)

    real_plan = decide_module._plan
    monkeypatch.setattr(decide_module, "_plan", failing_plan)
    monkeypatch.setattr(store_apply, "_event_args", corrupt_args)
    monkeypatch.setattr(Applier, "_slots", failing_slots)
    return poison


def single(event: dict[str, Any], valid: bool, reason: str | None = None) -> Message:
    raw = orjson.dumps(event)
    return Message(
        event["board"].encode(),
        raw,
        [(event, None)] if valid else [],
        [] if valid else [(reason or "", None)],
    )


def edge_messages(rng: random.Random, start: int) -> list[Message]:
    """Valid events at both ends of the accepted range, and ones just beyond it."""
    out: list[Message] = []
    for n in range(40):
        board = rng.choice(BOARDS)
        member = f"edge{n % 7}"
        ts_ok = rng.choice([MIN_TS_MS, MIN_TS_MS + 1, start + DAY_MS - 60_000, start + DAY_MS // 2])
        ok = {
            "id": f"edge-ok-{n}",
            "board": board,
            "member": member,
            "score": rng.randint(1, 50),
            "ts": ts_ok,
        }
        out.append(single(ok, True))
        ts_bad = rng.choice([MIN_TS_MS - 1, start + 2 * DAY_MS, 253_402_300_799_999, -1])
        bad = {"id": f"edge-bad-{n}", "board": board, "member": member, "score": 1, "ts": ts_bad}
        out.append(single(bad, False, "ts_out_of_range"))
    return out


def poison_messages(rng: random.Random, start: int) -> list[Message]:
    """Valid by the contract, but their processing raises: dead-lettered with internal_error."""
    out: list[Message] = []
    for n in range(30):
        board = rng.choice(BOARDS)
        event = {"id": f"poison-{n}", "board": board, "member": f"poison{n}", "score": 5, "ts": start - n}
        out.append(single(event, False, "internal_error"))
        # in an array: the poison element is dead-lettered with its index, its neighbours applied
        good = [
            {"id": f"pa-{n}-{i}", "board": board, "member": f"m{i}", "score": i, "ts": start - i}
            for i in range(3)
        ]
        items = [good[0], {**event, "id": f"poison-arr-{n}"}, *good[1:]]
        out.append(
            Message(
                board.encode(),
                orjson.dumps(items),
                [(good[0], 0), (good[1], 2), (good[2], 3)],
                [("internal_error", 1)],
            )
        )
    return out


@pytest.mark.slow
def test_poison_and_edge_messages_mid_stream_with_two_workers(
    oracle_settings, rclient, consumer_factory, poisoned
):
    settings = oracle_settings
    start = now_ms()
    rng = random.Random(8)
    messages = list(generate(seed=8, total=20_000, now_ms=start))
    magic_ts = start - MAGIC_TS_OFFSET
    period_poison = {"id": "period-poison", "board": "gift:r1", "member": "x", "score": 1, "ts": magic_ts}
    extra = [
        *edge_messages(rng, start),
        *poison_messages(rng, start),
        single(period_poison, False, "internal_error"),
    ]
    for msg in extra:  # mid-stream, each at a random place
        messages.insert(rng.randrange(len(messages) // 4, len(messages)), msg)
    model = run_model(messages, start)
    poisoned.magic_ts = magic_ts
    produce(settings, messages)
    with ExitStack() as workers:
        for name in ("a", "b"):
            workers.enter_context(running_worker(settings.model_copy(update={"worker_id": f"poison-{name}"})))
        wait_applied_and_committed(rclient, settings, sum(model.seq.values()))
    assert poisoned.lua >= 60 and poisoned.periods >= 1, poisoned
    compare_redis(rclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
    records = read_all(consumer_factory(settings.topic_dlq), len(model.dlq), timeout=60)
    internal = [header_map(r) for r in records if header_map(r)[HEADER_REASON] == b"internal_error"]
    assert len(internal) == 61
    assert {h[HEADER_ERROR_CLASS] for h in internal} == {b"ResponseError", b"OverflowError"}
    assert all(h[HEADER_ERROR_TEXT] for h in internal)
    assert sum(1 for h in internal if HEADER_INDEX in h) == 30


def one_mib_array(items: list[dict[str, Any]]) -> bytes:
    """A JSON array of `items` padded with whitespace (valid JSON) to exactly 1 MiB."""
    body = b",".join(orjson.dumps(item) for item in items)
    return b"[" + body + b" " * (1024 * 1024 - len(body) - 2) + b"]"


def test_one_mib_messages_are_applied_or_dead_lettered_truncated(oracle_settings, rclient, consumer_factory):
    """update_rank takes 2 MiB; a dead letter that does not fit the producer or the DLQ goes out
    truncated to 64 KiB with its original size, instead of being retried forever."""
    settings = oracle_settings
    start = now_ms()
    mib = 1024 * 1024
    garbage = b"{" + b"x" * (mib - 1)  # 1 MiB, not JSON
    meta = {"bio": "b" * 1000}
    big_valid = [
        {"id": f"big-{i}-" + "i" * 100, "board": "gift:" + "s" * 160, "member": f"{i:03d}" + "m" * 120,
         "score": i, "ts": start - i, "meta": meta}
        for i in range(500)
    ]  # fmt: skip
    big_with_bad = [dict(e, id=f"bad-{e['id']}") for e in big_valid]
    big_with_bad[7] = {"id": "broken", "board": "gift:r1"}  # no member
    almost = b"[" + b" " * 900_000 + b"]"  # an empty array, padded: dead-lettered whole
    values = [garbage, one_mib_array(big_valid), one_mib_array(big_with_bad), almost]
    after = {"id": "after", "board": "gift:r2", "member": "m", "score": 3, "ts": start}
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": 2 * mib + 4096, "linger.ms": 5}
    )
    for value in [*values, orjson.dumps(after)]:
        producer.produce(settings.topic_updates, value, key=b"big", partition=0)
    assert producer.flush(30) == 0
    with running_worker(settings):
        # every message applied or dead-lettered and committed (not the last board's seq alone: a
        # board's call that fails is narrowed event by event after its round trip, so a later
        # board of the same batch can be applied first)
        wait_for(lambda: kafka_lag(settings) == 0, 120, "every message committed")
    seq_big = int(rclient.get(f"{settings.key_prefix}{{gift:{'s' * 160}}}:seq") or 0)
    records = read_all(consumer_factory(settings.topic_dlq), 3, timeout=60, exact=False)
    dead = [header_map(r) for r in records]
    by_reason = {h[HEADER_REASON]: r for h, r in zip(dead, records, strict=True)}
    reasons = [(h[HEADER_REASON], h.get(HEADER_INDEX)) for h in dead]
    assert int(rclient.get(f"{settings.key_prefix}{{gift:r2}}:seq") or 0) == 1, reasons
    assert (seq_big, len(records)) == (500 + 499, 3), reasons  # every valid event of both arrays applied
    assert set(by_reason) == {b"bad_json", b"missing_field", b"empty_batch"}
    for reason, original in ((b"bad_json", garbage), (b"missing_field", values[2])):
        record, headers = by_reason[reason], header_map(by_reason[reason])
        assert headers[HEADER_TRUNCATED] == b"1"
        assert int(headers[HEADER_ORIGINAL_SIZE]) == len(original)
        assert record.value() == original[:TRUNCATED_BYTES]
    whole = by_reason[b"empty_batch"]
    assert whole.value() == almost and HEADER_TRUNCATED not in header_map(whole)
    assert header_map(by_reason[b"missing_field"])[HEADER_INDEX] == b"7"
