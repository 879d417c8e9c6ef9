"""What a live stream sends first when its client says which page it holds (Last-Event-ID):
api/live.py's Listener, on a real event loop, without a server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from api import live
from api.live import Listener, LiveBoards, Page


def page_frame(seq: int, body: bytes) -> bytes:
    return Page.of(seq, "all", body).frame


def sent(listener: Listener) -> bytes | None:
    """What the stream writes next (read through a call: each offer may change it)."""
    return listener.pending


def page(seq: int, body: bytes = b"{}") -> Page:
    return Page.of(seq, "all", body)


def test_no_last_event_id_gets_every_page():
    async def run() -> None:
        listener = Listener(None)
        listener.offer(page(3))
        assert sent(listener) == page_frame(3, b"{}")

    asyncio.run(run())


def test_the_page_the_client_holds_is_skipped_once_and_later_pages_go_out_even_at_that_seq():
    async def run() -> None:
        listener = Listener("7")
        listener.offer(page(7))
        assert sent(listener) is None
        assert not listener.wake.is_set()
        listener.offer(page(7, b'{"total":2}'))  # a later page, whatever its seq
        assert sent(listener) == page_frame(7, b'{"total":2}')

    asyncio.run(run())


def test_a_node_behind_the_client_holds_its_older_page_until_newer_or_the_wait_is_over(monkeypatch):
    monkeypatch.setattr(live, "AHEAD_WAIT_S", 0.05)

    async def run() -> None:
        caught_up = Listener("10")
        caught_up.offer(page(8))
        assert sent(caught_up) is None  # older than what the client shows
        caught_up.offer(page(11))
        assert sent(caught_up) == page_frame(11, b"{}")

        erased = Listener("10")  # an erased board: its seq starts again, nothing newer comes
        erased.offer(page(2))
        assert sent(erased) is None
        await asyncio.wait_for(erased.wake.wait(), 5)
        assert sent(erased) == page_frame(2, b"{}")

    asyncio.run(run())


def test_a_window_of_periods_names_the_period_in_its_ids_so_a_new_day_is_not_skipped():
    async def run() -> None:
        today = Page.of(7, "2026-11-29", b"{}")
        assert today.id == "7@2026-11-29"
        assert today.frame.startswith(b"id: 7@2026-11-29\nevent: top\n")
        listener = Listener("7@2026-11-28")  # the client holds yesterday's page, seq 7 too
        listener.offer(today)
        assert sent(listener) == today.frame
        held = Listener("7@2026-11-29")
        held.offer(today)
        assert sent(held) is None

    asyncio.run(run())


def test_a_stream_sent_no_page_since_the_tick_before_is_woken_for_a_keep_alive_at_every_tick():
    async def run() -> None:
        hub = LiveBoards(10, 15.0, lambda: 0)
        idle, busy = Listener(None), Listener(None)
        hub.listeners |= {idle, busy}
        for _ in range(3):  # each tick, not every other: a keep-alive written is not a page
            idle.wake.clear()
            busy.wake.clear()
            busy.sent = True  # it wrote a page since the tick before
            hub.tick()
            assert idle.wake.is_set()
            assert not busy.wake.is_set()

    asyncio.run(run())


@pytest.mark.parametrize("header", ["", "abc", "12x", "5@", "5@ x"])
def test_a_last_event_id_that_is_no_seq_of_ours_is_ignored(header):
    request = SimpleNamespace(headers={"Last-Event-ID": header})
    assert live._since(request) is None  # type: ignore[arg-type]
