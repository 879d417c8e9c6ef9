"""A board no config makes hot turns hot by itself on a node that reads it often, under writes:
the node loads it while Redis answers, serves it from memory once it holds exactly what Redis
holds (every member's state, the order and the meta, in every period it serves), follows it
from then on, and drops it once it is no longer read; it never holds the node's readiness."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from api import promoted
from api.hotboards import HotBoard
from api.state import APP_STATE
from common.boards import load_boards
from common.events import Op, UpdateEvent
from common.periods import parse_period, previous_period
from common.settings import Settings
from common.store.keys import TOTAL_INSTANCE, BoardKeys
from common.store.shards import shard_names
from tests.helpers import BOTH_TOPOLOGIES, applied_so_far, produce, running_worker, wait_for
from tests.integration.test_hot_boards import (
    ALL_BOARDS,
    NodeRunner,
    assert_memory_equals_redis,
    hot_settings,
    model_with_history,
    wait_memory_caught_up,
)
from tests.integration.test_hot_record_formats import assert_meta_equals_redis
from tests.oracle import SHARDED_BOARDS, generate, now_ms
from worker.apply import Applier

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BOARD = "gift:r0"
READ = f"/v1/boards/{BOARD}/top?limit=5&window=day"


def served_equals_redis(client: redis.Redis, settings: Settings, hot: HotBoard) -> int:
    """Every period memory serves holds what Redis holds, member by member and in order (those
    it does not serve are read from Redis); the members compared."""
    boards = load_boards(settings.boards)
    board_type = boards.type_for(BOARD.split(":", 1)[0])
    assert board_type is not None

    def start_of(instance: str) -> int:
        if instance == TOTAL_INSTANCE:
            return 0
        window, period = instance.split(":", 1)
        return parse_period(board_type.window(window), period, boards.timezone).start_ms

    def served(instance: str) -> bool:
        return hot.serves(instance.split(":", 1)[0], start_of(instance))

    windows = [window.name for window in board_type.windows]
    return assert_memory_equals_redis(client, settings.key_prefix, hot, windows, served)


@BOTH_TOPOLOGIES
def test_a_board_read_often_turns_hot_under_writes_exactly_and_leaves_when_idle(
    make_settings, tmp_path, rclient, monkeypatch
):
    settings = hot_settings(make_settings, tmp_path, hot=False, hot_promote_reads_per_s=5.0, hot_idle_s=2.0)
    start = now_ms()
    messages = list(generate(seed=47, total=30_000, now_ms=start, boards=ALL_BOARDS))
    model, _ = model_with_history(messages, start)
    head, during, after = messages[:12_000], messages[12_000:22_000], messages[22_000:]
    produce(settings, head)
    keys = BoardKeys(settings.key_prefix, BOARD)

    def seq() -> int:
        return int(rclient.get(keys.seq) or 0)

    # while the node reads the board's pages (after it registered the board and read its seq):
    # more events, applied before it reads on, so pages and records overlap
    real_step = promoted.step
    struck: list[int] = []

    def step_under_writes(loading: promoted.Loading, limit: int) -> bool:
        if not struck:
            struck.append(seq())
            produce(settings, during)
            wait_for(lambda: seq() > struck[0] + 20, 60, "the board written while it loads")
        return real_step(loading, limit)

    monkeypatch.setattr(promoted, "step", step_under_writes)
    reading = threading.Event()
    reading.set()

    with running_worker(settings):
        wait_for(lambda: applied_so_far(rclient, settings) > 5_000, 60, "the board filled")
        with NodeRunner(settings) as node:
            assert node.get("/readyz")[0] == 200  # nothing configured hot: ready at once

            def read() -> None:  # a room's viewers: the board is read often
                while reading.is_set():
                    assert node.get(READ)[0] == 200
                    time.sleep(0.01)  # pacing the viewers (about 50 reads a second), not a wait

            viewers = threading.Thread(target=read)
            viewers.start()

            def loaded(app: Any) -> bool:
                hot = app[APP_STATE].hot.boards.get(BOARD)
                return hot is not None and hot.ready

            wait_for(lambda: node.call(loaded), 90, "the board hot")
            assert struck and node.call(lambda app: hot_of(app).targets[BOARD]) > struck[0]
            produce(settings, after)  # followed from then on
            total = sum(model.seq.values())
            wait_for(lambda: applied_so_far(rclient, settings) >= total, 120, "all applied")
            wait_memory_caught_up(node, rclient, settings)
            assert node.call(lambda app: served_equals_redis(rclient, settings, hot_of(app))) > 50
            assert (
                node.call(lambda app: assert_meta_equals_redis(rclient, settings.key_prefix, hot_of(app))) > 0
            )
            status, body = node.get(READ)
            assert status == 200 and body["source"] == "memory"
            assert node.get("/readyz")[0] == 200

            reading.clear()
            viewers.join(30)
            wait_for(
                lambda: node.call(lambda app: BOARD not in app[APP_STATE].hot.boards), 60, "the board idle"
            )
            status, body = node.get(READ)
            assert status == 200 and body["source"] == "redis"
            counts = node.call(
                lambda app: (app[APP_STATE].hot.promotions, dict(app[APP_STATE].hot.demotions))
            )
            assert counts == (1, {"idle": 1})


def hot_of(app: Any) -> HotBoard:
    board: HotBoard = app[APP_STATE].hot.boards[BOARD]
    return board


SHARDED = "split:h0"


@BOTH_TOPOLOGIES
def test_a_sharded_board_turned_hot_answers_as_a_node_reading_redis_does(make_settings, tmp_path, rclient):
    """Each of its shards registered, read and followed apart; every answer from memory equals
    the answer of a node that reads Redis, in each window's current and previous period."""
    settings = hot_settings(make_settings, tmp_path, hot=False, hot_promote_reads_per_s=5.0)
    plain = settings.model_copy(update={"hot_promote_reads_per_s": 0.0})
    start = now_ms()
    messages = list(generate(seed=53, total=6_000, now_ms=start, boards=SHARDED_BOARDS))
    model, _ = model_with_history(messages, start)
    produce(settings, messages[:3_000])
    boards = load_boards(settings.boards)
    board_type = boards.type_for("split")
    assert board_type is not None
    reading = threading.Event()
    reading.set()

    with running_worker(settings):
        wait_for(lambda: applied_so_far(rclient, settings, SHARDED_BOARDS) > 500, 60, "the board filled")
        with NodeRunner(settings) as node, NodeRunner(plain) as from_redis:

            def read() -> None:
                while reading.is_set():
                    assert node.get(f"/v1/boards/{SHARDED}/top?limit=5")[0] == 200
                    time.sleep(0.01)  # pacing the viewers, not a wait

            viewers = threading.Thread(target=read)
            viewers.start()
            try:
                wait_for(
                    lambda: node.call(lambda app: SHARDED in app[APP_STATE].hot.boards), 90, "the board hot"
                )
                produce(settings, messages[3_000:])
                total = sum(model.seq.values())
                wait_for(lambda: applied_so_far(rclient, settings) >= total, 120, "all applied")
                names = shard_names(SHARDED, board_type.shards)

                def shards_caught_up() -> bool:  # each shard's marker reached that shard's seq
                    markers = node.call(lambda app: dict(app[APP_STATE].hot.boards[SHARDED].markers))
                    seqs = {n: int(rclient.get(BoardKeys(settings.key_prefix, n).seq) or 0) for n in names}
                    return all(markers.get(n, -1) >= seq for n, seq in seqs.items())

                wait_for(shards_caught_up, 60, "memory caught up with each shard")
                compared = 0
                for window in ("total", "day", "week"):
                    _, current = from_redis.get(f"/v1/boards/{SHARDED}/top?limit=1&window={window}")
                    periods = [current["period"]]
                    if window != "total":
                        found = parse_period(board_type.window(window), current["period"], boards.timezone)
                        before = previous_period(board_type.window(window), found, boards.timezone)
                        periods += [before.id] if before is not None else []
                    for period in periods:
                        query = f"window={window}" + ("" if window == "total" else f"&period={period}")
                        status, hot = node.get(f"/v1/boards/{SHARDED}/top?limit=500&{query}")
                        _, cold = from_redis.get(f"/v1/boards/{SHARDED}/top?limit=500&{query}&nocache=1")
                        assert status == 200 and hot.pop("source") == "memory", query
                        assert cold.pop("source") == "redis"
                        assert hot == cold, query
                        compared += len(hot["items"])
                        for entry in hot["items"][:20]:
                            path = f"/v1/boards/{SHARDED}/members/{entry['member']}/around?n=3&{query}"
                            got, want = node.get(path)[1], from_redis.get(path + "&nocache=1")[1]
                            assert got.pop("source") == "memory" and want.pop("source") == "redis"
                            assert got == want, path
                assert compared > 50
            finally:
                reading.clear()
                viewers.join(30)


