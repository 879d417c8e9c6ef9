"""Leagues (docs/contract.md §3) on real Redis, both topologies, both ways a chunk is written
(decided in the worker, or by apply.lua): seats, divisions and standings equal an independent
model's (tests/league_model.py) exactly, over several seasons, with late joiners, members who
never return, ties, deletes, redelivery and erases; and two workers applying one league at once
never seat a member twice or overfill a division."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from typing import Any
from unittest import mock

import orjson
import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.app import create_app
from common.boards import BoardsConfig, parse_boards
from common.events import Op, UpdateEvent
from common.league import Movement, division_instance, parse_seat
from common.periods import period_at
from common.store.encoding import Status, decode_member, tie_mode
from common.store.keys import BoardKeys, window_instance
from rankstream.stack import free_port
from rankstream.topics import ensure_topics
from tests.helpers import BOTH_TOPOLOGIES, committed_so_far, stop_workers, wait_for
from tests.integration.test_worker_oracle import worker_process
from tests.league_model import LeagueEvent, LeagueModel, LeagueRules
from worker.apply import Applier, Position, Source
from worker.decide import Undecidable

pytestmark = pytest.mark.integration

CONFIG = """
timezone: UTC
types:
  arena:
    windows: [total, season]
    seasons: {every_days: 7, anchor: 2026-11-02}
    late_grace: 10d
    league:
      division_size: 3
      tiers: [bronze, silver, gold]
      promote: {bronze: 0.5, silver: 1}
      demote: {silver: 1, gold: 0.5}
      rewards: {top: 1}
  plain: {windows: [total, season], seasons: {every_days: 7, anchor: 2026-11-02}}
  golf:
    order: asc
    windows: [season]
    seasons: {every_days: 7, anchor: 2026-11-02}
    late_grace: 10d
    league: {division_size: 2, tiers: [low, high], promote: {low: 1}, demote: {high: 0.5}}
"""
BOARDS = parse_boards(CONFIG)
ARENA = BOARDS.types["arena"]
SEASON = ARENA.window("season")
WEEK_MS = 7 * 86_400_000
# a season's start three weeks before now: what these tests write expires by Redis' (wall) clock
# (a season's keys four seasons after it) and the worker takes no event stamped later than now
# plus its skew, so the seasons they play are chosen relative to now, never fixed dates
_START = period_at(SEASON, int(time.time() * 1000) - 3 * 7 * 86_400_000, BOARDS.timezone)
assert _START is not None
START = _START.start_ms
SRC = Source("t", 0, "topic-id", -1)
EVENTS = 20_000  # the kill -9 test's stream


def applier(client: Any, prefix: str, *, decided: bool, now: int | list[int]) -> Applier:
    """`now`: the worker's clock, fixed, or a one-item list the test moves."""
    clock = now if isinstance(now, list) else [now]
    return Applier(client, BOARDS, prefix, 3600, epoch="E", state_cells=1_000_000 if decided else 0,
                   now_ms=lambda: clock[0])  # fmt: skip


def rules_of(type_name: str) -> LeagueRules:
    """The model's rules: the type's league as data."""
    board_type = BOARDS.types[type_name]
    league = board_type.league
    assert league is not None

    def rule(m: Movement) -> tuple[str, float]:
        return ("c", float(m.count)) if m.count is not None else ("f", float(m.fraction or 0))

    return LeagueRules(
        league.division_size, league.tiers, league.entry_tier, board_type.order.value == "desc",
        {t: rule(m) for t, m in league.promote.items()}, {t: rule(m) for t, m in league.demote.items()},
        league.rewards_top,
    )  # fmt: skip


def event(board: str, member: str, op: str, score: float, eid: str) -> UpdateEvent:
    return UpdateEvent(id=eid, board=board, board_type=board.split(":", 1)[0], member=member, op=Op(op),
                       score=score, ts=None, meta=None)  # fmt: skip


def season_id(ts: int) -> str:
    period = period_at(SEASON, ts, BOARDS.timezone)
    assert period is not None
    return period.id


