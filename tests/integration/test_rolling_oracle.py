"""Rolling windows end to end: real Kafka and Redis, the worker and an API node in-process on one
simulated service clock. About six weeks of events in America/New_York (tests/rolling_stream.py)
cross hour, day, ISO-week and month boundaries and the fall-back DST change, on a desc board type
with tie_break first (last_72h, last_3d, last_2w, last_2m) and an asc one with tie_break last
(last_6h, last_1d, last_1w, last_1m), a hot and a cold board of each. At probe steps (the last ms
before and the first ms after each boundary, the end of some late graces, instants in between)
every rolling window's previous, current and next period in Redis, and the current and previous
periods through the API with trend=1 (from memory for the hot boards, from Redis for the cold
ones), must equal the independent model of tests/rolling_model.py exactly; at the end every
rolling period ever written to Redis must hold its final state (closed periods included), and a
node started late replays the hot boards.

The boundary protocol: the worker prepares rolling period q+1 late in bucket q (its last quarter)
for the boards the registry `{rolling}:<unit>:<bucket q>` names, and sets
`<tag>:rp:<window>:<q+1 id>` to `done` when it is whole. Before the clock crosses into a new
bucket it stops at the bucket's last ms (no event is processed there) until those markers are
set, so the period that becomes current is whole in Redis the moment the clock reaches it; a
next period is compared once its marker is set. Before a probe the test also waits until the hot
node applied the seq marker of Redis' seq (every change up to it is in memory). A prepared
period's records carry no marker of their own, so a memory answer may trail Redis briefly: it is
asked again until it agrees (MEMORY_LAG_S; 0 makes memory strict), and each such lag is printed
(pytest -s)."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterable
from typing import Any, cast

import pytest
import redis
from confluent_kafka import Producer

import worker.main
from common.settings import Settings
from common.store.keys import index_expiry
from tests.boundaries import KINDS, assert_crosses
from tests.helpers import BOTH_TOPOLOGIES, markers_reached, mget, read_all, running_worker
from tests.integration.test_periods_oracle import (
    ApiNode,
    SimClock,
    accept_future_timestamps,
    wait_until,
)
from tests.redis_layout import TIE_HEX, TIE_MAX, index_keys, read_general
from tests.rolling_model import Model, Rolling
from tests.rolling_stream import BOARDS, HOT, Stream, config
from tests.stream_events import event_times
from worker.rolling import PreparerThread

pytestmark = [pytest.mark.integration, pytest.mark.slow, BOTH_TOPOLOGIES]
BOARD_NAMES = [board for boards in BOARDS.values() for board in boards]
FULL_READ_EVERY = 8  # probes: also read the tie index of the current periods (a keyspace scan each)
MEMORY_LAG_S = 5.0  # the longest a memory answer may take to agree with Redis (0: no lag allowed)
EXPIRED_EVERY = 4  # probes: also ask for the period before the previous one (404 period_expired)


def wait_applied(client: redis.Redis, prefix: str, model: Model) -> None:
    """Until every board's seq in Redis (bumped once per applied event) is the model's."""
    keys = [f"{prefix}{{{board}}}:seq" for board in BOARD_NAMES]
    want = [model.seq(board) for board in BOARD_NAMES]

    def applied() -> tuple[bool, str]:
        got = [int(v or 0) for v in mget(client, keys)]
        assert all(g <= w for g, w in zip(got, want, strict=True)), f"applied {got}, the model {want}"
        return got == want, f"applied {got}, the model {want}"

    wait_until(applied, "the worker")


def differences(got: Any, want: Any) -> Any:
    """What differs between an answer (or a period's members) and the model's, for a failure's
    message: the fields, members or items that differ, side by side."""
    if isinstance(got, tuple) and isinstance(want, tuple) and got[0] == want[0]:
        got, want = got[1], want[1]
    if isinstance(got, dict) and isinstance(want, dict):
        return {
            k: differences(got.get(k), want.get(k))
            for k in got.keys() | want.keys()
            if got.get(k) != want.get(k)
        }
    if isinstance(got, list) and isinstance(want, list):
        return [(i, g, w) for i, (g, w) in enumerate(itertools.zip_longest(got, want)) if g != w]
    return (got, want)


def ending(model: Model, now: int) -> list[str]:
    """The units whose bucket ends right after the instant `now`."""
    return [unit for unit, units in model.buckets.items() if units.at(now + 1) != units.at(now)]


def marker(prefix: str, board: str, window: str, period: str) -> str:
    return f"{prefix}{{{board}}}:rp:{window}:{period}"


def zset_states(
    client: redis.Redis, keys: list[str], inverted: Iterable[bool]
) -> list[dict[str, tuple[float, int]]]:
    """member -> (score, tie ms) of each general-layout rank zset, decoded from its entries' tie
    prefixes alone (pipelined; tests/redis_layout.read_general also reads the tie index)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zrange(key, 0, -1, withscores=True)
    out: list[dict[str, tuple[float, int]]] = []
    for key, entries, inv in zip(keys, pipe.execute(), inverted, strict=True):
        states: dict[str, tuple[float, int]] = {}
        for raw, score in cast(list[tuple[bytes, float]], entries):
            encoded = raw.decode()
            prefix, member = int(encoded[:TIE_HEX], 16), encoded[TIE_HEX:]
            assert member not in states, f"{member!r} is twice in {key}"
            states[member] = (score, TIE_MAX - prefix if inv else prefix)
        out.append(states)
    return out


class Oracle:
    """The test's side of the boundary protocol, and the comparisons."""

    def __init__(self, node: ApiNode, client: redis.Redis, settings: Settings, model: Model) -> None:
        self.node = node
        self.client = client
        self.prefix = settings.key_prefix
        self.model = model
        self.seqs: dict[str, int] = {}  # board -> its seq in Redis when last settled
        self.probes = 0
        self.expired_seen = 0
        self.next_checked = 0  # next periods compared (prepared ones)
        self.lags: list[tuple[Any, ...]] = []  # memory answers that agreed only when asked again

    def tag(self, board: str) -> str:
        return f"{self.prefix}{{{board}}}"

    def inverted(self, board: str) -> bool:
        spec = self.model.spec(board)
        return (spec.order == "desc") == (spec.tie == "first")

    def rolling(self, board: str) -> tuple[str, ...]:
        return self.model.spec(board).rolling

    # --- waiting ------------------------------------------------------------------------------
    def settle(self, now: int, units: Iterable[str], node: ApiNode | None = None) -> None:
        """Until the period after the current one of every rolling window of `units` is prepared
        on every board the registry `{rolling}:<unit>:<current bucket>` names (the boards with
        a next period to prepare while that bucket is current: `now` must lie where the worker
        prepares, the end of the bucket), then (with a `node`) until its hot boards follow Redis."""
        wanted: list[str] = []
        for unit in units:
            current = self.model.buckets[unit].bucket_at(now).id
            registry = cast(set[bytes], self.client.smembers(f"{self.prefix}{{rolling}}:{unit}:{current}"))
            due = {b.decode() for b in registry}
            assert due <= set(BOARD_NAMES), due
            wanted += [
                marker(self.prefix, board, window, self.model.shift(window, current, 1))
                for board in sorted(due)
                for window in self.rolling(board)
                if Rolling.parse(window).unit == unit
            ]

        def prepared() -> tuple[bool, str]:
            values = mget(self.client, wanted) if wanted else []
            missing = [(key, value) for key, value in zip(wanted, values, strict=True) if value != b"done"]
            return not missing, f"markers not done: {missing[:6]}"

        wait_until(prepared, "the next rolling periods prepared")
        seqs = [int(v or 0) for v in mget(self.client, [f"{self.tag(b)}:seq" for b in BOARD_NAMES])]
        self.seqs = dict(zip(BOARD_NAMES, seqs, strict=True))
        assert self.seqs == {board: self.model.seq(board) for board in BOARD_NAMES}
        if node is None:
            return
        hot = {board: self.seqs[board] for board in HOT}

        def followed() -> tuple[bool, str]:
            assert node is not None
            held = node.hot_markers()
            return markers_reached(held, hot), f"memory {held}, Redis {hot}"

        wait_until(followed, "memory")

    # --- comparing ----------------------------------------------------------------------------
    def probe(self, now: int, why: str) -> None:
        self.probes += 1
        self.check_redis(now, why, full=self.probes % FULL_READ_EVERY == 0)
        expired = self.probes % EXPIRED_EVERY == 0
        for board in BOARD_NAMES:
            for window in self.rolling(board):
                self.check_api(self.node, board, window, now, why=why, expired=expired)

    def check_redis(self, now: int, why: str, full: bool) -> None:
        """The previous and current period of every rolling window, and the next one once it is
        prepared (its marker says done: whole)."""
        model, wanted = self.model, []
        for board in BOARD_NAMES:
            for window in self.rolling(board):
                current = model.current(window, now)
                following = model.shift(window, current, 1)
                periods = [model.previous(window, current), current]
                if self.client.get(marker(self.prefix, board, window, following)) == b"done":
                    periods.append(following)
                    self.next_checked += 1
                wanted += [(board, window, period) for period in periods]
        keys = [f"{self.tag(board)}:z:{window}:{period}" for board, window, period in wanted]
        stored = zset_states(self.client, keys, [self.inverted(board) for board, _, _ in wanted])
        for (board, window, period), got in zip(wanted, stored, strict=True):
            want = model.members(board, window, period)
            assert got == want, (why, board, window, period, differences(got, want))
        expiries = self.client.pipeline(transaction=False)
        for key in keys:
            expiries.pexpiretime(key)
        for (board, window, period), key, expiry in zip(wanted, keys, expiries.execute(), strict=True):
            assert expiry in (-2, model.expiry(board, window, period)), (why, "PEXPIRETIME", key)
        if not full:
            return
        for board in BOARD_NAMES:  # the tie index agrees with the zsets (redis_layout)
            spec, tag = model.spec(board), self.tag(board)
            for window in self.rolling(board):
                period = model.current(window, now)
                instance = f"{window}:{period}"
                got = read_general(self.client, tag, instance, spec.order == "asc", spec.tie)
                want = model.members(board, window, period)
                assert got == want, (why, board, instance, differences(got, want))
                for key in index_keys(
                    self.client, tag, instance
                ):  # up to a minute after (common/store/keys.py)
                    want_expiry = index_expiry(model.expiry(board, window, period), key)
                    assert self.client.pexpiretime(key) == want_expiry, (why, key)

    def get(self, node: ApiNode, board: str, **params: object) -> tuple[int, Any]:
        # nocache: the short-lived cache of Redis-served top pages would outlive a step
        query = {"nocache": "1", **{key: str(value) for key, value in params.items()}}
        return node.request("GET", f"/v1/boards/{board}/top", query)

    def expected(self, board: str, window: str, period: str, now: int) -> dict[str, Any]:
        items = self.model.top(board, window, period, now, trend=True)
        return {
            "board": board,
            "window": window,
            "period": period,
            "source": "memory" if board in HOT else "redis",
            "seq": self.seqs[board],
            "total": len(self.model.members(board, window, period)),
            "items": items,
        }

    def compare(self, node: ApiNode, board: str, window: str, period: str, *, now: int, why: str) -> None:
        """One top page against the model's. Memory follows Redis within a bounded lag (update_cache
        is read asynchronously, and a prepared period's records move no seq the test could wait
        for): a memory answer that differs is asked again until it agrees, and the lag is kept."""
        want = (200, self.expected(board, window, period, now))
        # the current period is asked for without period= (the node's clock picks it)
        params = {} if period == self.model.current(window, now) else {"period": period}
        got = self.get(node, board, window=window, limit=500, trend=1, **params)
        if got == want or board not in HOT:
            assert got == want, (why, board, window, period, differences(got, want))
            return
        first, started = differences(got, want), time.monotonic()
        while got != want and time.monotonic() - started < MEMORY_LAG_S:
            time.sleep(0.002)
            got = self.get(node, board, window=window, limit=500, trend=1, **params)
        assert got == want, (why, board, window, period, differences(got, want))
        self.lags.append((why, board, window, period, round(time.monotonic() - started, 4), first))

    def check_api(self, node: ApiNode, board: str, window: str, now: int, *, why: str, expired: bool) -> None:
        """top (the current period: no period= given) and the previous period, with trend=1."""
        model = self.model
        current = model.current(window, now)
        self.compare(node, board, window, current, now=now, why=why)
        before = model.previous(window, current)
        self.compare(node, board, window, before, now=now, why=why)
        if expired:
            gone = model.previous(window, before)
            assert not model.readable(board, window, gone, now)
            status, body = self.get(node, board, window=window, period=gone, trend=1)
            assert (status, body.get("error", {}).get("code")) == (404, "period_expired"), (why, gone, body)
            self.expired_seen += 1

    def check_history(self, now: int) -> None:
        """Every rolling period instance in Redis up to the current one is one the model holds
        members in, and holds the model's final state of it; none lies beyond the next one."""
        model = self.model
        for board in BOARD_NAMES:
            tag = self.tag(board)
            found: set[str] = set()
            for key in self.client.scan_iter(match=f"{tag}:z:last_*", count=1000):
                window, period = bytes(key).decode()[len(f"{tag}:z:") :].split(":", 1)
                offset = model.units(window).find(period) - model.units(window).at(now)
                assert offset <= 1, f"{board} {window}:{period} lies beyond the next period"
                if offset <= 0:  # the next one is compared only once prepared (check_redis)
                    found.add(f"{window}:{period}")
            want: list[tuple[str, str]] = []
            for window in self.rolling(board):
                units = model.units(window)
                events = model.events.get(board, [])
                if not events:
                    continue
                first = min(e.bucket[units.unit] for e in events)
                for q in range(first, units.at(now) + 1):
                    period = units[q].id
                    if model.members(board, window, period):
                        want.append((window, period))
            instances = {f"{w}:{p}" for w, p in want}
            assert found == instances, (board, sorted(found ^ instances))
            keys = [f"{tag}:z:{w}:{p}" for w, p in want]
            stored = zset_states(self.client, keys, [self.inverted(board)] * len(keys))
            for (window, period), got in zip(want, stored, strict=True):
                members = model.members(board, window, period)
                assert got == members, (board, window, period, differences(got, members))


def test_rolling_oracle(make_settings, tmp_path, monkeypatch, *, topics, rclient, consumer_factory):
    """Step by step: before the clock enters a new bucket, wait for the next periods to be
    prepared; set the clock, produce the step's messages, wait until the worker applied them;
    at probes wait for the hot node to follow, then compare Redis and the API with the model."""
    path = tmp_path / "boards.yaml"
    path.write_text(config())
    settings = make_settings(boards=path, worker_batch_timeout_ms=5)
    # the preparer's passes come every second: a simulated hour passes in tens of milliseconds
    monkeypatch.setattr(worker.main, "PreparerThread", functools.partial(PreparerThread, interval_s=0.005))
    accept_future_timestamps(settings)
    stream = Stream(seed=12)
    model = stream.calendar
    steps = list(stream.steps())
    assert_crosses(
        "the rolling stream", stream.tz, event_times(m for step in steps for m in step.messages), KINDS
    )
    clock = SimClock(stream.start)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0})
    with running_worker(settings, clock), ApiNode(settings, clock) as node:
        wait_until(lambda: (node.request("GET", "/readyz", {})[0] == 200, ""), "the API node ready")
        oracle = Oracle(node, rclient, settings, model)
        for step in steps:
            crossing = [u for u, b in model.buckets.items() if b.at(step.now) != b.at(clock.now)]
            if crossing:
                # the periods that become current must be whole when the clock gets there: the
                # worker prepares them late in the buckets ending, so the clock stops at their last
                # ms (no event is processed there) until they are
                boundary = model.buckets["h"].bucket_at(step.now).start
                assert clock.now < boundary <= step.now
                clock.now = max(clock.now, boundary - 1)
                oracle.settle(clock.now, crossing, node if step.probe else None)
            clock.now = step.now
            for message in step.messages:
                value = message.value()
                producer.produce(settings.topic_updates, value, key=message.key, timestamp=message.kafka_ts)
                for event in message.events:
                    assert model.apply(event, event.get("ts", message.kafka_ts), step.now), event
            assert producer.flush(30) == 0
            wait_applied(rclient, settings.key_prefix, model)
            if step.probe:  # at the last ms of a bucket its next period is prepared first
                oracle.settle(step.now, ending(model, step.now), node)
                oracle.probe(step.now, f"{step.probe} ({step.now})")
        clock.now = model.buckets["h"].bucket_at(clock.now).end - 1
        oracle.settle(clock.now, ending(model, clock.now), node)
        oracle.check_redis(clock.now, "the end", full=True)
        oracle.check_history(clock.now)
        with ApiNode(settings, clock) as late:  # replays update_cache from the start, then serves
            wait_until(lambda: (late.request("GET", "/readyz", {})[0] == 200, ""), "the late node ready")
            oracle.settle(clock.now, (), late)
            for board in HOT:
                for window in oracle.rolling(board):
                    oracle.check_api(late, board, window, clock.now, why="the late node", expired=True)
    for lag in oracle.lags:
        print("memory lagged", lag)
    assert oracle.probes > 100 and oracle.expired_seen > 100 and oracle.next_checked > 100
    assert not model.dead
    assert read_all(consumer_factory(settings.topic_dlq), 0) == []  # nothing dead-lettered
