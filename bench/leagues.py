"""Leagues (docs/leagues.md): what a league board costs Redis against a plain season board, and
the close of a season of a million members, in one run on a private Redis (AOF on for the cost,
as `rankstream dev` runs it) and Kafka.

1. The same event stream is applied by worker/apply.py's Applier (the worker deciding, as a worker
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
   filled through the Applier (AOF off), by the worker's own results emitter (worker/results.py)
   on a private Kafka: the season sealed, every division read page by page into its record,
   the records produced in one transaction on one partition and committed, the season marked
   sent. `season_close_s_1m`: that pass' wall time; `season_close_max_command_ms`: the longest
   command Redis ran meanwhile (SLOWLOG, every command logged; `season_close_slowest` names it).
Knobs: RANKSTREAM_BENCH_LEAGUE_MEMBERS (100000), _LEAGUE_DIVISION (100), _LEAGUE_CLOSE_MEMBERS
(1000000).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Sequence

import redis

from bench.common import REPO, BenchError, Result, env_int, say
from bench.harness.report import Row, header, met
from bench.harness.stack import Stack, private_stack
from bench.harness.stats import percentile, ratio
from bench.memory import memory_usage, used_memory
from bench.redis_cost import command_profile, member_ids, redis_cpu_s
from common.boards import RESULT_SETTLE_MS, parse_boards
from common.events import Op, UpdateEvent
from common.periods import period_at
from common.store import periodmark
from common.store.keys import BoardKeys, window_instance
from rankstream.topics import ensure_topics
from worker.apply import MAX_EVENTS_PER_CALL, Applier, Position, Source
from worker.main import results_emitter

FOLDER = REPO / ".stack" / "bench-leagues"
PREFIX = "l:"
GOALS = {"league_cpu_vs_season": 1.3, "league_bytes_vs_season": 1.3, "season_close_s_1m": 60.0,
         "season_close_max_command_ms": 1.0}  # fmt: skip
_SHOWN = ("season_us_per_event", "league_us_per_event", "season_bytes_per_member", "league_bytes_per_member",
          "season_close_members", "season_close_divisions", "season_close_commands_over_1ms",
          "season_close_command_p99_us", "members", "division_size")  # fmt: skip
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


def _close(stack: Stack, config: str, n: int, rng: random.Random) -> Result:
    """Fill a league season of n members, then close it with the worker's results emitter: the
    season sealed, every division read, its records produced in one transaction and committed,
    the season marked sent."""
    client = stack.client
    boards = parse_boards(config)
    board_type, board = boards.types["league"], "league:big"
    window = board_type.window("season")
    now = int(time.time() * 1000)
    period = period_at(window, now, boards.timezone)
    assert period is not None
    client.flushall()
    client.config_set("appendonly", "no")
    settings = stack.settings("leagues", key_prefix=PREFIX, topic_results="bench.leagues.rank_period_closed",
                              worker_group="bench-leagues")  # fmt: skip
    ensure_topics(settings)
    applier = Applier(client, boards, PREFIX, 3600, epoch="bench", now_ms=lambda: now)
    source, members = Source("bench", 0, "t", -1), member_ids(n, rng)
    say(f"close: filling a league season of {n} members")
    for start in range(0, n, MAX_EVENTS_PER_CALL):
        span = range(start, min(start + MAX_EVENTS_PER_CALL, n))
        events = [(_event(f"f-{i}", board, members[i], float(1 + i % 997)), now) for i in span]
        applier.apply(events, [Position(source, i, None) for i in span])
    due = period.end_ms + board_type.late_grace_ms + RESULT_SETTLE_MS
    clock = [due - 1]
    emitter = results_emitter(settings, client, boards, "bench", clock=lambda: clock[0], metrics=None)
    emitter.step()  # takes the lease and starts its producer (nothing is due yet)
    clock[0] = due
    client.config_set("slowlog-log-slower-than", "0")
    client.config_set("slowlog-max-len", "1000000")
    client.slowlog_reset()
    say("close: the emitter seals the season, reads every division, publishes their records")
    began = time.monotonic()
    settled = emitter.step()
    took = time.monotonic() - began
    logged = client.slowlog_get(1_000_000)
    slowest = max(logged, key=lambda entry: int(entry["duration"]), default=None)
    longest = 0 if slowest is None else int(slowest["duration"])
    durations = sorted(int(entry["duration"]) for entry in logged)
    sent = periodmark.read_mark(client, BoardKeys(PREFIX, board), window_instance("season", period.id))
    emitter.close()
    client.config_set("slowlog-log-slower-than", "10000")
    client.config_set("appendonly", "yes")
    client.flushall()
    if settled != 1 or sent.state != "sent":
        raise BenchError(f"the season was not closed: settled {settled}, marker {sent.raw!r}")
    return {
        "season_close_s_1m": round(took * 1_000_000 / n, 2),  # scaled to 1M members when fewer
        "season_close_max_command_ms": round(longest / 1000, 3),
        "season_close_members": n,
        "season_close_divisions": -(-n // board_type.league.division_size) if board_type.league else 0,
        "season_close_slowest": None if slowest is None else str(slowest["command"])[:120],
        # how the commands' times fall: one long one on a shared box is the box's stall, not the work
        "season_close_commands": len(durations),
        "season_close_commands_over_1ms": sum(d > 1000 for d in durations),
        "season_close_command_p99_us": percentile(durations, 0.99) if durations else None,
    }


def run() -> Result:
    n, division = env_int("LEAGUE_MEMBERS", 100_000), env_int("LEAGUE_DIVISION", 100)
    head, rng, began = header(), random.Random(20261130), time.monotonic()
    members = member_ids(n, rng)
    repeat = [members[rng.randrange(n)] for _ in range(n)]
    config = _config(division)
    with private_stack(FOLDER, config, persist=True) as stack:
        client = stack.client
        redis_pid = stack.pids()["redis"]
        with contextlib.suppress(PermissionError):  # as bench/rolling.py: the box is shared with Kafka
            os.setpriority(os.PRIO_PROCESS, redis_pid, -10)
        nice = os.getpriority(os.PRIO_PROCESS, redis_pid)
        closed = _close(stack, config, env_int("LEAGUE_CLOSE_MEMBERS", 1_000_000), rng)
        say(
            f"cost: {n} distinct then {n} repeating events, a season board against a league "
            f"(divisions of {division})"
        )
        rounds = [
            {kind: _cost(client, config, kind, members, repeat) for kind in ("season", "league")}
            for _ in range(2)
        ]
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
        **values, "members": n, "division_size": division, "phases": best, "redis_nice": nice,
        "profile": {kind: rounds[-1][kind]["profile"] for kind in ("season", "league")},
        "goals": GOALS, "met": met(values, GOALS, at_most=tuple(GOALS)),
        **head, "duration_s": round(time.monotonic() - began, 1),
    }  # fmt: skip