def league_event(board: str, member: str, op: str, score: float, *, ts: int, eid: str) -> LeagueEvent:
    """The model's event: its season and the seasons before it still kept (retention 4: 3)."""
    before = [period_at(SEASON, ts - k * WEEK_MS, BOARDS.timezone) for k in (1, 2, 3)]
    earlier = tuple(p.id for p in before if p is not None)  # (none before the seasons' anchor)
    return LeagueEvent(board, member, op, score, season_id(ts), eid, earlier)


def redis_league(client: Any, prefix: str, board: str, season: str, desc: bool = True) -> dict[str, Any]:
    """What Redis holds of a league season: seats, seats taken, each division's standings."""
    keys = BoardKeys(prefix, board)
    inst = window_instance("season", season)
    seats = {k.decode(): tuple(parse_seat(v)) for k, v in client.hgetall(keys.seats(inst)).items()}
    taken = {k.decode(): int(v) for k, v in client.hgetall(keys.seats_taken(inst)).items()}
    board_type = BOARDS.types[board.split(":", 1)[0]]
    assert board_type.league is not None
    mode = tie_mode(board_type)
    divisions = {}
    for tier, count in taken.items():
        for number in range(1, board_type.league.divisions(count) + 1):
            zset = keys.rank(division_instance(inst, tier, number))
            rows = client.zrange(zset, 0, -1, withscores=True, desc=desc)
            divisions[(tier, number)] = [(decode_member(mode, m.decode()), float(s)) for m, s in rows]
    return {"seats": seats, "taken": taken, "divisions": divisions}


def model_league(model: LeagueModel, board: str, season: str) -> dict[str, Any]:
    s = model.season(board, season)
    divisions = {
        (tier, number): s.standings(tier, number, model.rules)
        for tier in s.taken
        for number in range(1, s.divisions(tier, model.rules) + 1)
    }
    return {"seats": dict(s.seats), "taken": dict(s.taken), "divisions": divisions}


def stream(
    rng: random.Random, n: int, members: int, board: str = "arena:x"
) -> list[tuple[UpdateEvent, int, LeagueEvent]]:
    """Events over three seasons: members join late, some never return, scores tie often."""
    out = []
    for k in range(n):
        ts = START + (k * 3 * WEEK_MS) // n  # a third in each season
        member = f"m{rng.randrange(min(members, 3 + k // 4))}"  # members keep joining
        op = rng.choice(["incr", "incr", "incr", "set", "best", "delete"])
        score = float(rng.choice([1, 2, 5, 10, -3]))
        eid = f"e{k}"
        out.append(
            (
                event(board, member, op, score, eid),
                ts,
                league_event(board, member, op, score, ts=ts, eid=eid),
            )
        )
    return out


@BOTH_TOPOLOGIES
@pytest.mark.parametrize("decided", [True, False], ids=["decided", "scripted"])
def test_seats_divisions_and_standings_equal_the_model(rclient: redis.Redis, settings, decided: bool) -> None:
    """Three seasons: each member's tier in the next is where their division's final standings
    put them (promoted, demoted, kept; kept too when absent a season); a batch that crosses a
    season's end is applied in stream order (what comes before the next season's first seat
    counts; a late event after it does not)."""
    rng = random.Random(7)
    events = stream(rng, 600, 40)
    clock = [START]
    a = applier(rclient, settings.key_prefix, decided=decided, now=clock)
    model = LeagueModel(rules_of("arena"))
    for i in range(0, len(events), 37):  # batches of 37, each event at its position
        part = events[i : i + 37]
        clock[0] = max(ts for _, ts, _ in part)  # the worker's clock follows the stream
        positions = [Position(SRC, i + j, None) for j in range(len(part))]
        a.apply([(e, ts) for e, ts, _ in part], positions)
        model.apply(le for _, _, le in part)
        if i == 0:  # redelivered: nothing changes, nobody takes a second seat
            outcomes = a.apply([(e, ts) for e, ts, _ in part], positions)
            assert {o.status for o in outcomes} == {Status.REDELIVERED}
    seasons = sorted({le.season for _, _, le in events if le.season is not None})
    assert len(seasons) == 3
    for season in seasons:
        got = redis_league(rclient, settings.key_prefix, "arena:x", season)
        assert got == model_league(model, "arena:x", season)
        assert max(len(d) for d in got["divisions"].values()) <= 3
    tiers = [{t for t, _ in model.season("arena:x", s).seats.values()} for s in seasons]
    assert tiers[0] == {"bronze"} and tiers[2] == {"bronze", "silver", "gold"}  # members moved
    assert any(n % 3 for s in seasons for n in model.season("arena:x", s).taken.values())  # never filled
    if decided:  # (the API reads what Redis holds: once per topology)
        assert asyncio.run(check_api(settings, model, "arena:x", seasons, clock[0])) > 100


