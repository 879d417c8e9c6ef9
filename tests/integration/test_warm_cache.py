"""The warm cache of non-hot boards (api/warm.py) on real Redis: answers are kept until the
board changes, identical reads in flight make one Redis call, nocache=1 bypasses, an answer
chosen by the clock ends with its period, and no answer served is older than a write plus the
bound: across change notices, a node restart, Redis dropping the node's connections, and a
write whose notice nobody hears."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import CHANGES_NAME, READS_NAME, create_app
from common.boards import load_boards
from common.clock import Clock, system_ms
from common.events import Op, UpdateEvent
from common.settings import Settings
from common.store.keys import BoardKeys
from common.store.reads import LOCATE, TOP
from common.store.topology import Store, masters
from tests.boundaries import session_boundary
from tests.helpers import BOTH_TOPOLOGIES, every_server, kill_connections, scrape
from worker.apply import Applier

pytestmark = pytest.mark.integration
BOARD = "gift:warm"
CHECK_S = 0.2  # warm_check_s here: the bound when a notice is lost
BOUND_S = CHECK_S + 0.6  # what the test allows: the check, a reconnect's first wait, scheduling
SUBSCRIPTIONS = "rankstream_api_warm_subscriptions_total"


@pytest.fixture
def warm_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    boards = tmp_path / "boards.yaml"
    zone = session_boundary().zone  # its day ends in the clock test below
    boards.write_text(f"timezone: {zone}\ntypes:\n  gift: {{windows: [total, day]}}\n")
    return make_settings(boards=boards, warm_check_s=CHECK_S)


@pytest.fixture
def notices_only(warm_settings: Settings) -> Settings:
    """No seq check within a test's time: only change notices (and reconnects) refresh."""
    return warm_settings.model_copy(update={"warm_check_s": 60.0})


async def shows(http: TestClient[Any, Any], url: str, seq: int) -> dict[str, Any]:
    """The first answer at `seq` or later (a deadline far above any notice's delay)."""
    deadline = time.monotonic() + 5
    while True:
        body: dict[str, Any] = await (await http.get(url)).json()
        if body["seq"] >= seq:
            return body
        assert time.monotonic() < deadline, f"seq {seq} never showed"
        await asyncio.sleep(0.005)


class Writer:
    """Sets through the worker's own write path; rank 1 is always the latest member set."""

    def __init__(self, settings: Settings, client: Store) -> None:
        self.applier = Applier(client, load_boards(settings.boards), settings.key_prefix, 600_000)
        self.top_of_seq: dict[int, str] = {}  # the board's seq after a write -> its rank-1 member
        self.done: list[tuple[float, int]] = []  # (monotonic time the apply returned, seq)
        self.n = 0

    def write(self, member: str | None = None) -> int:
        self.n += 1
        member = member or f"w{self.n}"
        event = UpdateEvent(f"e{self.n}", BOARD, "gift", member, Op.SET, float(1000 + self.n), None, None)
        outcome = self.applier.apply([(event, int(time.time() * 1000))])[0]
        self.top_of_seq[outcome.seq] = member
        self.done.append((time.monotonic(), outcome.seq))
        return outcome.seq


@asynccontextmanager
async def node(settings: Settings, clock: Clock = system_ms) -> AsyncIterator[TestClient[Any, Any]]:
    """An API node in this loop, once ready and its change feed subscribed."""
    async with TestClient(TestServer(create_app(settings, load_boards(settings.boards), clock))) as http:
        deadline = time.monotonic() + 30
        while "rankstream_api_warm_cache_live 1.0" not in scrape(http):
            assert time.monotonic() < deadline, "the change feed never subscribed"
            await asyncio.sleep(0.02)
        yield http


def calls(client: Store, command: str = "evalsha_ro") -> int:
    """How many times Redis ran `command` (a cluster: over its masters)."""
    stats = [node.info("commandstats").get(f"cmdstat_{command}", {}) for node in masters(client)]
    return sum(int(s.get("calls", 0)) for s in stats)


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found[1])


