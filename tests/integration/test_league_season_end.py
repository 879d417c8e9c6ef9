"""A league season's end (docs/leagues.md#the-season-end-record) on real Redis and Kafka: once
the season's late grace has passed, the results emitter publishes each division's final
standings to rank_period_closed, with every ranked member's tier, new tier and reward, equal to
the model's, exactly once, through an emitter dying at each step and a fenced zombie; the new
tiers are the ones the next season seats its returning members in."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import KafkaException, Producer

from common.boards import RESULT_SETTLE_MS
from common.league import division_id
from common.results import result_key
from common.settings import Settings
from common.store import periodmark
from common.store.keys import BoardKeys, results_due, results_emitter, window_instance
from tests.helpers import running_worker, wait_for
from tests.integration.test_leagues import (
    BOARDS,
    CONFIG,
    START,
    WEEK_MS,
    event,
    league_event,
    redis_league,
    rules_of,
    season_id,
)
from tests.integration.test_period_results_emitter import Clock, records, results_setup, step
from tests.league_model import LeagueModel
from worker.apply import Applier, Position, Source
from worker.main import results_emitter as make_emitter
from worker.results import ResultEmitter

pytestmark = pytest.mark.integration
BOARD = "arena:end"
FIRST = season_id(START)
KEY = result_key(BOARD, "season", FIRST)
DUE = START + WEEK_MS + BOARDS.types["arena"].late_grace_ms + RESULT_SETTLE_MS
SRC = Source("t", 0, "topic-id", -1)


@pytest.fixture
def setup(make_settings: Callable[..., Settings], tmp_path) -> Iterator[tuple[Settings, redis.Redis]]:
    with results_setup(make_settings, tmp_path / "boards.yaml", CONFIG) as got:
        yield got


def emitter(settings: Settings, client: redis.Redis, clock: Clock, owner: str) -> ResultEmitter:
    return make_emitter(settings, client, BOARDS, owner, clock=clock, metrics=None)


def play(settings: Settings, client: redis.Redis, clock: Clock) -> LeagueModel:
    """A season of 20 members (7 divisions of 3, the last one short; ties), then a few of them
    and a newcomer in the next, all in stream order, the worker's clock following the stream."""
    rng = random.Random(9)
    applier = Applier(client, BOARDS, settings.key_prefix, 3600, now_ms=clock, epoch="E")
    model = LeagueModel(rules_of("arena"))
    stream = [(f"p{k}", "incr", float(rng.choice([1, 2, 3])), START + 10 * k) for k in range(20)]
    stream += [
        (f"p{rng.randrange(20)}", "incr", float(rng.choice([1, 2, 3])), START + 500 + k) for k in range(60)
    ]
    stream += [(m, "incr", 1.0, START + WEEK_MS + k) for k, m in enumerate(["p0", "p1", "p2", "p19", "new"])]
    for offset, (member, op, score, ts) in enumerate(stream):
        clock.now = max(clock.now, ts)
        eid = f"s{offset}"
        applier.apply([(event(BOARD, member, op, score, eid), ts)], [Position(SRC, offset, None)])
        model.apply([league_event(BOARD, member, op, score, ts=ts, eid=eid)])
    return model


def expected(model: LeagueModel) -> list[tuple[str, dict[str, Any]]]:
    """The model's records of the first season, in the emitter's order (lowest tier first)."""
    s, rules = model.season(BOARD, FIRST), model.rules
    out = []
    for tier in rules.tiers:
        for number in range(1, s.divisions(tier, rules) + 1):
            standings = s.standings(tier, number, rules)
            top = [
                {"rank": rank, "member": m, "score": int(score), "tier": tier,
                 "new_tier": s.outcome(m, rules)[0], "reward": rank <= rules.rewards_top}
                for rank, (m, score) in enumerate(standings, 1)
            ]  # fmt: skip
            name = division_id(tier, number)
            out.append(
                (f"{KEY}|{name}", {"division": name, "tier": tier, "members": len(standings), "top": top})
            )
    return out