def ranked(rows: list[tuple[str, float]], first: int = 1) -> list[dict[str, Any]]:
    return [
        {"rank": first + k, "member": m, "score": int(s) if s.is_integer() else s}
        for k, (m, s) in enumerate(rows)
    ]


async def check_api(
    settings: Any, model: LeagueModel, board: str, seasons: list[str], now: int, *,
    boards: BoardsConfig = BOARDS, source: str = "redis",
) -> int:  # fmt: skip
    """Every league route against the model: each member's seat, rank, top and neighbours, each
    division's top (from `source`: memory for a hot league), each tier's divisions (Redis)."""
    checked = 0
    app = create_app(settings, boards, clock=lambda: now)
    async with TestClient(TestServer(app)) as http:
        deadline = time.monotonic() + 60
        while (await http.get("/readyz")).status != 200:  # a hot league: replayed into memory
            assert time.monotonic() < deadline, "the API never became ready"
            await asyncio.sleep(0.05)

        async def get(path: str, status: int = 200) -> Any:
            resp = await http.get(f"/v1/boards/{board}/{path}")
            body = await resp.json()
            assert resp.status == status, body
            return body

        for season in seasons:
            s = model.season(board, season)
            rules = model.rules
            for member, (tier, order) in s.seats.items():
                number = order // rules.division_size + 1
                standings = s.standings(tier, number, rules)
                body = await get(f"league/members/{member}?period={season}&n=1&limit=2")
                at = [m for m, _ in standings].index(member) if member in s.scores else None
                around = [] if at is None else ranked(standings[max(0, at - 1) : at + 2], max(0, at - 1) + 1)
                assert body == {
                    "board": board, "season": season, "tier": tier, "division": f"{tier}.{number}",
                    "member": member, "joined": order, "rank": None if at is None else at + 1,
                    "score": None if at is None else ranked(standings)[at]["score"], "around": around,
                    "members": len(standings), "top": ranked(standings[:2]), "source": source,
                    "seq": body["seq"],
                }  # fmt: skip
                checked += 1
            for tier in rules.tiers:
                body = await get(f"league/tiers/{tier}/divisions?period={season}")
                opened = s.divisions(tier, rules)
                assert body["seats"] == s.taken.get(tier, 0) and body["total"] == opened
                assert [d["division"] for d in body["divisions"]] == [
                    f"{tier}.{k}" for k in range(1, opened + 1)
                ]
                for k, d in enumerate(body["divisions"], 1):
                    standings = s.standings(tier, k, rules)
                    assert d["members"] == len(standings)
                    top = await get(f"league/divisions/{tier}.{k}/top?period={season}&limit=100")
                    assert top["items"] == ranked(standings) and top["members"] == len(standings)
                    assert top["source"] == source
                    checked += 1
        # what is not a league read is refused with a reason
        assert (await get("top?window=season", 400))["error"]["code"] == "league_window"
        assert (await get("league/members/nobody", 404))["error"]["code"] == "member_not_found"
        assert (await get("league/divisions/gold/top", 400))["error"]["code"] == "bad_division"
        assert (await get("league/tiers/platinum/divisions", 400))["error"]["code"] == "bad_tier"
        assert (await get("league/divisions/gold.1/top?ties=shared", 400))["error"]["code"] == "bad_parameter"
        resp = await http.get("/v1/boards/plain/league/members/a")
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_a_league"
    return checked


