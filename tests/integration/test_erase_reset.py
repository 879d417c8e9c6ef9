"""`rankstream erase` and `rankstream reset` on real Kafka and Redis, while events keep flowing.

The expected state comes from the oracle model (tests/oracle.py) replaying update_rank as Kafka
holds it, partition by partition in offset order, erase and reset applied at their offsets; Redis
(read independently: tests/redis_layout.py), a hot node following live and a fresh node replaying
update_cache must all equal it. Also: each kind of reset, twice = once, a redelivery (a worker
dying before its commit) changes nothing more, later events of an erased member count normally,
the command line end to end, the metric."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis
from confluent_kafka import Message as KafkaMessage

from api.state import APP_STATE
from common.control import CONTROL_HEADER
from common.errors import InfrastructureError
from common.events import Op
from common.settings import Settings
from common.store.keys import BoardKeys
from rankstream import admin
from tests.helpers import (
    BOTH_TOPOLOGIES,
    committed_total,
    event_counts,
    header_map,
    produce,
    read_all,
    running_worker,
    wait_for,
    worker_env,
)
from tests.integration.test_hot_boards import (
    HOT,
    NodeRunner,
    assert_memory_equals_redis,
    hot_settings,
    wait_memory_caught_up,
)
from tests.oracle import (
    Message,
    Model,
    _event,
    assert_crosses_midnight,
    compare_redis,
    now_ms,
    period_end_ms,
    period_id,
)
from tests.redis_layout import index_keys
from worker.outputs import TransactionalOutputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RANKSTREAM = Path(sys.executable).parent / "rankstream"
WAIT_S = 30.0
HOUR_MS = 3_600_000


# --- the model: the stream as Kafka holds it, control ops at their offsets -----------------------


def control_in_model(model: Model, kind: str, fields: dict[str, Any]) -> None:
    """An erase or reset, as the contract says, on the oracle model's state."""
    board = fields["board"]
    model.seq[board] = model.seq.get(board, 0) + 1
    state = model.state.setdefault(board, {})
    if kind == Op.ERASE:
        for members in state.values():
            members.pop(fields["member"], None)
        model.meta.get(board, {}).pop(fields["member"], None)
        return
    window, period = fields.get("window"), fields.get("period")
    for inst in state:
        whole = window is None
        of_window = inst == window if window == "total" else inst.startswith(f"{window}:")
        if whole or (of_window and period is None) or inst == f"{window}:{period}":
            state[inst] = {}
    if window is None:
        model.meta.pop(board, None)


def stream_of(consumer_factory: Any, settings: Settings, count: int) -> list[KafkaMessage]:
    """update_rank as Kafka holds it: per partition in offset order; a board in one partition."""
    messages = read_all(consumer_factory(settings.topic_updates), count)
    messages.sort(key=lambda m: (m.partition(), m.offset()))
    partitions: dict[bytes | None, set[int | None]] = {}
    for msg in messages:
        partitions.setdefault(msg.key(), set()).add(msg.partition())
    assert all(len(p) == 1 for p in partitions.values()), partitions
    return messages


def replay(messages: list[KafkaMessage], start: int) -> Model:
    model = Model(now_ms=start)
    for msg in messages:
        value = cast(bytes, msg.value())
        kind = header_map(msg).get(CONTROL_HEADER)
        if kind is not None:
            control_in_model(model, kind.decode(), orjson.loads(value))
        else:
            model.apply(orjson.loads(value), value, None)
    return model


def seqs_reached(client: redis.Redis, settings: Settings, model: Model) -> bool:
    return all(int(client.get(BoardKeys(settings.key_prefix, b).seq) or 0) == s for b, s in model.seq.items())


# --- hot nodes ------------------------------------------------------------------------------------


def assert_memory_equals_model(node: NodeRunner, model: Model) -> int:
    """Every hot window instance in the node's memory, member by member and with its meta."""
    snapshot = node.call(
        lambda app: {
            board: ({i: w.items() for i, w in hot.instances.items()}, dict(hot.meta.items()))
            for board, hot in app[APP_STATE].hot.boards.items()
        }
    )
    compared = 0
    for board, windows in HOT.items():
        instances, meta = snapshot[board]
        got = {i: {m: (s, t) for m, (s, t, _) in items.items()} for i, items in instances.items() if items}
        expected = {
            inst: members
            for inst, members in model.state.get(board, {}).items()
            if members and inst.split(":")[0] in windows
        }
        assert got == expected, board
        present = {m for members in got.values() for m in members}
        assert {m: meta[m] for m in present if m in meta} == {
            m: v for m, v in model.meta.get(board, {}).items() if m in present
        }, board
        compared += sum(len(members) for members in got.values())
    return compared


