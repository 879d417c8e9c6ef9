"""Live event streams (GET /v1/boards/{board}/events) on the real worker, Kafka and Redis: each
change reaches the stream, from memory for a hot board and from the change notices for the rest,
equal to the top route's answer; Last-Event-ID resumes; the node bounds its streams, sends
keep-alives, pushes at most every 250 ms, and ends its streams as it stops."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from api.app import create_app
from api.live import INTERVAL_S
from common.boards import load_boards
from common.settings import Settings
from rankstream.stack import free_port
from rankstream.topics import ensure_topics
from tests.helpers import api_env, http_status, running_worker, wait_for
from tests.sse import EventReader

pytestmark = pytest.mark.integration
CONFIG = """
timezone: UTC
types:
  gift: {windows: [total, day], tie_break: first}
  split: {windows: [total], shards: 3}
hot:
  - {board: "gift:hot", windows: [total, day]}
"""


@pytest.fixture
def live_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    path = tmp_path / "boards.yaml"
    path.write_text(CONFIG)
    settings = make_settings(boards=path)
    ensure_topics(settings)
    return settings


def send(settings: Settings, producer: Any, board: str, scores: dict[str, int]) -> None:
    for member, score in scores.items():
        event = {"id": uuid.uuid4().hex, "board": board, "member": member, "score": score}
        producer.produce(settings.topic_updates, orjson.dumps(event), key=board.encode())
    assert producer.flush(10) == 0


@asynccontextmanager
async def node(settings: Settings) -> AsyncIterator[TestClient[Any, Any]]:
    client = TestClient(TestServer(create_app(settings, load_boards(settings.boards))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def until_ready(client: TestClient[Any, Any]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while (await client.get("/readyz")).status != 200:
        assert loop.time() < end, "the node never became ready"
        await asyncio.sleep(0.05)


async def page_where(reader: EventReader, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first page pushed that satisfies `wanted` (its id is its seq)."""
    while True:
        event = await reader.page()
        body: dict[str, Any] = event.json()
        assert event.id == str(body["seq"])
        if wanted(body):
            return body


async def until_ended(reader: EventReader) -> None:
    while True:
        await reader.next(15)


def scores_of(body: dict[str, Any]) -> dict[str, float]:
    return {item["member"]: item["score"] for item in body["items"]}


@pytest.mark.parametrize("board", ["gift:cold", "gift:hot", "split:s"])
def test_each_change_reaches_the_stream_equal_to_the_top_route(live_settings, producer, board):
    settings = live_settings
    model: dict[str, float] = {}

    async def run() -> None:
        async with node(settings) as client:
            await until_ready(client)
            query = "window=total&limit=20"
            async with client.get(f"/v1/boards/{board}/events?{query}") as stream:
                assert stream.status == 200
                assert stream.headers["Content-Type"] == "text/event-stream"
                assert stream.headers["Cache-Control"] == "no-store"
                reader = EventReader(stream)
                first = await reader.page()
                assert first.json()["items"] == []
                assert reader.retry_ms == 2000
                for round_ in range(3):  # each round distinct totals: the order is the model's
                    scores = {f"m{i}": (round_ + 1) * 100 + i for i in range(8)}
                    for member, score in scores.items():
                        model[member] = model.get(member, 0) + score
                    await asyncio.to_thread(send, settings, producer, board, scores)
                    body = await page_where(reader, lambda b: scores_of(b) == model)
                    ranked = sorted(model, key=lambda m: -model[m])
                    assert [i["member"] for i in body["items"]] == ranked
                    assert [i["rank"] for i in body["items"]] == list(range(1, len(ranked) + 1))
                    assert body["source"] == ("memory" if board == "gift:hot" else "redis")
                    top = await (await client.get(f"/v1/boards/{board}/top?{query}&nocache=1")).json()
                    assert top == body  # the route's answer at the same seq, byte for byte in JSON

    with running_worker(settings):
        asyncio.run(run())