@BOTH_TOPOLOGIES
def test_two_workers_at_once_never_seat_a_member_twice_or_overfill_a_division(
    rclient: redis.Redis, settings
) -> None:
    """Two workers (two partitions of a keyless producer) apply one league concurrently: each
    member has one seat, each tier's seats are numbered 0..n-1 without a gap, each division holds
    at most its size, and each member's total is the model's (increments commute)."""
    now = START + 1000
    members = [f"p{i}" for i in range(60)]
    rng = random.Random(11)
    streams: list[list[tuple[UpdateEvent, int]]] = [[], []]
    totals: dict[str, float] = {}
    for k in range(1200):
        member = rng.choice(members)
        score = float(rng.randrange(1, 5))
        totals[member] = totals.get(member, 0.0) + score
        streams[k % 2].append((event("arena:duo", member, "incr", score, f"d{k}"), START + k))

    def run(n: int) -> None:
        a = applier(rclient, settings.key_prefix, decided=n == 0, now=now)
        src = Source("t", n, "topic-id", -1)
        for i in range(0, len(streams[n]), 20):
            part = streams[n][i : i + 20]
            a.apply(part, [Position(src, i + j, None) for j in range(len(part))])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    got = redis_league(rclient, settings.key_prefix, "arena:duo", season_id(START))
    assert sorted(got["seats"]) == sorted(totals)
    assert got["taken"] == {"bronze": len(totals)}
    check_seats(got, 3)
    assert {m: s for rows in got["divisions"].values() for m, s in rows} == totals


OPS = st.sampled_from(["incr", "incr", "set", "best", "delete"])
SCORES = st.sampled_from([0.0, 1.0, 2.0, -1.0, 2.5, 1e15])


@st.composite
def league_streams(draw: st.DrawFn) -> tuple[str, bool, list[list[tuple[str, str, float, int]]]]:
    """A board type (desc or asc), whether the worker decides, and batches of (member, op,
    score, ts): few members, so divisions fill, scores tie and members come and go across the
    season boundary."""
    board_type = draw(st.sampled_from(["arena", "golf"]))
    decided = draw(st.booleans())
    members = st.sampled_from([f"u{k}" for k in range(draw(st.integers(1, 8)))])
    times = [START + 1, START + WEEK_MS - 1, START + WEEK_MS, START + WEEK_MS + 1, START + 2 * WEEK_MS]
    event = st.tuples(members, OPS, SCORES, st.sampled_from(times))
    return (
        board_type,
        decided,
        draw(st.lists(st.lists(event, min_size=1, max_size=8), min_size=1, max_size=5)),
    )


@hsettings(deadline=None, max_examples=300, database=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=league_streams())
def test_any_league_stream_matches_the_model(case, rclient, settings) -> None:
    """Ops, ties, deletes, members across two seasons, redelivered batches: Redis ends as the
    model says, whichever way the worker writes."""
    board_type, decided, batches = case
    board = f"{board_type}:{uuid.uuid4().hex[:8]}"
    model = LeagueModel(rules_of(board_type))
    desc = model.rules.desc
    clock = [START]
    a = applier(rclient, settings.key_prefix, decided=decided, now=clock)
    offset = 0
    for batch in batches:
        pairs: list[tuple[UpdateEvent, int, LeagueEvent]] = []
        for member, op, score, ts in batch:
            eid = f"h{offset + len(pairs)}"
            pairs.append(
                (
                    event(board, member, op, score, eid),
                    ts,
                    league_event(board, member, op, score, ts=ts, eid=eid),
                )
            )
        clock[0] = max(clock[0], *(ts for _, ts, _ in pairs))
        positions = [Position(SRC, offset + j, None) for j in range(len(pairs))]
        a.apply([(e, ts) for e, ts, _ in pairs], positions)
        a.apply([(e, ts) for e, ts, _ in pairs], positions)  # redelivered: changes nothing
        model.apply(le for _, _, le in pairs)
        offset += len(pairs)
    for season in {season_id(START + k * WEEK_MS) for k in range(3)}:
        assert redis_league(rclient, settings.key_prefix, board, season, desc) == model_league(
            model, board, season
        )


