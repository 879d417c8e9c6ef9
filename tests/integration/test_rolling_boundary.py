"""A board of RANKSTREAM_TEST_BOARD_MEMBERS (20k) members whose rolling window `last_3h` crosses an
hour boundary under load: the period worker/rolling.py prepares ahead is exactly right.

Buckets are UTC hours; late in bucket q (its claim) the preparer prepares period q+1.
1. Clock early in q (period q-1 still in its late grace): one event per member, its ts in q-2,
   q-1, q or q+1 (Applier, two threads).
2. Clock in q: incr, set, best, incr 0 and delete events with ts in q-2 .. q+1 for some members.
3. Clock at q's claim: a thread applies events at a steady rate while another runs the
   preparer, which prepares q+1; once it is whole the clock jumps to just before q+1 and crosses
   it, the old period q-1's keys expire then (lazyfree-lazy-expire on), the load goes on 2 s.
Then q+1, now current, must hold exactly, per member, the sum of its values in buckets q-1, q and
q+1 (per bucket: incr adds, set overwrites, best keeps the higher; a delete empties every
bucket), present iff it has an event there since its last delete, tied at the latest such
event's ts: worked out here from the events applied, nothing from worker/ or common/store.
Redis expires keys on its own clock: the simulated clock stays within ~1 h 15 min of it and every
key the test writes expires after the test ends.

How long Redis is held meanwhile (derive calls against the load's apply calls, the longest command,
the expire cycle of a 1M-member period) is a load figure, not a behaviour: bench/rolling.py
measures it on a 1M-member board (`make bench`, goals in bench/results/rolling.json). Set
RANKSTREAM_TEST_BOARD_MEMBERS=1000000 to run this exactness check at that size (~4-7 minutes).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
import redis

from common.boards import parse_boards
from common.events import Op, UpdateEvent
from common.store.encoding import TIE_MAX, TIE_WIDTH
from worker.apply import Applier
from worker.rolling import RollingPreparer, claim_lead_ms

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # 1M members: 6 min on a slow day

HOUR = 3_600_000
MEMBERS = int(os.environ.get("RANKSTREAM_TEST_BOARD_MEMBERS", "20000"))
LATER = max(2_000, MEMBERS // 25)  # phase 2's events (every op, every bucket)
BOARDS = parse_boards("timezone: UTC\ntypes:\n  big: {windows: [last_3h]}\n")  # desc, tie first
BOARD, WINDOW = "big:r1", "last_3h"
CHUNK = 500
LOAD_RATE, TICK_S, AFTER_CROSSING_S = 1500, 0.02, 2.0
PREPARE_WAIT_S = 600  # 1M members prepared under load: 35 s on a quiet box, 150 s on a slow one

Event = tuple[str, str, int, float, int]  # member, op, bucket (-2 .. 1, from q), score, ts


def _hour_id(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H", time.gmtime(ms // 1000))


class _Sim:
    """The simulated clock: real time plus an offset (threads share it)."""

    def __init__(self) -> None:
        self.offset = 0

    def now(self) -> int:
        return int(time.time() * 1000) + self.offset

    def set(self, at: int) -> None:
        self.offset = at - int(time.time() * 1000)


def _first_event(i: int, q: int) -> Event:
    """Member i's one event of phase 1: bucket q-2 (10 %), q-1 (50 %), q (10 %) or q+1 (30 %)."""
    bucket = (-2, -1, -1, -1, -1, -1, 0, 1, 1, 1)[i % 10]
    return f"u{i}", "incr", bucket, float(1 + i % 1000), q + bucket * HOUR + i % 1_700_000


def _apply(applier: Applier, events: list[Event], tag: str) -> None:
    batch = [
        (UpdateEvent(f"{tag}{k}", BOARD, "big", member, Op(op), score, ts, None), ts)
        for k, (member, op, _, score, ts) in enumerate(events)
    ]
    applier.apply(batch)