@pytest.mark.parametrize("board", ["gift:resume", "gift:hot"])
def test_last_event_id_resumes_on_another_node_without_the_page_the_client_holds(
    live_settings, producer, board
):
    settings = live_settings

    async def run() -> None:
        async with node(settings) as first, node(settings) as other:
            await until_ready(first)
            await until_ready(other)
            await asyncio.to_thread(send, settings, producer, board, {"a": 5})
            async with first.get(f"/v1/boards/{board}/events") as stream:
                held = await page_where(EventReader(stream), lambda b: b["total"] == 1)
            headers = {"Last-Event-ID": str(held["seq"])}
            async with other.get(f"/v1/boards/{board}/events", headers=headers) as stream:
                reader = EventReader(stream)
                await asyncio.to_thread(send, settings, producer, board, {"b": 9})
                # were the page the client holds sent again, it would come first, at its seq
                after = (await reader.page()).json()
                assert after["seq"] > held["seq"]
                assert scores_of(after) == {"a": 5, "b": 9}

    with running_worker(settings):
        asyncio.run(run())


def test_pages_come_at_most_every_interval_however_often_the_board_changes(live_settings, producer):
    settings = live_settings
    board = "gift:busy"

    async def run() -> None:
        async with node(settings) as client, client.get(f"/v1/boards/{board}/events") as stream:
            reader = EventReader(stream)
            await reader.page()
            stop = asyncio.Event()

            async def write() -> None:  # a change every few ms, for as long as pages are read
                n = 0
                while not stop.is_set():
                    await asyncio.to_thread(send, settings, producer, board, {f"w{n % 50}": 1})
                    n += 1

            writer = asyncio.create_task(write())
            pages = [(await reader.page()).json()["seq"]]
            started = time.monotonic()
            while len(pages) < 12:
                pages.append((await reader.page()).json()["seq"])
            elapsed = time.monotonic() - started
            stop.set()
            await writer
            assert pages == sorted(set(pages))  # each page newer than the one before
            # 11 gaps of at least INTERVAL_S each (the client may read late, never early)
            assert elapsed >= 11 * INTERVAL_S * 0.95, elapsed

    with running_worker(settings):
        asyncio.run(run())


def test_streams_are_bounded_kept_alive_and_checked(live_settings):
    settings = live_settings.model_copy(
        update={
            "api_stream_max": 2,
            "api_stream_keepalive_s": 0.2,
            "api_cors_origins": "https://game.example",
        }
    )

    async def run() -> None:
        async with node(settings) as client:
            head = await client.head("/v1/boards/gift:x/events")  # headers only: it ends at once
            assert head.status == 200
            assert head.headers["Content-Type"] == "text/event-stream"
            assert await head.read() == b""
            bad = await client.get("/v1/boards/gift:x/events?window=nope")
            assert bad.status == 400
            assert (await bad.json())["error"]["code"] == "bad_window"
            big = await client.get("/v1/boards/gift:x/events?limit=101")
            assert big.status == 400
            origin = {"Origin": "https://game.example"}  # a page of an allowed origin
            first = await client.get("/v1/boards/gift:x/events", headers=origin)
            assert first.headers["Access-Control-Allow-Origin"] == "https://game.example"
            second = await client.get("/v1/boards/gift:y/events")
            assert second.status == 200
            reader = EventReader(first)
            await reader.page()
            comment = await reader.next(5)
            while comment.comment is None:
                comment = await reader.next(5)
            assert comment.comment == "keep-alive"
            third = await client.get("/v1/boards/gift:z/events")
            assert third.status == 503
            assert third.headers["Content-Type"].startswith("application/json")
            assert (await third.json())["error"]["code"] == "too_many_streams"
            first.close()  # a client that leaves frees its place (noticed at the next keep-alive)
            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while True:
                again = await client.get("/v1/boards/gift:z/events")
                if again.status == 200:
                    again.close()
                    break
                again.release()
                assert loop.time() < end, "the stream that left was never freed"
                await asyncio.sleep(0.05)
            second.close()

    asyncio.run(run())