@contextmanager
def notices_heard(client: Store, channel: str) -> Iterator[Callable[[int], None]]:
    """Listens on `channel` on every server (a node's change feed may subscribe to any); the
    function it gives waits until each one has delivered the notice of a change up to `seq` (a
    cluster's bus forwards a PUBLISH to the other nodes in order, at times ~40 ms late: after
    that, no earlier notice can reach a subscriber)."""
    listeners = [node.pubsub(ignore_subscribe_messages=True) for node in every_server(client)]  # type: ignore[no-untyped-call]
    try:
        for listener in listeners:
            listener.subscribe(channel)

        def wait(seq: int) -> None:
            deadline = time.monotonic() + 10
            for listener in listeners:
                while True:
                    assert time.monotonic() < deadline, f"the notice of seq {seq} was never delivered"
                    message = listener.get_message(timeout=0.1)
                    if message is not None and int(bytes(message["data"]).split()[1]) >= seq:
                        break

        yield wait
    finally:
        for listener in listeners:
            listener.close()


@BOTH_TOPOLOGIES  # change notices across a cluster's nodes
def test_answers_are_kept_until_the_board_changes(notices_only, rclient):
    warm_settings = notices_only
    writer = Writer(warm_settings, rclient)
    with notices_heard(rclient, BoardKeys(warm_settings.key_prefix, BOARD).changes) as heard:
        for _ in range(20):
            writer.write()
        # the writes' notices pass before the node subscribes, or one drops the burst's answer
        heard(writer.n)
    rclient.script_load(TOP.source)  # a fresh Redis refuses the first EVALSHA (NOSCRIPT): two calls
    rclient.script_load(LOCATE.source)
    url = f"/v1/boards/{BOARD}/top?limit=5"

    async def go() -> dict[str, Any]:
        got: dict[str, Any] = {}
        async with node(warm_settings) as http:
            before = calls(rclient)
            answers = await asyncio.gather(*(http.get(url) for _ in range(50)))
            assert all(r.status == 200 for r in answers)
            got["burst"] = calls(rclient) - before  # one read, the others joined it
            before = calls(rclient)
            for _ in range(20):
                assert (await (await http.get(url)).json())["items"][0]["member"] == "w20"
            got["kept"] = calls(rclient) - before
            before = calls(rclient)
            for _ in range(3):
                await http.get(url + "&nocache=1")
            got["nocache"] = calls(rclient) - before
            for _ in range(2):  # member and around answers are kept too
                await http.get(f"/v1/boards/{BOARD}/members/w3")
                await http.get(f"/v1/boards/{BOARD}/members/w3/around?n=2")
            got["member_and_around"] = calls(rclient) - before - 3
            seq = await asyncio.to_thread(writer.write, "fresh")
            body = await shows(http, url, seq)  # its notice dropped the board (no seq check here)
            got["after_write"] = (body["items"][0]["member"], body["seq"] == seq)
            text = scrape(http)
            got["hits"] = metric(text, 'rankstream_api_warm_cache_total{result="hit"}') >= 20
        return got

    assert asyncio.run(go()) == {
        "burst": 1,
        "kept": 0,
        "nocache": 3,
        "member_and_around": 2,  # one locate.lua call each (around reads its page in the same call)
        "after_write": ("fresh", True),
        "hits": True,
    }


def test_an_answer_chosen_by_the_clock_ends_with_its_period(warm_settings, rclient):
    writer = Writer(warm_settings, rclient)
    writer.write()
    now = [int(time.time() * 1000)]
    boundary = session_boundary()
    end_of_day = boundary.at_ms + 86_400_000  # the local day that began at the session's boundary
    assert boundary.at_ms <= now[0] < end_of_day, "the session's day is over (a replay a day late?)"

    async def go() -> tuple[str, str, str]:
        async with node(warm_settings, clock=lambda: now[0]) as http:
            url = f"/v1/boards/{BOARD}/top?window=day"
            first = (await (await http.get(url)).json())["period"]
            again = (await (await http.get(url)).json())["period"]  # kept: the same day
            now[0] = end_of_day  # the next day, by the node's clock: nothing written
            after = (await (await http.get(url)).json())["period"]
        return first, again, after

    first, again, after = asyncio.run(go())
    assert first == again != after


@BOTH_TOPOLOGIES  # change notices across a cluster's nodes
def test_a_node_whose_feed_drops_forgets_what_it_kept(notices_only, rclient):
    """Redis drops the change feed and a write lands before it is back: its notice is lost,
    so the node must drop everything when it subscribes again (no seq check here)."""
    writer = Writer(notices_only, rclient)
    writer.write()
    url = f"/v1/boards/{BOARD}/top?limit=3"

    async def go() -> tuple[str, str]:
        async with node(notices_only) as http:
            before = (await (await http.get(url)).json())["items"][0]["member"]
            assert kill_connections(rclient, CHANGES_NAME) == 1
            writer.write("in-the-gap")  # at once: the feed waits 50 ms before reconnecting
            deadline = time.monotonic() + 10
            while metric(scrape(http), SUBSCRIPTIONS) < 2:
                assert time.monotonic() < deadline, "the change feed never came back"
                await asyncio.sleep(0.01)
            # one read, no retry: the answer kept before the gap must be gone
            after = (await (await http.get(url)).json())["items"][0]["member"]
        return before, after

    assert asyncio.run(go()) == ("w1", "in-the-gap")