def _later_events(rng: random.Random, q: int, now: int) -> list[Event]:
    """Phase 2's events in stream order: every op, every bucket of the window and the one leaving."""
    out: list[Event] = []
    for k in range(LATER):
        member = f"u{rng.randrange(MEMBERS)}" if k % 50 else f"n{k}"
        bucket = rng.choice((-2, -1, 0, 0, 0, 1))
        ts = q + bucket * HOUR + rng.randrange(HOUR if bucket else now - q)
        op = rng.choice(("incr", "incr", "incr", "set", "best"))
        out.append((member, op, bucket, float(rng.randrange(0, 300)), ts))
        if k % 200 == 7:
            out.append((f"u{rng.randrange(MEMBERS)}", "delete", 0, 0.0, now))
        if k % 1000 == 11:
            out.append((f"z{k}", "incr", 0, 0.0, now))  # present with 0
    return out


def _expected(q: int, later: list[Event]) -> dict[str, tuple[float, int]]:
    """Period q+1 (buckets q-1 .. q+1) per member: (score, tie)."""
    buckets: dict[str, dict[int, tuple[float, int]]] = {}  # the members of later events
    for member, op, bucket, score, ts in later:
        mine = buckets.get(member)
        if mine is None:
            first = _first_event(int(member[1:]), q) if member[0] == "u" else None
            mine = buckets[member] = {} if first is None else {first[2]: (first[3], first[4])}
        if op == "delete":
            mine.clear()
            continue
        value, tie = mine.get(bucket, (None, ts))
        if op == "incr":
            value = (value or 0.0) + score
        elif op == "set" or value is None or score > value:
            value = score
        mine[bucket] = (value, max(tie, ts))
    out = {}
    for i in range(MEMBERS):
        member, _, bucket, score, ts = _first_event(i, q)
        if bucket >= -1 and member not in buckets:
            out[member] = (score, ts)
    for member, mine in buckets.items():
        counted = [vt for b, vt in mine.items() if b >= -1]
        if counted:
            out[member] = (sum(v for v, _ in counted), max(t for _, t in counted))
    return out


def _period(client: redis.Redis, key: str) -> dict[str, tuple[float, int]]:
    out = {}
    for start in range(0, client.zcard(key), 200_000):
        rows = cast("list[tuple[bytes, float]]", client.zrange(key, start, start + 199_999, withscores=True))
        for raw, score in rows:
            encoded = raw.decode()
            out[encoded[TIE_WIDTH:]] = (score, TIE_MAX - int(encoded[:TIE_WIDTH], 16))  # tie first, desc
    return out