def test_a_board_written_unpublished_falls_behind_and_is_read_from_redis_again(
    make_settings, tmp_path, rclient
):
    """A write no worker publishes (a worker of an earlier release, which does not check the
    registration): memory does not reach Redis' seq within BEHIND_S, so the board leaves memory
    and is read from Redis again, and is not made hot again at once."""
    settings = hot_settings(make_settings, tmp_path, hot=False, hot_promote_reads_per_s=5.0)
    boards = load_boards(settings.boards)
    writer = Applier(rclient, boards, settings.key_prefix, 3600, epoch="E")  # writes, publishes nothing
    now = now_ms()
    writer.apply([(event(f"a{i}", f"u{i % 7}", i), now) for i in range(30)])
    reading = threading.Event()
    reading.set()
    with NodeRunner(settings) as node:

        def read() -> None:
            while reading.is_set():
                assert node.get(READ)[0] == 200
                time.sleep(0.01)  # pacing the viewers, not a wait

        viewers = threading.Thread(target=read)
        viewers.start()
        try:
            wait_for(lambda: node.call(lambda app: BOARD in app[APP_STATE].hot.boards), 60, "the board hot")
            assert node.get(READ)[1]["source"] == "memory"
            writer.apply([(event(f"b{i}", "u1", 100), now) for i in range(5)])  # unpublished
            wait_for(
                lambda: node.call(lambda app: BOARD not in app[APP_STATE].hot.boards), 60, "the board dropped"
            )
            status, body = node.get(READ)
            assert status == 200 and body["source"] == "redis" and body["items"][0]["member"] == "u1"
            counts = node.call(
                lambda app: (app[APP_STATE].hot.promotions, dict(app[APP_STATE].hot.demotions))
            )
            assert counts == (1, {"behind": 1})
            assert node.call(lambda app: BOARD in app[APP_STATE].hot.refused)  # not again at once
        finally:
            reading.clear()
            viewers.join(30)


def event(event_id: str, member: str, score: float) -> UpdateEvent:
    return UpdateEvent(id=event_id, board=BOARD, board_type="gift", member=member, op=Op.INCR, score=score,
                       ts=None, meta=None)  # fmt: skip
