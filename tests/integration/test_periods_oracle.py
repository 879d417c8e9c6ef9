"""Periods end to end: real Kafka and Redis, the worker and an API node in-process on one simulated
service clock. Days of simulated events cross 30-minute, hour, day, ISO-week, month and season
boundaries in Asia/Shanghai and in America/New_York across both DST changes (tests/period_stream.py).
At checkpoints every window instance in Redis (read with tests/redis_layout.py, expiry included),
and through the API every period still kept, from Redis and from memory, with trend=1's prev_rank,
must equal the independent model of tests/period_model.py exactly; an expired period answers 404
period_expired, an instant between seasons 404 no_period; an activity's end dead-letters
board_closed at the end instant and after end + late_grace, and its board stays readable."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from api.app import create_app
from common.boards import load_boards
from common.settings import Settings
from common.store.keys import index_expiry
from tests.boundaries import assert_crosses
from tests.helpers import (
    header_map,
    hot_markers,
    markers_reached,
    mget,
    read_all,
    running_worker,
)
from tests.period_model import Model, Span
from tests.period_stream import AHEAD, DAY, HOT, MEMBERS, PROMO, SCENARIOS, Stream
from tests.redis_layout import index_keys, read_general, scan_board
from tests.stream_events import event_times
from worker.dlq import HEADER_INDEX, HEADER_REASON

pytestmark = pytest.mark.integration
T = TypeVar("T")
# One Redis server only (CONTRIBUTING.md): a zone changes the period ids and their ends, never which
# calls reach Redis or how they route; the same window writes and period reads run on a cluster in
# the worker and API oracles.
KEPT_SINCE = 35 * DAY  # kept periods are looked for from this long before the run (empty ones too)
CHECK_EVERY = 16  # steps; and right after each probed boundary


class SimClock:
    """The service's clock (common/clock.py), moved by the test."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class ApiNode:
    """The real API app, on its own event loop in a thread, on the simulated clock."""

    def __init__(self, settings: Settings, clock: SimClock) -> None:
        self.settings = settings
        self.clock = clock
        self.app: web.Application | None = None
        self.http: TestClient[Any, Any] | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def __enter__(self) -> ApiNode:
        self._thread.start()

        async def start() -> None:
            self.app = create_app(self.settings, load_boards(self.settings.boards), clock=self.clock)
            self.http = TestClient(TestServer(self.app))
            await self.http.start_server()

        self._run(start())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.http is not None:
            self._run(self.http.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()  # its own sockets too: an unclosed loop warns when collected

    def request(self, method: str, path: str, params: dict[str, str], body: object = None) -> tuple[int, Any]:
        async def go() -> tuple[int, Any]:
            assert self.http is not None
            resp = await self.http.request(method, path, params=params, json=body)
            return resp.status, await resp.json()

        return self._run(go())

    def hot_markers(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            assert self.app is not None
            return hot_markers(self.app)

        return self._run(read())


def accept_future_timestamps(settings: Settings) -> None:
    """Kafka refuses message timestamps over an hour ahead of its clock by default; the simulated
    days lie months ahead."""
    entry = ConfigEntry(
        "message.timestamp.after.max.ms", str(2**63 - 1), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, settings.topic_updates, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def wait_until(condition: Callable[[], tuple[bool, str]], what: str, timeout: float = 30.0) -> None:
    """Polls every 5 ms (a step waits for the worker this way, hundreds of times per run)."""
    deadline = time.monotonic() + timeout
    while True:
        done, detail = condition()
        if done:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail}"
        time.sleep(0.005)


def wait_applied(client: redis.Redis, prefix: str, model: Model) -> None:
    boards = sorted(model.boards)
    keys = [f"{prefix}{{{board}}}:seq" for board in boards]
    want = [model.boards[board].seq for board in boards]

    def applied() -> tuple[bool, str]:
        got = [int(v or 0) for v in mget(client, keys)]
        assert all(g <= w for g, w in zip(got, want, strict=True)), f"applied {got}, the model {want}"
        return got == want, f"applied {got}, the model {want}"

    wait_until(applied, "the worker")


def wait_memory(node: ApiNode, seqs: dict[str, int]) -> None:
    """Until the node's hot boards reflect every event applied: each one's marker (not its
    newest record's seq, tests/helpers.py hot_markers) has reached the board's seq."""

    def followed() -> tuple[bool, str]:
        held = node.hot_markers()
        return markers_reached(held, seqs), f"markers {held}, seqs {seqs}"

    wait_until(followed, "memory")


def check_redis(client: redis.Redis, prefix: str, model: Model) -> None:
    """Every window instance of every board, member by member (score, tie time), and its expiry."""
    for board, state in model.boards.items():
        tag = f"{prefix}{{{board}}}"
        rank_keys = scan_board(client, f"{tag}:z:*")
        found = {key[len(f"{tag}:z:") :] for key in rank_keys}
        want = {instance for instance, members in state.instances.items() if members}
        assert found == want, f"{board}: instances in Redis"
        for instance in sorted(want):
            stored = read_general(client, tag, instance, asc=False, tie="first")
            members = {m: (float(score), tie) for m, (score, tie) in state.instances[instance].items()}
            assert stored == members, f"{board} {instance}"
            expiry = state.expiry.get(instance, -1)  # total: none
            assert client.pexpiretime(f"{tag}:z:{instance}") == expiry, f"PEXPIRETIME of {instance}"
            for key in index_keys(client, tag, instance):  # up to a minute later (common/store/keys.py)
                assert client.pexpiretime(key) == (index_expiry(expiry, key) if expiry > 0 else -1), key


class Checker:
    """Reads every board through the API and compares each answer with the model."""

    def __init__(self, node: ApiNode, model: Model, start: int) -> None:
        self.node = node
        self.model = model
        self.start = start
        self.expired: set[tuple[str, str]] = set()  # (board, instance) seen answering period_expired

    def get(self, board: str, route: str = "top", **params: object) -> tuple[int, Any]:
        # nocache: the short-lived cache of Redis-served top pages would outlive a step
        query = {"nocache": "1", **{key: str(value) for key, value in params.items()}}
        return self.node.request("GET", f"/v1/boards/{board}/{route}", query)

    def head(self, board: str, window: str, period: str) -> dict[str, Any]:
        source = "memory" if board in HOT else "redis"
        return {"board": board, "window": window, "period": period, "source": source,
                "seq": self.model.boards[board].seq}  # fmt: skip

    def previous(self, board: str, window: str, span: Span, now: int) -> str | None:
        """The previous period's instance, if it is still kept (else every prev_rank is null)."""
        spec = self.model.boards[board].spec
        before = self.model.calendar.previous(spec.name, window, span)
        if before is None or self.model.expiry(spec, window, before) <= now:
            return None
        return f"{window}:{before.id}"

    def top(self, board: str, window: str, span: Span | None, now: int, trend: bool) -> dict[str, Any]:
        instance = "total" if span is None else f"{window}:{span.id}"
        ranking = self.model.ranking(board, instance)
        before = self.model.ranks(board, None if span is None else self.previous(board, window, span, now))
        items: list[dict[str, Any]] = []
        for rank, (member, score) in enumerate(ranking, 1):
            items.append({"rank": rank, "member": member, "score": score})
            if trend:
                items[-1]["prev_rank"] = before.get(member)
        period = "all" if span is None else span.id
        return {**self.head(board, window, period), "total": len(ranking), "items": items}

    def board(self, board: str, now: int) -> None:
        assert self.get(board, limit=500) == (200, self.top(board, "total", None, now, False)), board
        for window in self.model.boards[board].spec.windows[1:]:
            self.window(board, window, now)

    def window(self, board: str, window: str, now: int) -> None:
        model, spec = self.model, self.model.boards[board].spec
        for span in model.calendar.between(spec.name, window, self.start - KEPT_SINCE, now + AHEAD):
            instance = f"{window}:{span.id}"
            if model.expiry(spec, window, span) > now:
                got = self.get(board, window=window, period=span.id, limit=500, trend=1)
                assert got == (200, self.top(board, window, span, now, True)), (board, instance)
            elif instance in model.boards[board].instances and (board, instance) not in self.expired:
                status, body = self.get(board, window=window, period=span.id, trend=1)
                assert (status, body["error"]["code"]) == (404, "period_expired"), (board, instance, body)
                self.expired.add((board, instance))
        current = model.calendar.at(spec.name, window, now)
        status, body = self.get(board, window=window, limit=500, trend=1)  # at= defaults to now
        if current is None:
            assert (status, body["error"]["code"]) == (404, "no_period"), (board, window, body)
            return
        assert (status, body) == (200, self.top(board, window, current, now, True)), (board, window)
        self.member_answers(board, window, current, now)

    def member_answers(self, board: str, window: str, span: Span, now: int) -> None:
        """lookup (present and absent members), member and around, with prev_rank."""
        instance = f"{window}:{span.id}"
        ranks = self.model.ranks(board, instance)
        scores = dict(self.model.ranking(board, instance))
        before = self.model.ranks(board, self.previous(board, window, span, now))
        names = [*MEMBERS[board.split(":", 1)[0]], "nobody"]
        status, body = self.node.request(
            "POST", f"/v1/boards/{board}/members/lookup", {"window": window, "trend": "1"}, {"members": names}
        )
        items = [{"rank": ranks.get(m), "member": m, "score": scores.get(m), "prev_rank": before.get(m)}
                 for m in names]  # fmt: skip
        expected = {**self.head(board, window, span.id), "total": len(ranks), "items": items}
        assert (status, body) == (200, expected), (board, instance, "lookup")
        if not ranks:
            return
        member = min(ranks, key=lambda m: (abs(ranks[m] - 3), m))  # near the top, with neighbours
        status, body = self.get(board, f"members/{member}", window=window, period=span.id, trend=1)
        one = {
            "rank": ranks[member],
            "member": member,
            "score": scores[member],
            "prev_rank": before.get(member),
        }
        assert (status, body) == (200, {**self.head(board, window, span.id), **one}), (board, instance)
        status, body = self.get(board, window=window, period=span.id, limit=2, trend=1, me=member)
        page = self.top(board, window, span, now, True)
        assert (status, body) == (200, {**page, "items": page["items"][:2], "me": one}), (board, instance)
        status, body = self.get(board, f"members/{member}/around", window=window, n=1, trend=1)
        around = self.top(board, window, span, now, True)
        around["items"] = around["items"][max(ranks[member] - 2, 0) : ranks[member] + 1]
        assert (status, body) == (200, around), (board, instance, "around")

    def at_instants(self, board: str, instants: list[int], now: int) -> None:
        """`at=` picks the period holding the instant: kept, expired or none (between seasons)."""
        model, spec = self.model, self.model.boards[board].spec
        for window in spec.windows[1:]:
            for at in instants:
                span = model.calendar.at(spec.name, window, at)
                status, body = self.get(board, window=window, at=at, limit=500)
                if span is None:
                    assert (status, body["error"]["code"]) == (404, "no_period"), (board, window, at)
                elif model.expiry(spec, window, span) <= now:
                    assert (status, body["error"]["code"]) == (404, "period_expired"), (board, window, at)
                else:
                    assert (status, body) == (200, self.top(board, window, span, now, False)), (board, at)
        status, body = self.get(board, trend=1)
        assert (status, body["error"]["code"]) == (400, "bad_parameter")  # total has no previous period


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_periods_oracle(name, make_settings, tmp_path, *, topics, rclient, consumer_factory):
    """Step by step: set the clock, produce the step's messages, wait until the worker applied
    them all (each board's seq); at checkpoints compare Redis and the API with the model."""
    scenario = SCENARIOS[name]
    config = tmp_path / "boards.yaml"
    config.write_text(scenario.config())
    settings = make_settings(boards=config)
    accept_future_timestamps(settings)
    stream = Stream(scenario, seed=sum(map(ord, name)))
    model = scenario.model()
    clock = SimClock(stream.start)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0})
    steps = list(stream.steps())
    assert_crosses(
        f"the {name} stream",
        stream.tz,
        event_times(m for step in steps for m in step.messages),
        scenario.crosses,
    )
    with running_worker(settings, clock), ApiNode(settings, clock) as node:
        wait_until(lambda: (node.request("GET", "/readyz", {})[0] == 200, ""), "the API node ready")
        checker = Checker(node, model, stream.start)
        for number, step in enumerate(steps, 1):
            clock.now = step.now
            for message in step.messages:
                value = message.value()
                producer.produce(settings.topic_updates, value, key=message.key, timestamp=message.kafka_ts)
                for event in message.events:
                    model.apply(event, event.get("ts", message.kafka_ts), step.now, value)
            assert producer.flush(30) == 0
            wait_applied(rclient, settings.key_prefix, model)
            if number % CHECK_EVERY and number != len(steps) and step.now not in stream.after_probes:
                continue
            wait_memory(node, {board: model.boards[board].seq for board in HOT})
            check_redis(rclient, settings.key_prefix, model)
            for board in model.boards:
                checker.board(board, step.now)
        rng = stream.rng
        instants = [rng.randint(stream.start, stream.end) for _ in range(6)]
        gaps = [stream.start + 3_600_000, *(stream.instant(gap) for gap in scenario.gaps), *stream.probes]
        for board in model.boards:
            checker.at_instants(board, instants + gaps, clock.now)
        with ApiNode(settings, clock) as late:  # replays update_cache from the start, then serves
            wait_until(lambda: (late.request("GET", "/readyz", {})[0] == 200, ""), "the late node ready")
            for board in HOT:
                Checker(late, model, stream.start).board(board, clock.now)
    assert len(checker.expired) > 50  # expiry happened, and was seen
    dead = read_all(consumer_factory(settings.topic_dlq), len(model.dead))
    got = Counter((header_map(r)[HEADER_REASON].decode(), r.value()) for r in dead)
    assert got == Counter(model.dead)
    assert all(HEADER_INDEX not in header_map(r) for r in dead)
    reasons = Counter(reason for reason, _ in model.dead)
    assert reasons["board_closed"] >= 2 and reasons["ts_out_of_range"] == 1, reasons
    assert model.boards[PROMO].seq > 0


@pytest.mark.parametrize("window", ["30min", "hour"])
def test_local_times_a_dst_change_skips_name_no_period(window, make_settings, tmp_path):
    """`period=` naming the 30min and hour periods of New York's skipped 02:00-03:00 is a bad
    period id, while such a period would be kept and long after."""
    scenario = SCENARIOS["new_york_spring"]
    document = yaml.safe_load(scenario.config())
    del document["hot"]  # Redis alone: no replay needed
    config = tmp_path / "boards.yaml"
    config.write_text(yaml.safe_dump(document))
    stream = Stream(scenario, seed=0)
    skipped = [p for w, p in scenario.model().calendar.skipped(stream.start, stream.end) if w == window]
    assert skipped
    clock = SimClock(stream.instant("2027-03-14T04:00"))  # an hour after the change
    with ApiNode(make_settings(boards=config), clock) as node:
        for now in (clock.now, stream.end):
            clock.now = now
            for period in skipped:
                status, body = node.request(
                    "GET", "/v1/boards/arena:x/top", {"window": window, "period": period}
                )
                assert (status, body.get("error", {}).get("code")) == (400, "bad_period"), (period, body)