def _loop(stop: threading.Event, body: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            body()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_rolling_board_prepared_under_load_crosses_a_boundary_exactly(settings, rclient):
    prefix, sim, rng = settings.key_prefix, _Sim(), random.Random(12)
    url = settings.redis_url.get_secret_value()
    # q + 1 h: the first expiry of a key the test writes (period q-1's), after the test ends
    q = (int(time.time() * 1000) + 15 * 60_000) // HOUR * HOUR
    tag = f"{prefix}{{{BOARD}}}"
    saved = rclient.config_get("lazyfree-lazy-expire")
    took = [("start", time.monotonic())]
    rclient.config_set("lazyfree-lazy-expire", "yes")
    try:
        # 1. early in q: every member's first event, two threads (their members apart)
        sim.set(q + 60_000)
        appliers = [
            Applier(redis.Redis.from_url(url), BOARDS, prefix, 3600, now_ms=sim.now) for _ in range(2)
        ]

        def fill(part: int) -> None:
            for start in range(part * CHUNK * 10, MEMBERS, 2 * CHUNK * 10):
                span = range(start, min(start + CHUNK * 10, MEMBERS))
                _apply(appliers[part], [_first_event(i, q) for i in span], f"f{start}-")

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(fill, range(2)))
        took.append(("fill", time.monotonic()))
        # 2. later events in stream order
        sim.set(q + 20 * 60_000)
        later = _later_events(rng, q, sim.now())
        for start in range(0, len(later), CHUNK):
            _apply(appliers[0], later[start : start + CHUNK], f"p{start}-")
        took.append(("later events", time.monotonic()))
        # 3. q+1 prepared under load, then across the boundary, the old period q-1 expiring
        old = [f"{tag}:z:{WINDOW}:{_hour_id(q - HOUR)}", f"{tag}:t:{WINDOW}:{_hour_id(q - HOUR)}"]
        old += [k.decode() for k in rclient.scan_iter(match=f"{old[1]}:*", count=10_000)]
        preparer = RollingPreparer(
            redis.Redis.from_url(url, client_name="preparer"), BOARDS, prefix,
            clock=sim.now, epoch=lambda: "unmanaged", owner="t",
        )  # fmt: skip
        loader = Applier(redis.Redis.from_url(url, client_name="load"), BOARDS, prefix, 3600, now_ms=sim.now)
        stop, load_rng, load = threading.Event(), random.Random(13), cast("list[Event]", [])

        def tick() -> None:
            now, started = sim.now(), time.monotonic()
            bucket = 1 if now >= q + HOUR else 0
            batch = [
                (f"u{load_rng.randrange(MEMBERS)}", "incr", bucket, float(load_rng.randrange(1, 50)), now)
                for _ in range(int(LOAD_RATE * TICK_S))
            ]
            _apply(loader, batch, f"l{len(load)}-")
            load.extend(batch)
            time.sleep(max(0.0, TICK_S - (time.monotonic() - started)))

        def prepare() -> None:
            if not preparer.step():
                time.sleep(0.05)

        sim.set(q + HOUR - claim_lead_ms(HOUR, MEMBERS))  # the claim comes at once
        threads = [_loop(stop, tick), _loop(stop, prepare)]
        try:
            deadline = time.monotonic() + PREPARE_WAIT_S
            while rclient.get(f"{tag}:rp:{WINDOW}:{_hour_id(q + HOUR)}") != b"done":
                assert time.monotonic() < deadline, f"q+1 was not prepared within {PREPARE_WAIT_S} s"
                time.sleep(0.1)
            took.append(("prepare q+1 under load", time.monotonic()))
            sim.set(q + HOUR - 2_000)
            while sim.now() < q + HOUR:
                time.sleep(0.01)
            expire_at = int(time.time() * 1000) + 100
            pipe = rclient.pipeline(transaction=False)
            for key in old:
                pipe.pexpireat(key, expire_at)
            pipe.execute()
            time.sleep(AFTER_CROSSING_S)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        took.append(("crossing", time.monotonic()))
    finally:
        rclient.config_set("lazyfree-lazy-expire", saved["lazyfree-lazy-expire"])
    assert not any(thread.is_alive() for thread in threads)
    assert load, "the load applied nothing"

    # the period prepared ahead, now current, is exactly the definition over every event applied
    got = _period(rclient, f"{tag}:z:{WINDOW}:{_hour_id(q + HOUR)}")
    want = _expected(q, later + load)
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    wrong = [(m, got[m], want[m]) for m in want.keys() & got.keys() if got[m] != want[m]]
    assert (len(missing), len(extra), len(wrong)) == (0, 0, 0), (
        sorted(missing)[:5], sorted(extra)[:5], sorted(wrong)[:5],
    )  # fmt: skip
    took.append(("check", time.monotonic()))
    print("seconds:", {name: round(t - took[k][1], 1) for k, (name, t) in enumerate(took[1:])})
    # what the check stands on: the period was derived page by page while the load ran, the load
    # wrote on both sides of the boundary, and the old period's keys expired under it
    assert preparer.stats.members >= MEMBERS // 2 and preparer.stats.calls > 1, preparer.stats
    assert {bucket for _, _, bucket, _, _ in load} == {0, 1}, "the load did not run across the boundary"
    assert not any(rclient.exists(key) for key in old[:2]), "period q-1 did not expire"
