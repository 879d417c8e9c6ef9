"""A hot league (docs/leagues.md#hot-leagues): the real worker publishes its divisions to
update_cache as format-3 records, and an API node serves its members and divisions from memory,
equal to the model, live and after replaying the topic, on both Redis topologies; a board made
hot after it holds data is backfilled, divisions and all."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import orjson
import pytest
import redis
from confluent_kafka import Producer

from common.boards import parse_boards
from common.settings import Settings
from rankstream.topics import ensure_topics
from tests.helpers import BOTH_TOPOLOGIES, committed_so_far, read_all, running_worker, wait_for
from tests.integration.test_leagues import (
    CONFIG,
    START,
    WEEK_MS,
    check_api,
    league_event,
    rules_of,
    season_id,
)
from tests.league_model import LeagueModel

pytestmark = pytest.mark.integration
BOARD = "arena:hot"
HOT_CONFIG = CONFIG + f'hot:\n  - {{board: "{BOARD}"}}\n'
HOT_BOARDS = parse_boards(HOT_CONFIG)
EVENTS = 160


def produce(settings: Settings, model: LeagueModel, rng: random.Random, ks: range) -> None:
    """Events `ks` of two seasons of one league board, keyed by board (one partition: stream order)."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    for k in ks:
        ts = START + (k * 2 * WEEK_MS) // EVENTS
        member = f"h{rng.randrange(min(25, 3 + k // 3))}"
        op = rng.choice(["incr", "incr", "incr", "set", "delete"])
        score = float(rng.choice([1, 2, 5]))
        value = {"id": f"h{k}", "board": BOARD, "member": member, "score": score, "ts": ts, "op": op}
        producer.produce(settings.topic_updates, orjson.dumps(value), key=BOARD.encode())
        model.apply([league_event(BOARD, member, op, score, ts=ts, eid=f"h{k}")])
    assert producer.flush(30) == 0


@BOTH_TOPOLOGIES
def test_a_hot_league_is_served_from_memory_as_redis_holds_it(
    make_settings: Callable[..., Settings], tmp_path, rclient: redis.Redis, consumer_factory
) -> None:
    """The board holds a season and a half before it is made hot (the worker then backfills its
    divisions into update_cache), the rest is applied live; an API node replays the topic and
    answers every league read from memory as the model says."""
    cold, hot = tmp_path / "cold.yaml", tmp_path / "hot.yaml"
    cold.write_text(CONFIG)
    hot.write_text(HOT_CONFIG)
    settings = make_settings(boards=cold)
    ensure_topics(settings)
    model, rng = LeagueModel(rules_of("arena")), random.Random(4)
    clock = [START + 2 * WEEK_MS - 1]
    produce(settings, model, rng, range(120))
    with running_worker(settings, lambda: clock[0]):
        wait_for(lambda: committed_so_far(settings) == 120, 60, "the first part committed")
    settings = make_settings(boards=hot)
    with running_worker(settings, lambda: clock[0]):  # the board is hot now: backfilled at start
        produce(settings, model, rng, range(120, EVENTS))
        # committed: applied, and its update_cache records published in the same transaction
        wait_for(lambda: committed_so_far(settings) == EVENTS, 60, "the stream committed")
        seasons = [season_id(START), season_id(START + WEEK_MS)]
        checked = asyncio.run(
            check_api(settings, model, BOARD, seasons, clock[0], boards=HOT_BOARDS, source="memory")
        )
    assert checked > 40
    records = read_all(consumer_factory(settings.topic_cache), 1, exact=False)
    divisions = [m for m in records if b"@" in (m.key() or b"") and m.value()]
    heads = {(m.value() or b"\0")[0] for m in divisions}  # format 3: states, deletes, backfill chunks
    assert {0x31, 0x37} <= heads <= {0x31, 0x32, 0x34, 0x37}