def published(settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    got = [(k, v) for k, v, _ in records(settings) if k.startswith(KEY + "|")]
    assert all(v["board"] == BOARD and v["window"] == "season" and v["period"] == FIRST for _, v in got)
    assert all(v["closed_at"] == START + WEEK_MS for _, v in got)
    return [(k, {f: v[f] for f in ("division", "tier", "members", "top")}) for k, v in got]


def test_each_division_is_published_once_with_tiers_and_rewards_and_the_next_season_agrees(setup):
    settings, client = setup
    clock = Clock(START)
    model = play(settings, client, clock)
    first = emitter(settings, client, clock, "w1")
    clock.now = DUE - 1
    assert step(first) == 0  # not due yet
    clock.now = DUE
    assert step(first) == 1
    want = expected(model)
    assert len(want) == 7 and published(settings) == want
    assert {r["new_tier"] for _, v in want for r in v["top"]} == {"bronze", "silver"}  # some moved up
    assert step(first) == 0 and published(settings) == want  # once
    # the members who came back sit where the records put them
    new_tiers = {r["member"]: r["new_tier"] for _, v in want for r in v["top"]}
    nxt = redis_league(client, settings.key_prefix, BOARD, season_id(START + WEEK_MS))
    taken = nxt["taken"].values()
    assert any(-(-n // 3) == 1 for n in taken) and any(n % 3 for n in taken)  # one division; not full
    seats = nxt["seats"]
    assert {m: t for m, (t, _) in seats.items()} == {
        **{m: new_tiers[m] for m in seats if m != "new"},
        "new": "bronze",
    }
    marker = BoardKeys(settings.key_prefix, BOARD).prepared(window_instance("season", FIRST))
    assert (client.get(marker) or b"").startswith(b"sent:")


def _after_commit_before_sent(settings: Settings, client: redis.Redis, clock: Clock) -> None:
    """A leader that died after committing the season's records, before marking it sent."""
    dead = emitter(settings, client, clock, "dead")
    assert step(dead) == 1
    keys = BoardKeys(settings.key_prefix, BOARD)
    sent = periodmark.read_mark(client, keys, window_instance("season", FIRST))
    client.set(
        keys.prepared(window_instance("season", FIRST)), periodmark.sending(sent.partition, sent.offset)
    )
    client.zadd(results_due(settings.key_prefix), {KEY: DUE})


def _after_sending_before_produce(settings: Settings, client: redis.Redis, clock: Clock) -> None:
    """A leader that died after noting the partition's end, before producing."""
    keys = BoardKeys(settings.key_prefix, BOARD)
    client.set(keys.prepared(window_instance("season", FIRST)), periodmark.sending(0, 0))


@pytest.mark.parametrize("death", [_after_commit_before_sent, _after_sending_before_produce])
def test_a_successor_publishes_what_its_predecessor_did_not_and_nothing_it_did(setup, death):
    settings, client = setup
    clock = Clock(START)
    model = play(settings, client, clock)
    clock.now = DUE
    death(settings, client, clock)
    client.delete(results_emitter(settings.key_prefix))  # its lease lapsed
    successor = emitter(settings, client, clock, "w2")
    assert step(successor) == 1
    assert published(settings) == expected(model)
    assert client.zscore(results_due(settings.key_prefix), KEY) is None  # (the next season still due)


def test_a_fenced_zombie_cannot_publish_a_season(setup):
    settings, client = setup
    clock = Clock(START)
    model = play(settings, client, clock)
    zombie = emitter(settings, client, clock, "zombie")
    assert step(zombie) == 0 and zombie.leading
    lease_key = results_emitter(settings.key_prefix)
    client.delete(lease_key)  # paused past its lease
    clock.now = DUE - 1
    successor = emitter(settings, client, clock, "w2")
    assert step(successor) == 0 and successor.leading  # its init_transactions fenced the zombie
    client.set(lease_key, "zombie")
    with pytest.raises(KafkaException):
        zombie.emit(KEY, DUE)
    client.set(lease_key, "w2")
    clock.now = DUE
    assert step(successor) == 1
    assert published(settings) == expected(model)


def test_a_worker_publishes_a_league_seasons_end_on_its_own(setup):
    """The real worker loop (a league type declares no period_results: its results emitter runs
    for the league alone) takes the stream from Kafka and, once the season's grace has passed
    by its clock, publishes the season's records."""
    settings, client = setup
    clock = [START + 1000]
    model = LeagueModel(rules_of("arena"))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    for k in range(12):
        member, score, ts = f"w{k}", float(k % 4), START + k
        value = orjson.dumps({"id": f"w{k}", "board": BOARD, "member": member, "score": score, "ts": ts})
        producer.produce(settings.topic_updates, value, key=BOARD.encode())
        model.apply([league_event(BOARD, member, "incr", score, ts=ts, eid=f"w{k}")])
    assert producer.flush(30) == 0
    seq = BoardKeys(settings.key_prefix, BOARD).seq
    with running_worker(settings, lambda: clock[0]):
        wait_for(lambda: int(client.get(seq) or 0) == 12, 60, "the stream applied")
        assert published(settings) == []
        clock[0] = DUE
        wait_for(lambda: len(published(settings)) == 4, 60, "the season's records")
    assert published(settings) == expected(model)
