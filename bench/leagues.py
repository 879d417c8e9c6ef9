"""Leagues (docs/leagues.md): what a league board costs Redis against a plain season board, in
one run on one private Redis (AOF on, as `rankstream dev` runs it; no Kafka).

The same event stream is applied by worker/apply.py's Applier (the worker deciding, as a worker
owning its partitions does) in calls of MAX_EVENTS_PER_CALL to a board of a type with windows
[season] (`season`), and to one whose season is a league (`league`: divisions of DIVISION,
three tiers): MEMBERS distinct members (each one's first event of the season: the league seats
them), then as many events drawn uniformly from them. Best of two rounds.
- `league_cpu_vs_season`: Redis CPU per event (INFO cpu: used_cpu_user + used_cpu_sys), the
  two phases averaged, league over season.
- `league_bytes_vs_season`: used_memory's growth over the distinct phase per member (the id
  window's and the fence's keys left out by their MEMORY USAGE, as bench/redis_cost.py does),
  league over season.
`profile`: INFO commandstats per event of each phase, for each board (where the rest goes).
2. The close of a season of CLOSE_MEMBERS members in divisions of DIVISION (1M in 10,000),
   filled through the Applier (AOF off): the season sealed, then every division read page by
   page into its record (common/league_results.py `season_end`, what the results emitter does
   before producing them). `season_close_s_1m`: its wall time; `season_close_max_command_ms`:
   the longest command Redis ran meanwhile (SLOWLOG, every command logged). Producing the
   records to Kafka (one transaction, `season_close_record_bytes` before compression) is not
   part of it: this benchmark runs no Kafka.
Knobs: RANKSTREAM_BENCH_LEAGUE_MEMBERS (100000), _LEAGUE_DIVISION (100), _LEAGUE_CLOSE_MEMBERS
(1000000).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import redis

from bench.common import REPO, Result, env_int, say
from bench.harness.report import Row, header, met
from bench.harness.stats import ratio
from bench.memory import memory_usage, used_memory
from bench.redis_cost import command_profile, member_ids, redis_cpu_s
from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.league_results import season_end
from common.periods import expire_at_ms, period_at
from common.store import periodmark
from common.store.keys import BoardKeys, window_instance
from rankstream.stack import LocalRedis, free_port
from worker.apply import MAX_EVENTS_PER_CALL, Applier, Position, Source

FOLDER = REPO / ".stack" / "bench-leagues"
PREFIX = "l:"
GOALS = {"league_cpu_vs_season": 1.3, "league_bytes_vs_season": 1.3, "season_close_s_1m": 60.0,
         "season_close_max_command_ms": 1.0}  # fmt: skip
_SHOWN = ("season_us_per_event", "league_us_per_event", "season_bytes_per_member", "league_bytes_per_member",
          "season_close_divisions", "season_close_record_bytes", "members", "division_size")  # fmt: skip
ROWS = [*(Row(goal, goal, at_most=True) for goal in GOALS), *(Row(name) for name in _SHOWN)]


def _config(division: int) -> str:
    season = "windows: [season], seasons: {every_days: 7, anchor: 2026-01-05}"
    league = f"league: {{division_size: {division}, tiers: [bronze, silver, gold]}}"
    return f"timezone: UTC\ntypes:\n  season: {{{season}}}\n  league: {{{season}, {league}}}\n"


def _event(eid: str, board: str, member: str, score: float) -> UpdateEvent:
    return UpdateEvent(eid, board, board.split(":", 1)[0], member, Op.INCR, score, None, None)


def _cost(
    client: redis.Redis, config: str, type_name: str, members: Sequence[str], repeat: Sequence[str]
) -> Result:
    now = int(time.time() * 1000)
    applier = Applier(client, parse_boards(config), PREFIX, 3600, epoch="bench", now_ms=lambda: now)
    source, board = Source("bench", 0, "t", -1), f"{type_name}:room1"
    client.flushall()

    def phase(tag: str, who: Sequence[str], first: int) -> float:
        before = redis_cpu_s(client)
        for start in range(0, len(who), MAX_EVENTS_PER_CALL):
            span = range(start, min(start + MAX_EVENTS_PER_CALL, len(who)))
            events = [(_event(f"{tag}-{i}", board, who[i], float(1 + i % 97)), now) for i in span]
            applier.apply(events, [Position(source, first + i, None) for i in span])
        return 1e6 * (redis_cpu_s(client) - before) / len(who)

    base = used_memory(client)
    client.config_resetstat()
    distinct = phase("d", members, 0)
    distinct_profile = command_profile(client, len(members))
    side = [*client.scan_iter(match=f"{PREFIX}{{{board}}}:i*", count=10_000), f"{PREFIX}{{{board}}}:fence"]
    held = used_memory(client) - base - memory_usage(client, side)
    client.config_resetstat()
    repeating = phase("r", repeat, len(members))
    return {
        "distinct": distinct,
        "repeating": repeating,
        "bytes_per_member": held / len(members),
        "profile": {"distinct": distinct_profile, "repeating": command_profile(client, len(repeat))},
    }


def _close(client: redis.Redis, config: str, n: int, rng: random.Random) -> Result:
    """Fill a league season of n members, then close it as the results emitter does (Redis' part)."""
    boards = parse_boards(config)
    board_type, board = boards.types["league"], "league:big"
    window = board_type.window("season")
    now = int(time.time() * 1000)
    period = period_at(window, now, boards.timezone)
    assert period is not None
    client.flushall()
    client.config_set("appendonly", "no")
    applier = Applier(client, boards, PREFIX, 3600, epoch="bench", now_ms=lambda: now)
    source, members = Source("bench", 0, "t", -1), member_ids(n, rng)
    say(f"close: filling a league season of {n} members")
    for start in range(0, n, MAX_EVENTS_PER_CALL):
        span = range(start, min(start + MAX_EVENTS_PER_CALL, n))
        events = [(_event(f"f-{i}", board, members[i], float(1 + i % 997)), now) for i in span]
        applier.apply(events, [Position(source, i, None) for i in span])
    client.config_set("slowlog-log-slower-than", "0")
    client.config_set("slowlog-max-len", "1000000")
    client.slowlog_reset()
    say("close: sealing the season and reading every division")
    began = time.monotonic()
    keys = BoardKeys(PREFIX, board)
    expire = expire_at_ms(window, period, board_type.retention["season"], boards.timezone)
    periodmark.seal(client, keys, window_instance("season", period.id), expire)
    end = season_end(client, PREFIX, board_type, board, period)
    took = time.monotonic() - began
    logged = client.slowlog_get(1_000_000)
    slowest = max(logged, key=lambda entry: int(entry["duration"]), default=None)
    longest = 0 if slowest is None else int(slowest["duration"])
    client.config_set("slowlog-log-slower-than", "10000")
    client.config_set("appendonly", "yes")
    client.flushall()
    return {
        "season_close_s_1m": round(took * 1_000_000 / n, 2),  # scaled to 1M members when fewer
        "season_close_max_command_ms": round(longest / 1000, 3),
        "season_close_members": end.members,
        "season_close_divisions": len(end.records),
        "season_close_record_bytes": sum(len(v) for _, v in end.records),
        "season_close_slowest": None if slowest is None else str(slowest["command"])[:120],
    }


def run() -> Result:
    n, division = env_int("LEAGUE_MEMBERS", 100_000), env_int("LEAGUE_DIVISION", 100)
    head, rng, began = header(), random.Random(20261130), time.monotonic()
    members = member_ids(n, rng)
    repeat = [members[rng.randrange(n)] for _ in range(n)]
    config = _config(division)
    server = LocalRedis("redis", FOLDER / "redis", port=free_port(), persist=True)
    server.start()
    client = redis.Redis(port=server.port, client_name="bench")
    try:
        closed = _close(client, config, env_int("LEAGUE_CLOSE_MEMBERS", 1_000_000), rng)
        say(
            f"cost: {n} distinct then {n} repeating events, a season board against a league "
            f"(divisions of {division})"
        )
        rounds = [
            {kind: _cost(client, config, kind, members, repeat) for kind in ("season", "league")}
            for _ in range(2)
        ]
    finally:
        client.close()
        server.stop()
    best = {
        kind: {
            k: round(min(r[kind][k] for r in rounds), 2)
            for k in ("distinct", "repeating", "bytes_per_member")
        }
        for kind in ("season", "league")
    }
    us = {kind: (best[kind]["distinct"] + best[kind]["repeating"]) / 2 for kind in best}
    values = {
        "league_cpu_vs_season": ratio(us["league"], us["season"]),
        "league_bytes_vs_season": ratio(
            best["league"]["bytes_per_member"], best["season"]["bytes_per_member"]
        ),
        "season_us_per_event": round(us["season"], 2),
        "league_us_per_event": round(us["league"], 2),
        "season_bytes_per_member": best["season"]["bytes_per_member"],
        "league_bytes_per_member": best["league"]["bytes_per_member"],
        **closed,
    }
    return {
        **values, "members": n, "division_size": division, "phases": best,
        "profile": {kind: rounds[-1][kind]["profile"] for kind in ("season", "league")},
        "goals": GOALS, "met": met(values, GOALS, at_most=tuple(GOALS)),
        **head, "duration_s": round(time.monotonic() - began, 1),
    }  # fmt: skip