def assert_nodes_agree(node: NodeRunner, client: redis.Redis, settings: Settings, model: Model) -> int:
    wait_memory_caught_up(node, client, settings)
    node.call(
        lambda app: [
            assert_memory_equals_redis(client, settings.key_prefix, hot)
            for hot in app[APP_STATE].hot.boards.values()
        ]
    )
    return assert_memory_equals_model(node, model)


@contextmanager
def ready_node(settings: Settings) -> Iterator[NodeRunner]:
    with NodeRunner(settings) as node:
        wait_for(lambda: node.get("/readyz")[0] == 200, 60, "the node ready")
        yield node


def admin_ops(metrics: Any, op: str) -> float:
    return metrics.registry.get_sample_value("rankstream_worker_admin_ops_total", {"op": op}) or 0.0


# --- erase and reset while events flow ------------------------------------------------------------

LOAD_BOARDS = ["gift:r0", "ranged:g0", "score:s0", "gift:r1"]


@BOTH_TOPOLOGIES  # erase and reset on a cluster: their calls routed to each board's slot
def test_erase_and_reset_under_load_equal_an_independent_replay(
    make_settings, tmp_path, rclient, consumer_factory
):
    settings = hot_settings(make_settings, tmp_path)
    start = now_ms()
    rng = random.Random(41)
    events = []
    for n in range(3000):
        event = _event(rng, rng.choice(LOAD_BOARDS), start, n)
        if rng.random() < 0.2:
            event["member"] = "m1"  # the member erased below keeps scoring all along
        events.append(Message(event["board"].encode(), orjson.dumps(event), [(event, None)], []))
    assert_crosses_midnight("the load", events, start)
    today = period_id("day", start - 60_000)

    def paced() -> None:
        for i in range(0, len(events), 150):
            produce(settings, events[i : i + 150])
            time.sleep(0.2)

    with running_worker(settings) as loop, ready_node(settings) as live:
        produce(settings, events[:300])
        loader = threading.Thread(target=paced)
        loader.start()
        lines = [
            admin.erase(settings, "gift:r0", "m1", WAIT_S),
            admin.reset(settings, "ranged:g0", "day", today, WAIT_S),
            admin.erase(settings, "ranged:g0", "m1", WAIT_S),
            admin.reset(settings, "gift:r0", "hour", None, WAIT_S),
            admin.reset(settings, "score:s0", None, None, WAIT_S),
            admin.erase(settings, "gift:r0", "m1", WAIT_S),
            admin.reset(settings, "gift:r1", "total", None, WAIT_S),
            admin.erase(settings, "score:s0", "m1", WAIT_S),
        ]
        loader.join(60)
        again = {"id": "again", "board": "gift:r0", "member": "m1", "score": 7, "ts": start}
        produce(settings, [Message(b"gift:r0", orjson.dumps(again), [(again, None)], [])])
        assert all(line.endswith(")") and ": applied (at " in line for line in lines), lines
        assert lines[0].startswith("erased 'm1' from gift:r0: applied (at ")
        assert lines[1].startswith(f"reset day:{today} of ranged:g0: applied")
        model = replay(stream_of(consumer_factory, settings, 300 + len(events) + len(lines) + 1), start)
        wait_for(lambda: seqs_reached(rclient, settings, model), 60, "every message applied")
        assert compare_redis(rclient, settings.key_prefix, model) > 500
        assert assert_nodes_agree(live, rclient, settings, model) > 100
        erases, resets = admin_ops(loop.metrics, "erase"), admin_ops(loop.metrics, "reset")
    assert (erases, resets) == (4, 4)
    with ready_node(settings) as fresh:  # replays update_cache: resets and erases included
        assert assert_nodes_agree(fresh, rclient, settings, model) > 100
    assert "m1" in model.state["gift:r0"]["total"]  # back after its erases, counted from then on


# --- each kind of reset, twice = once, later events, the command line ----------------------------


