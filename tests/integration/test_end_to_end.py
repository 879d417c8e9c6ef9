"""Data flows end to end: producer -> Kafka -> worker -> Redis -> API, bad events to the DLQ."""

from __future__ import annotations

import random
import uuid

import orjson
import pytest

from tests.helpers import api_call, header_map, read_all, running_worker, wait_for
from worker.dlq import HEADER_INDEX, HEADER_OFFSET, HEADER_REASON

pytestmark = pytest.mark.integration


def test_events_reach_redis_and_the_api_and_bad_ones_the_dlq(topics, producer, consumer_factory, rclient):
    settings = topics
    rng = random.Random(7)
    model: dict[str, float] = {}
    members = [f"u{i}" for i in range(40)]
    for _ in range(600):
        member, score = rng.choice(members), rng.randint(-5, 100)
        event = {"id": uuid.uuid4().hex, "board": "gift:room42", "member": member, "score": score}
        producer.produce(settings.topic_updates, orjson.dumps(event), key=b"gift:room42")
        model[member] = model.get(member, 0) + score
    mixed = b'[{"id":"ok1","board":"gift:room42","member":"u0","score":1},{"id":"b","board":"gift:room42"}]'
    bad = [
        (b"{not json", "bad_json", None),
        (
            orjson.dumps({"id": "x", "board": "nosuch:1", "member": "m", "score": 1}),
            "unknown_board_type",
            None,
        ),
        (mixed, "missing_field", 1),
    ]
    model["u0"] = model.get("u0", 0) + 1
    for value, _, _ in bad:
        producer.produce(settings.topic_updates, value)
    assert producer.flush(10) == 0

    seq_key = f"{settings.key_prefix}{{gift:room42}}:seq"
    with running_worker(settings):
        wait_for(lambda: int(rclient.get(seq_key) or 0) >= 601, what="601 applied events")

    # Redis: the total window holds exactly the model, in order (desc, ties by first arrival)
    status, body = api_call(settings, "GET", "/v1/boards/gift:room42/top?limit=500")
    hourly = api_call(settings, "GET", "/v1/boards/gift:room42/top?limit=500&window=hour")[1]
    assert hourly["source"] == "redis"  # hour is not a hot window of the board
    assert status == 200
    # gift:room42's total window is hot in deploy/boards.yaml: memory answers, equal to Redis
    assert body["source"] == "memory" and body["seq"] == 601 and body["total"] == len(model)
    assert {item["member"]: item["score"] for item in body["items"]} == model
    assert [item["rank"] for item in body["items"]] == list(range(1, len(model) + 1))
    scores = [item["score"] for item in body["items"]]
    assert scores == sorted(scores, reverse=True)

    dlq = read_all(consumer_factory(settings.topic_dlq), len(bad))
    headers = [header_map(m) for m in dlq]
    seen = sorted(
        (h[HEADER_REASON], m.value(), h.get(HEADER_INDEX)) for h, m in zip(headers, dlq, strict=True)
    )
    assert seen == sorted((r.encode(), v, None if i is None else str(i).encode()) for v, r, i in bad)
    assert all(h[HEADER_OFFSET].isdigit() for h in headers)


def test_api_answers_json_errors(topics):
    settings = topics
    status, body = api_call(settings, "GET", "/v1/boards/nosuch:1/top")
    assert status == 404 and body["error"]["code"] == "unknown_board_type"
    status, body = api_call(settings, "GET", "/v1/boards/gift:room42/top?limit=501")
    assert status == 400 and body["error"]["code"] == "bad_parameter"
    status, body = api_call(settings, "GET", "/v1/boards/gift:room42/top?window=day&period=2026-13-01")
    assert status == 400 and body["error"]["code"] == "bad_period"