def test_a_stopping_node_ends_its_streams_at_once(live_settings, tmp_path):
    settings = live_settings
    port = free_port()
    env = {**api_env(settings, port), "RANKSTREAM_SHUTDOWN_DEADLINE_S": "20"}
    log = (tmp_path / "api.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "rankstream.cli", "api"], env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 60, "api ready")

        async def run() -> float:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/boards/gift:x/events"
                async with session.get(url) as stream:
                    reader = EventReader(stream)
                    await reader.page()
                    os.kill(proc.pid, signal.SIGTERM)
                    started = time.monotonic()
                    with pytest.raises(EOFError):
                        await until_ended(reader)
                    return time.monotonic() - started

        ended_after = asyncio.run(run())
        assert proc.wait(20) == 0
        assert ended_after < 5, ended_after  # not held until the 20 s deadline
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_top_watch_redraws_the_table_as_the_board_changes(live_settings, producer, tmp_path):
    settings = live_settings
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen([sys.executable, "-m", "rankstream.cli", "api"], env=api_env(settings, port),
                           stdout=log, stderr=log)  # fmt: skip
    watch = None
    try:
        with running_worker(settings):
            wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, 60, "api ready")
            send(settings, producer, "gift:w", {"alice": 7})
            argv = [sys.executable, "-m", "rankstream.cli", "top", "gift:w", "--watch", "--limit", "5",
                    "--api", f"http://127.0.0.1:{port}"]  # fmt: skip
            watch = subprocess.Popen(argv, env=api_env(settings, port), stdout=subprocess.PIPE, text=True)
            assert watch.stdout is not None
            out = watch.stdout
            seen: list[str] = []

            def table_with(member: str) -> list[str]:
                """The lines of the next table drawn that shows `member`."""
                while True:
                    table = []
                    while (line := out.readline()) not in {"\n", ""}:
                        table.append(line.rstrip("\n"))
                    seen.extend(table)
                    assert line, f"the watch ended: {seen[-20:]}"
                    if any(row.split()[1:2] == [member] for row in table[3:-1]):
                        return table

            first = table_with("alice")
            assert first[0].startswith("gift:w  window total")
            send(settings, producer, "gift:w", {"bob": 9})
            second = table_with("bob")
            assert [row.split()[:3] for row in second[3:-1]] == [["1", "bob", "9"], ["2", "alice", "7"]]
            assert "\x1b" not in "".join(seen)  # not a terminal: no screen clearing
            watch.send_signal(signal.SIGINT)
            assert watch.wait(10) == 0
    finally:
        for proc in (watch, api):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if watch is not None and watch.stdout is not None:
            watch.stdout.close()
        log.close()


def test_top_watch_reports_a_bad_board_in_one_line(live_settings):
    argv = [sys.executable, "-m", "rankstream.cli", "top", "Nope", "--watch", "--api", "http://127.0.0.1:9"]
    done = subprocess.run(argv, env=api_env(live_settings, free_port()), capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankstream: "), done.stderr


def test_a_page_keeps_a_valid_query_token_in_a_cookie_and_a_new_token_replaces_an_old_one(live_settings):
    good, rotated = "good-" + uuid.uuid4().hex, "old-" + uuid.uuid4().hex
    settings = live_settings.model_copy(update={"api_read_tokens": SecretStr(good)})
    proxied = settings.model_copy(update={"api_trusted_proxies": "127.0.0.1"})

    async def run(settings: Settings) -> list[str]:
        cookies: list[str] = []
        async with node(settings) as client:
            page = await client.get(f"/boards/gift:x?window=day&token={good}", allow_redirects=False,
                                    headers={"X-Forwarded-Proto": "https"})  # fmt: skip
            assert page.status == 303
            assert page.headers["Location"] == "/boards/gift:x?window=day"
            cookies.append(page.headers["Set-Cookie"])
            client.session.cookie_jar.clear()  # each request below names the cookie it carries
            jar = {"rankstream_token": good}
            assert (await client.get("/v1/boards/gift:x/top", cookies=jar)).status == 200
            assert (await client.get("/v1/boards/gift:x/events?limit=1", cookies=jar)).status == 200
            assert (await client.get(f"/v1/boards/gift:x/top?token={good}")).status == 401  # not here
            typo = await client.get("/boards/gift:x?token=typo", cookies=jar, allow_redirects=False)
            assert typo.status == 401  # the query's token first: a wrong one is no token
            assert "Set-Cookie" not in typo.headers
            renewed = await client.get(f"/boards/gift:x?token={good}", cookies={"rankstream_token": rotated},
                                       allow_redirects=False)  # fmt: skip
            assert renewed.status == 303  # a token rotated away: the new one replaces it
            assert f"rankstream_token={good};" in renewed.headers["Set-Cookie"]
        return cookies

    direct = asyncio.run(run(settings))[0]
    assert f"rankstream_token={good};" in direct
    assert "HttpOnly" in direct and "SameSite=Lax" in direct
    assert "Secure" not in direct  # plain HTTP, and a forwarded proto from no trusted proxy
    assert "Secure" in asyncio.run(run(proxied))[0]  # TLS ended at a trusted proxy