@BOTH_TOPOLOGIES  # change notices across a cluster's nodes
def test_no_answer_is_older_than_a_write_plus_the_bound(warm_settings, rclient):
    """A reader reads the warm top-10 all along, while a writer writes every 15 ms. Meanwhile
    Redis drops the node's change feed, then its read connection; the node restarts; and
    the last write's notice goes where no node listens (as a previous release's worker writes).
    Every answer must show every write that returned more than BOUND_S before it was asked
    for, and its rank 1 must be the member of its own seq."""
    writer = Writer(warm_settings, rclient)
    writer.write()
    url = f"/v1/boards/{BOARD}/top?limit=10"
    served: list[tuple[float, int, str]] = []  # (monotonic time asked, seq, rank-1 member)
    unavailable = 0
    stop, started, feed_killed = threading.Event(), threading.Event(), threading.Event()

    def kill(name: str) -> int:
        """Kill the node's connections of that name, once there are some (a node restarting has
        none for a moment: one found just before it closed is gone when the kill comes)."""
        deadline = time.monotonic() + 10
        while not (killed := kill_connections(rclient, name)):
            assert time.monotonic() < deadline, f"no connection named {name}"
            time.sleep(0.01)
        return killed

    def write_all() -> dict[str, int]:
        events = {"feed_killed": 0, "reads_killed": 0}
        assert started.wait(30)
        for i in range(240):
            if i == 60:
                events["feed_killed"] = kill(CHANGES_NAME)
                feed_killed.set()
            if i == 120:
                events["reads_killed"] = kill(READS_NAME)
            if i == 239:  # the last: no later notice drops the board
                with mock.patch.object(BoardKeys, "changes", "nobody-listens"):
                    writer.write("unheard")
            else:
                writer.write()
            time.sleep(0.015)
        time.sleep(BOUND_S + 0.2)  # the last writes' bound passes while the reader still reads
        stop.set()
        return events

    async def read_until_stopped(http: TestClient[Any, Any], until: Callable[[], bool]) -> None:
        nonlocal unavailable
        while not until():
            asked = time.monotonic()
            resp = await http.get(url)
            body = await resp.json()
            if resp.status == 503:  # a read in flight when Redis dropped the connection
                unavailable += 1
                continue
            assert resp.status == 200, body
            served.append((asked, body["seq"], body["items"][0]["member"]))

    async def go() -> tuple[dict[str, int], list[float]]:
        writing = asyncio.ensure_future(asyncio.to_thread(write_all))
        subscriptions, missed = [], []
        half = [math.inf]

        def first() -> bool:  # the node restarts once: halfway, and after its feed was killed
            return stop.is_set() or (feed_killed.is_set() and time.monotonic() > half[0])

        for until in (first, stop.is_set):
            async with node(warm_settings) as http:
                if not started.is_set():
                    half[0] = time.monotonic() + 2.5
                    started.set()
                await read_until_stopped(http, until)
                text = scrape(http)
                subscriptions.append(metric(text, SUBSCRIPTIONS))
                missed.append(metric(text, "rankstream_api_warm_missed_changes_total"))
        return await writing, [*subscriptions, *missed]

    events, (subs_first, subs_second, missed_first, missed_second) = asyncio.run(go())
    assert events["feed_killed"] == 1
    assert events["reads_killed"] >= 1  # a cluster: one connection per master the node asked
    assert subs_first == 2 and subs_second == 1  # the first node re-subscribed after the kill
    assert missed_first + missed_second >= 1  # the unheard write was caught by the seq check
    assert unavailable <= 5
    assert len(served) > 300
    done = writer.done
    stale = []
    for asked, seq, top in served:
        assert writer.top_of_seq.get(seq, top) == top, f"seq {seq} served with rank 1 {top}"
        owed = max((s for t, s in done if t <= asked - BOUND_S), default=0)
        if seq < owed:
            stale.append((round(asked, 3), seq, owed))
    assert not stale, f"answers older than a write plus {BOUND_S} s: {stale[:5]}"
    assert served[-1][1] == done[-1][1]  # the last write shows