LIVE_CONFIG = """
timezone: UTC
types:
  arena:
    windows: [total, season]
    seasons: {every_days: 7, anchor: 2026-11-02}
    league: {division_size: 7, tiers: [bronze, silver]}
"""


def league_totals(client: Any, prefix: str, board: str) -> tuple[dict[str, float], int]:
    """Every member's score summed over the seasons Redis holds, checking on the way that each
    season seats each member once, numbers each tier's seats 0..n-1 and keeps every member in
    their seat's division only; and the seats taken."""
    totals: dict[str, float] = {}
    seated = 0
    keys = BoardKeys(prefix, board)
    for raw in client.scan_iter(match=f"{keys.tag}:lg:season:*:s", count=1000):
        season = raw.decode().split(":lg:season:", 1)[1].removesuffix(":s")
        got = redis_league(client, prefix, board, season)
        check_seats(got, 7)
        for rows in got["divisions"].values():
            for member, score in rows:
                totals[member] = totals.get(member, 0.0) + score
        seated += len(got["seats"])
    return totals, seated


def check_seats(got: dict[str, Any], size: int) -> None:
    """One seat per member, each tier's seats numbered 0..n-1, no division over its size, each
    member in their seat's division only."""
    orders: dict[str, list[int]] = {}
    for tier, order in got["seats"].values():
        orders.setdefault(tier, []).append(order)
    assert {t: sorted(o) for t, o in orders.items()} == {t: list(range(n)) for t, n in got["taken"].items()}
    listed = [m for rows in got["divisions"].values() for m, _ in rows]
    assert len(listed) == len(set(listed)), "a member in two divisions"
    for (tier, number), rows in got["divisions"].items():
        assert len(rows) <= size, f"division {tier}.{number} holds {len(rows)}"
        for member, _ in rows:
            seat = got["seats"][member]
            assert (seat[0], seat[1] // size + 1) == (tier, number)


def test_seats_counted_from_a_stale_count_would_be_caught(rclient: redis.Redis, settings) -> None:
    """What place.lua's atomicity prevents, done by hand: two workers each read the seats taken,
    then seat their own members from that count. The seat check catches it (two members on one
    seat), so the concurrent tests' passing says something."""
    keys = BoardKeys(settings.key_prefix, "arena:stale")
    inst = window_instance("season", season_id(START))
    taken = int(rclient.hget(keys.seats_taken(inst), "bronze") or 0)  # worker a reads ...
    again = int(rclient.hget(keys.seats_taken(inst), "bronze") or 0)  # ... and so does worker b
    for member, order in (("a1", taken), ("b1", again)):
        rclient.hset(keys.seats(inst), member, f"bronze:{order}")
        rclient.hset(keys.seats_taken(inst), "bronze", order + 1)
    with pytest.raises(AssertionError):
        check_seats(redis_league(rclient, settings.key_prefix, "arena:stale", season_id(START)), 3)


@BOTH_TOPOLOGIES
@pytest.mark.slow
def test_two_workers_and_a_kill_9_on_a_keyless_stream_seat_each_member_once(make_settings, tmp_path, rclient):
    """A keyless producer spreads one league's events over every partition; two worker
    processes apply them at once, one is killed -9 mid-stream and a new one takes its place
    (redelivery): every member ends with one seat, no division overfills, and every total is
    exact (increments commute)."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(LIVE_CONFIG)
    settings = make_settings(boards=boards)
    ensure_topics(settings)
    rng = random.Random(5)
    totals: dict[str, float] = {}
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
    for k in range(EVENTS):
        member = f"p{rng.randrange(400)}"
        score = rng.randrange(1, 9)
        totals[member] = totals.get(member, 0.0) + score
        value = orjson.dumps(
            {"id": f"k{k}", "board": "arena:live", "member": member, "score": score, "op": "incr"}
        )
        producer.produce(settings.topic_updates, value, key=None)  # keyless: any partition
        if k % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    slow = {"RANKSTREAM_WORKER_BATCH_SIZE": "200"}
    a = worker_process(settings, free_port(), worker_id="pod-a", extra_env=slow)
    b = worker_process(settings, free_port(), worker_id="pod-b", extra_env=slow)
    c = None
    seq = BoardKeys(settings.key_prefix, "arena:live").seq
    try:
        wait_for(lambda: int(rclient.get(seq) or 0) > EVENTS * 0.3, 90, "30% applied")
        a.kill()  # kill -9, mid-stream: what it applied but did not commit comes again
        a.wait(10)
        assert int(rclient.get(seq) or 0) < EVENTS, "the kill came too late to test anything"
        c = worker_process(settings, free_port(), worker_id="pod-a", extra_env=slow)
        wait_for(lambda: committed_so_far(settings) == EVENTS, 120, "every event committed")
    finally:
        stop_workers(a, b, c)
    assert int(rclient.get(seq) or 0) == EVENTS  # each event applied once
    got, seated = league_totals(rclient, settings.key_prefix, "arena:live")
    assert got == totals
    assert seated >= len(totals)  # (a member seen in two seasons has a seat in each)


@BOTH_TOPOLOGIES
def test_an_erase_and_a_reset_empty_divisions_and_keep_seats(rclient: redis.Redis, settings) -> None:
    """An erase removes the member from their division (their seat stays: nobody takes it); a
    reset of the season empties every division of it, seats and all their counts kept; the
    members' next events count in the same divisions again."""
    now = START + 1000
    clock = [now]
    a = applier(rclient, settings.key_prefix, decided=True, now=clock)
    board, season = "arena:ctl", season_id(START)
    a.apply([(event(board, f"c{k}", "incr", float(10 - k), f"c{k}"), START + k) for k in range(7)])
    before = redis_league(rclient, settings.key_prefix, board, season)
    assert before["taken"] == {"bronze": 7} and len(before["divisions"]) == 3

    erase = UpdateEvent(
        id="x1", board=board, board_type="arena", member="c4", op=Op.ERASE, score=0.0, ts=None, meta=None
    )
    (outcome,) = a.apply([(erase, now)])
    assert outcome.status is Status.APPLIED
    got = redis_league(rclient, settings.key_prefix, board, season)
    assert got["seats"] == before["seats"] and got["taken"] == before["taken"]
    assert got["divisions"][("bronze", 2)] == [("c3", 7.0), ("c5", 5.0)]
    a.apply([(event(board, "new", "incr", 1.0, "n1"), START + 50)])  # takes seat 7, not c4's
    assert redis_league(rclient, settings.key_prefix, board, season)["seats"]["new"] == ("bronze", 7)

    reset = UpdateEvent(
        id="r1", board=board, board_type="arena", member="season", op=Op.RESET, score=0.0, ts=None, meta=None
    )
    (outcome,) = a.apply([(reset, now)])
    assert outcome.status is Status.APPLIED
    got = redis_league(rclient, settings.key_prefix, board, season)
    assert got["taken"] == {"bronze": 8} and all(rows == [] for rows in got["divisions"].values())
    a.apply(
        [
            (event(board, "c4", "incr", 3.0, "c4b"), START + 60),
            (event(board, "c0", "incr", 3.0, "c0b"), START + 61),
        ]
    )
    got = redis_league(rclient, settings.key_prefix, board, season)
    assert got["divisions"][("bronze", 1)] == [("c0", 3.0)] and got["divisions"][("bronze", 2)] == [
        ("c4", 3.0)
    ]
    # a season sealed by the next one's first seat: an erase still reaches its divisions
    clock[0] = START + WEEK_MS + 2
    a.apply([(event(board, "later", "incr", 1.0, "l1"), START + WEEK_MS + 1)])
    assert (
        rclient.get(BoardKeys(settings.key_prefix, board).prepared(window_instance("season", season)))
        == b"sealed"
    )
    a.apply([(erase._replace(id="x2", member="c0"), clock[0])])
    assert redis_league(rclient, settings.key_prefix, board, season)["divisions"][("bronze", 1)] == []


@BOTH_TOPOLOGIES
def test_a_chunk_over_more_divisions_than_a_call_holds_is_cut_for_apply_lua(
    rclient: redis.Redis, settings
) -> None:
    """The worker decides a league's chunk over up to 1,024 divisions; one it can't decide after
    all (here: the decision is refused) goes to apply.lua in calls of at most 53 instances, in order."""
    rng = random.Random(3)
    a = applier(rclient, settings.key_prefix, decided=True, now=START + 2 * WEEK_MS - 1)
    assert a.states is not None
    refuse = mock.patch("worker.boardstate.decide", side_effect=Undecidable("a test's"))
    model = LeagueModel(rules_of("arena"))
    for round_ in range(3):
        batch = []
        for k in range(400):  # 400 members: 134 divisions of 3
            member, eid = f"w{rng.randrange(400) if round_ else k}", f"r{round_}-{k}"
            batch.append(
                (
                    event("arena:wide", member, "incr", 1.0, eid),
                    START + 5,
                    league_event("arena:wide", member, "incr", 1.0, ts=START + 5, eid=eid),
                )
            )
        with refuse:
            outcomes = a.apply(
                [(e, ts) for e, ts, _ in batch], [Position(SRC, round_ * 400 + j, None) for j in range(400)]
            )
        assert all(o.status is Status.APPLIED for o in outcomes)
        model.apply(le for _, _, le in batch)
    assert a.states.stats.fallbacks > 0
    got = redis_league(rclient, settings.key_prefix, "arena:wide", season_id(START))
    assert got == model_league(model, "arena:wide", season_id(START))


def test_a_batch_swinging_between_two_seasons_is_applied_in_order(rclient: redis.Redis, settings) -> None:
    """New members of a season and late events of the one before, alternating in one batch of
    600: the batch is cut at each new season's seat while the old season is open, never
    recursing, and what comes after the old season is sealed counts nowhere in the league."""
    a = applier(rclient, settings.key_prefix, decided=True, now=START + WEEK_MS + 10)
    model = LeagueModel(rules_of("arena"))
    batch = []
    for k in range(300):
        for member, ts in ((f"n{k}", START + WEEK_MS + 1), (f"o{k}", START + 5)):
            eid = f"{member}-{ts}"
            batch.append(
                (
                    event("arena:swing", member, "incr", 1.0, eid),
                    ts,
                    league_event("arena:swing", member, "incr", 1.0, ts=ts, eid=eid),
                )
            )
    outcomes, failures = a.apply_isolated(
        [(e, ts) for e, ts, _ in batch], [Position(SRC, j, None) for j in range(600)]
    )
    assert failures == [] and len(outcomes) == 600
    model.apply(le for _, _, le in batch)
    for season in (season_id(START), season_id(START + WEEK_MS)):
        assert redis_league(rclient, settings.key_prefix, "arena:swing", season) == model_league(
            model, "arena:swing", season
        )
    assert len(model.season("arena:swing", season_id(START)).seats) == 0  # sealed by n0's seat first


def test_a_division_emptied_by_the_worker_and_written_again_expires(rclient: redis.Redis, settings) -> None:
    """A delete that empties a division drops its key, expiry and all: the worker's next write
    there sets the expiry again (as apply.lua always does)."""
    a = applier(rclient, settings.key_prefix, decided=True, now=START + 1000)
    board = "arena:empty"
    a.apply([(event(board, "e1", "incr", 1.0, "x1"), START + 1)], [Position(SRC, 0, None)])
    a.apply([(event(board, "e1", "delete", 0.0, "x2"), START + 2)], [Position(SRC, 1, None)])
    key = BoardKeys(settings.key_prefix, board).rank(
        division_instance(window_instance("season", season_id(START)), "bronze", 1)
    )
    assert not rclient.exists(key)
    a.apply([(event(board, "e1", "incr", 2.0, "x3"), START + 3)], [Position(SRC, 2, None)])
    assert rclient.zcard(key) == 1 and rclient.pttl(key) > 0