def instance_keys(client: redis.Redis, settings: Settings, board: str) -> dict[str, set[str]]:
    """instance -> the kinds of key it has (z, o, h, t, p, q)."""
    tag = BoardKeys(settings.key_prefix, board).tag
    out: dict[str, set[str]] = {}
    for raw in client.scan_iter(match=f"{tag}:*", count=1000):
        kind, _, rest = raw.decode()[len(tag) + 1 :].partition(":")
        if kind in {"z", "o", "h", "t", "p", "q"}:
            bucket = re.fullmatch(r"(.+):\d+:\d+", rest) if kind == "t" else None  # a tie index bucket
            out.setdefault(rest if bucket is None else bucket[1], set()).add(kind)
    return out


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = worker_env(settings)
    argv = [str(RANKSTREAM), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_resets_of_a_period_a_window_and_a_board_and_erase_through_the_command_line(
    make_settings, tmp_path, rclient, consumer_factory
):
    settings = hot_settings(make_settings, tmp_path)
    board, tag = "gift:r1", BoardKeys(settings.key_prefix, "gift:r1").tag
    start = now_ms()
    today = start - 60_000
    # late in the day before today's, wherever the clock is: that day is kept (late_grace 1d) all
    # today, where `start - 26 h` fell two days back between 00:00 and 02:00 in the boards' zone
    yesterday = period_end_ms("day", today) - 26 * HOUR_MS

    def events(tag_: str, members: range, ts: int, score: int = 1, meta: bool = False) -> list[Message]:
        out = []
        for i in members:
            event = {"id": f"{tag_}{i}", "board": board, "member": f"m{i}", "score": score + i, "ts": ts}
            if meta:
                event["meta"] = {"name": f"M{i}"}
            out.append(Message(board.encode(), orjson.dumps(event), [(event, None)], []))
        return out

    first = events("a", range(400), today, meta=True) + events("b", range(50), yesterday, score=5)
    produced = len(first)
    with running_worker(settings) as loop:
        produce(settings, first)
        model = replay(stream_of(consumer_factory, settings, produced), start)
        wait_for(lambda: seqs_reached(rclient, settings, model), 60, "the board filled")
        compare_redis(rclient, settings.key_prefix, model)
        day_y, day_t = f"day:{period_id('day', yesterday)}", f"day:{period_id('day', today)}"
        assert index_keys(rclient, tag, "total")[0] == f"{tag}:t:total"  # 400 members: a directory
        assert {day_y, day_t, "total"} <= set(instance_keys(rclient, settings, board))

        # one period, on the command line
        done = cli(settings, "reset", board, "--window", "day", "--period", period_id("day", yesterday) or "")
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith(f"reset {day_y} of {board}: applied (at {settings.topic_updates}["), (
            done
        )
        instances = instance_keys(rclient, settings, board)
        assert day_y not in instances and day_t in instances and "total" in instances

        # a whole window, twice: the second changes nothing but the seq
        admin.reset(settings, board, "hour", None, WAIT_S)
        after_once = instance_keys(rclient, settings, board)
        admin.reset(settings, board, "hour", None, WAIT_S)
        assert instance_keys(rclient, settings, board) == after_once
        assert not any(inst.startswith("hour:") for inst in after_once)
        assert after_once[day_t] == after_once["total"] == {"z", "t"}

        # an erase on the command line, then again
        done = cli(settings, "erase", board, "m5")
        assert (done.returncode, done.stderr) == (0, "") and done.stdout.startswith(
            f"erased 'm5' from {board}"
        )
        assert admin.erase(settings, board, "m5", WAIT_S).startswith(f"erased 'm5' from {board}: applied")
        assert rclient.hget(f"{tag}:meta", "m5") is None and rclient.hget(f"{tag}:meta", "m6") is not None

        # later events of the erased member count from zero; the whole board, --no-wait
        later = events("c", range(5, 7), today, score=100)
        produce(settings, later)
        done = cli(settings, "reset", board, "--no-wait")
        assert done.returncode == 0 and done.stdout.endswith("(not waiting for the worker)\n"), done.stdout
        after = events("d", range(7, 9), today, score=1000)
        produce(settings, after)
        produced += len(later) + len(after) + 6
        model = replay(stream_of(consumer_factory, settings, produced), start)
        wait_for(lambda: seqs_reached(rclient, settings, model), 60, "every message applied")
        compare_redis(rclient, settings.key_prefix, model)
        assert set(model.state[board]["total"]) == {"m7", "m8"}
        now_in = {f"{w}:{period_id(w, today)}" for w in ("hour", "day", "week", "month")}
        assert set(instance_keys(rclient, settings, board)) == {"total", *now_in}
        assert not rclient.exists(f"{tag}:meta")

        # bad arguments: one line, exit 2, nothing produced
        for args, words in [
            (("reset", board, "--period", "2026-11-22"), "a period needs its window"),
            (("reset", board, "--window", "year"), "'year' is not one of board type 'gift'"),
            (("erase", "Gift Room", "m1"), "board must be <type> or <type>:<scope>"),
        ]:
            done = cli(settings, *args)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and done.stdout == "", done
            assert len(lines) == 1 and lines[0].startswith("rankstream: ") and words in lines[0], done.stderr
        assert admin_ops(loop.metrics, "erase") == 2 and admin_ops(loop.metrics, "reset") == 4

        # a command whose config has a window the worker's lacks: the worker dead-letters the
        # message (bad_control), and the command says so instead of "applied"
        text = settings.boards.read_text()
        assert text.count("[total, hour, day, week, month]") == 1, text
        wider = tmp_path / "cli-boards.yaml"
        wider.write_text(
            text.replace("[total, hour, day, week, month]", "[total, hour, day, week, month, year]")
        )
        done = cli(make_settings(boards=wider), "reset", board, "--window", "year")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done
        assert "NOT applied, the worker dead-lettered it (bad_control)" in lines[0], done.stderr
        produced += 1
    assert committed_total(settings) == produced


# --- a worker dying before its commit: the redelivered control messages change nothing more ------


def test_redelivered_erase_and_reset_change_nothing_more(
    make_settings, tmp_path, rclient, consumer_factory, monkeypatch
):
    """The node holds the boards before the erase and resets; a worker applies them and the
    events after them in Redis, then dies before its commit; the next one gets them all again:
    fenced, nothing changes in Redis, and what it re-publishes still brings the node to Redis'
    state (the members only the resets removed too: a redelivered reset re-publishes the seq
    the instance's reset mark remembers)."""
    settings = hot_settings(make_settings, tmp_path)
    start = now_ms()
    rng = random.Random(43)

    sent: list[Message] = []

    def batch(first: int, count: int, members: int) -> list[Message]:
        out = []
        for n in range(first, first + count):
            event = _event(rng, rng.choice(["gift:r0", "ranged:g0"]), start, n)
            event["member"] = f"m{n % members}"
            out.append(Message(event["board"].encode(), orjson.dumps(event), [(event, None)], []))
        sent.extend(out)
        return out

    with ready_node(settings) as live:
        produce(settings, batch(0, 200, members=20))
        with running_worker(settings):
            wait_for(lambda: committed_total(settings) == 200, 60, "the boards filled")
            wait_memory_caught_up(live, rclient, settings)
        # then, before any worker runs again (one batch holds it all): erase, resets, events that
        # bring back only m0..m4
        lines = [
            admin.erase(settings, "gift:r0", "m1", None),
            admin.reset(settings, "gift:r0", "day", None, None),
            admin.reset(settings, "ranged:g0", None, None, None),
        ]
        produce(settings, batch(200, 200, members=5))
        count = 400 + len(lines)
        model = replay(stream_of(consumer_factory, settings, count), start)

        def dies_before_commit(self: TransactionalOutputs, offsets: Any, group_metadata: Any) -> None:
            self.abort()
            raise InfrastructureError("the worker died before its commit")

        with monkeypatch.context() as patch:
            patch.setattr(TransactionalOutputs, "commit", dies_before_commit)
            with running_worker(settings) as first_worker:
                wait_for(lambda: seqs_reached(rclient, settings, model), 60, "everything applied in Redis")
                retries = first_worker.metrics.registry.get_sample_value
                wait_for(lambda: (retries("rankstream_worker_batch_retries_total") or 0) >= 2, 30, "a retry")
        assert committed_total(settings) == 200
        assert (admin_ops(first_worker.metrics, "erase"), admin_ops(first_worker.metrics, "reset")) == (1, 2)
        compare_redis(rclient, settings.key_prefix, model)
        with running_worker(settings) as second:
            wait_for(lambda: committed_total(settings) == count, 60, "everything committed")
            # counted after the commit: wait for it; the first worker applied these but never committed
            wait_for(lambda: event_counts(second.metrics)["redelivered"] > 150, 30, "redeliveries counted")
            assert admin_ops(second.metrics, "erase") == admin_ops(second.metrics, "reset") == 0
            compare_redis(rclient, settings.key_prefix, model)
            assert assert_nodes_agree(live, rclient, settings, model) > 10
    gone = {f"m{i}" for i in range(5, 20)}  # only the resets removed them: nothing else re-publishes them
    assert not gone & {m for inst, ms in model.state["ranged:g0"].items() for m in ms}
    assert not gone & {
        m for inst, ms in model.state["gift:r0"].items() if inst.startswith("day:") for m in ms
    }
    assert gone & set(model.state["gift:r0"]["total"])
    with ready_node(settings) as fresh:
        assert assert_nodes_agree(fresh, rclient, settings, model) > 10
    marks = list(rclient.scan_iter(BoardKeys(settings.key_prefix, "gift:r0").reset_mark("day:*")))
    assert len(marks) > 30  # every day kept
    assert all(cast(int, rclient.pexpiretime(mark)) > 0 for mark in marks)  # gone with their period
    assert_crosses_midnight("the batches", sent, start)
