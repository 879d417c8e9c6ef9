"""`rankstream dlq` end to end, as people run it, on the real Kafka and Redis with a real worker:
bad events dead-lettered by the worker, counted and shown, then replayed fixed, each exactly
once (the ledger, and the worker's id window for --force); an array's valid elements never
applied twice; what can't be replayed refused in one line; bad input one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime, not in the stub's __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from common.settings import Settings
from common.store.keys import BoardKeys
from common.store.topology import Store
from rankstream.dlq.reader import read_topic
from rankstream.dlq.replay import HEADER_REPLAYED_FROM
from rankstream.outcome import wait_handled
from rankstream.stack import free_port
from rankstream.topics import UPDATE_PARTITIONS
from tests.conftest import own_topics
from tests.helpers import header_map, running_worker, wait_for, worker_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BOARDS = "timezone: UTC\ntypes:\n  gift: {windows: [total], tie_break: none}\n"  # plain zset members
FIX = """
def fix(event):
    if "scor" in event:  # a producer's typo
        event["score"] = event.pop("scor")
    if isinstance(event.get("score"), str):  # a number sent as text
        event["score"] = int(event["score"])
    return event
"""
DLQ_LIMIT = 100_000  # the dead-letter topic's max.message.bytes here: a larger dead letter is truncated

VALID = {"id": "v1", "board": "gift:r1", "member": "alice", "score": 1}
WRONG_TYPE = {"id": "w1", "board": "gift:r1", "member": "alice", "score": "50"}
ARRAY = [
    {"id": "a1", "board": "gift:r1", "member": "bob", "score": 10},
    {"id": "a1", "board": "gift:r2", "member": "bob", "scor": 7},  # unknown_field, index 1
    {"id": "a1", "board": "gift:r3", "member": "bob", "score": 3},
]
BIG = b"{" + b"x" * 120_000  # not JSON, and too large for the dead-letter topic: truncated
NOT_UTF8 = b'{"id": "\xff\xfe"}'  # not JSON either (not UTF-8)


def dlq(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`rankstream dlq <args>` with the test's settings, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "dlq", *args],
        env=worker_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert done.stderr == "", done.stderr
    return done.stdout


def score(rclient: Store, settings: Settings, board: str, member: str) -> float | None:
    return rclient.zscore(BoardKeys(settings.key_prefix, board).rank("total"), member)


def scores(rclient: Store, settings: Settings) -> dict[tuple[str, str], float | None]:
    pairs = [("gift:r1", "alice"), ("gift:r1", "bob"), ("gift:r2", "bob"), ("gift:r3", "bob")]
    return {(b, m): score(rclient, settings, b, m) for b, m in pairs}


def updates_ends(settings: Settings) -> list[int]:
    """The high watermark of each partition of update_rank: what was ever produced to it."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "ends"})
    try:
        return [
            consumer.get_watermark_offsets(
                TopicPartition(settings.topic_updates, p), timeout=10, cached=False
            )[1]
            for p in range(UPDATE_PARTITIONS)
        ]
    finally:
        consumer.close()


def replayed_records(settings: Settings) -> list[tuple[int, int, bytes, bytes]]:
    """(partition, offset, key, value) of every committed replay on update_rank."""
    return [
        (m.partition() or 0, m.offset() or 0, m.key() or b"", m.value() or b"")
        for m in read_topic(settings, settings.topic_updates, "RANKSTREAM_TOPIC_UPDATES")
        if HEADER_REPLAYED_FROM in header_map(m)
    ]


def wait_applied(settings: Settings) -> None:
    """Until the worker group has committed past every replayed record (applied or dropped)."""
    for partition, offset, _, _ in replayed_records(settings):
        assert wait_handled(settings, partition, offset, 30), (partition, offset)


@pytest.fixture
def dlq_settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[Settings]:
    """The test's topics, the dead-letter topic taking records up to DLQ_LIMIT bytes."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(BOARDS)
    settings = make_settings(boards=boards)
    with own_topics(settings):
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        limit = ConfigEntry("max.message.bytes", str(DLQ_LIMIT), incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ResourceType.TOPIC, settings.topic_dlq, incremental_configs=[limit])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        yield settings


@pytest.mark.slow  # ~30 s: a worker, and `rankstream dlq` run some twenty times as people run it
def test_fixed_dead_letters_are_replayed_once_and_an_arrays_neighbours_never_twice(
    dlq_settings, rclient, tmp_path
):
    settings = dlq_settings
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    for value, key in [
        (orjson.dumps(VALID), b"gift:r1"),
        (orjson.dumps(WRONG_TYPE), b"gift:r1"),
        (orjson.dumps(ARRAY), b"gift:r1"),
        (BIG, b"gift:r1"),
        (NOT_UTF8, b"gift:r1"),
    ]:
        producer.produce(settings.topic_updates, value, key=key)
    assert producer.flush(30) == 0
    fix = tmp_path / "fix.py"
    fix.write_text(FIX)

    with running_worker(settings):
        wait_for(
            lambda: orjson.loads(ok(dlq(settings, "stats", "--json")))["total"] == 4, 60, "4 dead letters"
        )
        wait_for(lambda: score(rclient, settings, "gift:r3", "bob") == 3, 30, "the array's valid elements")
        before = {
            ("gift:r1", "alice"): 1,
            ("gift:r1", "bob"): 10,
            ("gift:r2", "bob"): None,
            ("gift:r3", "bob"): 3,
        }
        assert scores(rclient, settings) == before

        # stats: by reason and by hour
        stats = orjson.loads(ok(dlq(settings, "stats", "--json")))
        assert stats["by_reason"] == {"bad_json": 2, "unknown_field": 1, "wrong_type": 1}
        assert sum(stats["by_hour"].values()) == 4 and stats["truncated"] == 1
        table = ok(dlq(settings, "stats"))
        assert table.startswith(f"{settings.topic_dlq}: 4 dead letters (1 truncated)")
        assert "unknown_field" in table and "hour (UTC)" in table

        # show: each with its bytes, its event (an array's element alone) and every header
        shown = [orjson.loads(line) for line in ok(dlq(settings, "show", "--json")).splitlines()]
        assert [s["reason"] for s in shown] == ["wrong_type", "unknown_field", "bad_json", "bad_json"]
        wrong, element, big, not_utf8 = shown
        assert wrong["event"] == WRONG_TYPE and wrong["key"] == "gift:r1"
        assert element["value"] == orjson.dumps(ARRAY).decode()  # the worker keeps the whole array
        assert element["event"] == ARRAY[1] and element["headers"]["rankstream.source.index"] == "1"
        assert element["headers"]["rankstream.source.topic"] == settings.topic_updates
        assert {"rankstream.message", "rankstream.source.partition", "rankstream.source.offset"} <= set(
            element["headers"]
        )
        assert big["headers"]["rankstream.truncated"] == "1" and big["event"] is None
        assert big["headers"]["rankstream.original_size"] == str(len(BIG))
        assert not_utf8["value_utf8"] is False and "\\xff\\xfe" in not_utf8["value"]
        one = ok(dlq(settings, "show", "--reason", "unknown_field", "--limit", "1"))
        assert one.startswith(f"{element['partition']}:{element['offset']}  ")
        assert "event (element 1 of the array): " in one and "rankstream.source.index: 1" in one

        # a fix that raises, or returns no event: refused in one line each, nothing sent
        ends = updates_ends(settings)
        raising = tmp_path / "raising.py"
        raising.write_text("def fix(event):\n    raise KeyError('nope')\n")
        done = dlq(settings, "replay", "--reason", "wrong_type", "--fix-with", str(raising))
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"rankstream: refused {wrong['partition']}:{wrong['offset']} (wrong_type): "
            "the fix raised KeyError: 'nope'"
        ]
        listing = tmp_path / "listing.py"
        listing.write_text("def fix(event):\n    return [event]\n")
        done = dlq(settings, "replay", "--reason", "unknown_field", "--fix-with", str(listing))
        assert done.returncode == 1 and "the fix returned list, not an event" in done.stderr
        # --dry-run: says what it would send, sends and records nothing
        done = dlq(settings, "replay", "--fix-with", str(fix), "--dry-run", "--reason", "wrong_type")
        lines = ok(done).splitlines()
        assert lines[0].startswith(f"would replay {wrong['partition']}:{wrong['offset']} (wrong_type) -> ")
        assert '"score":50' in lines[0] and lines[-1].startswith("dry run, nothing sent: would replay 1,")
        assert updates_ends(settings) == ends

        # replay: the fixed event, its id kept; the array's bad element alone
        out = ok(dlq(settings, "replay", "--fix-with", str(fix), "--reason", "wrong_type"))
        assert out.splitlines()[-1] == "replayed 1, already replayed 0, skipped 0, refused 0"
        out = ok(dlq(settings, "replay", "--fix-with", str(fix), "--reason", "unknown_field"))
        assert out.splitlines()[-1] == "replayed 1, already replayed 0, skipped 0, refused 0"
        sent = replayed_records(settings)
        assert [(key, orjson.loads(value)) for _, _, key, value in sent] == [
            (b"gift:r1", {**WRONG_TYPE, "score": 50, "ts": wrong["timestamp_ms"]}),
            (
                b"gift:r2",
                {
                    **{k: v for k, v in ARRAY[1].items() if k != "scor"},
                    "score": 7,
                    "ts": element["timestamp_ms"],
                },
            ),
        ]
        wait_applied(settings)
        after = {**before, ("gift:r1", "alice"): 51, ("gift:r2", "bob"): 7}
        assert scores(rclient, settings) == after

        # again, twice: nothing sent; the truncated and the non-JSON ones refused in one line each
        ends = updates_ends(settings)
        for _ in range(2):
            done = dlq(settings, "replay", "--fix-with", str(fix))
            assert done.returncode == 1, done.stderr
            assert done.stdout.splitlines()[-1] == "replayed 0, already replayed 2, skipped 0, refused 2"
            refused = done.stderr.splitlines()
            assert len(refused) == 2 and all(line.startswith("rankstream: refused ") for line in refused)
            assert (
                f"{big['partition']}:{big['offset']} (bad_json): truncated: the dead letter keeps only "
                in refused[0]
            )
            assert refused[1].endswith("(bad_json): its value is not JSON")
            assert updates_ends(settings) == ends

        # --force within the id window: sent again, dropped by the worker's id window
        out = ok(dlq(settings, "replay", "--fix-with", str(fix), "--reason", "wrong_type", "--force"))
        assert "again (--force; replayed before at " in out
        assert len(replayed_records(settings)) == 3
        wait_applied(settings)
        assert scores(rclient, settings) == after


def test_bad_input_is_one_line_and_a_non_zero_exit(settings, tmp_path):
    missing = dlq(settings, "stats")  # the topics are not made
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"rankstream: topic {settings.topic_dlq} (RANKSTREAM_TOPIC_DLQ) does not exist: "
        "`rankstream topics` creates it"
    ]
    syntax = tmp_path / "broken.py"
    syntax.write_text("def fix(event)\n    return event\n")
    nofix = tmp_path / "nofix.py"
    nofix.write_text("def repair(event):\n    return event\n")
    for args, expected in [
        (
            ["show", "--reason", "wrong_typo"],
            "rankstream: --reason: no dead-letter reason 'wrong_typo' (reasons: ",
        ),
        (["replay", "--limit", "0"], "rankstream: --limit must be a whole number, 1 or more, got '0'"),
        (
            ["replay", "--fix-with", str(tmp_path / "nope.py")],
            f"rankstream: --fix-with {tmp_path / 'nope.py'}: no such file",
        ),
        (["replay", "--fix-with", str(syntax)], f"rankstream: --fix-with {syntax}: line 1: expected ':'"),
        (["replay", "--fix-with", str(nofix)], f"rankstream: --fix-with {nofix}: defines no function fix("),
    ]:
        done = dlq(settings, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(expected), (args, done.stderr)
        assert done.stdout == ""


@pytest.mark.slow  # the 10 s a command gives Kafka to answer
def test_kafka_not_answering_is_one_line_and_exit_1(settings):
    away = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    argv = [sys.executable, "-m", "rankstream.cli", "dlq"]
    procs = [  # side by side: each waits out the same 10 s
        subprocess.Popen([*argv, action], env=worker_env(away), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for action in ("stats", "show", "replay")
    ]  # fmt: skip
    errs = [proc.communicate(timeout=120)[1] for proc in procs]  # every one ended before a check
    for proc, err in zip(procs, errs, strict=True):
        assert proc.returncode == 1 and "Traceback" not in err, err
        # its line; before it, at most librdkafka's own line of the refused connection (said once)
        *before, line = err.splitlines()
        assert len(before) <= 1 and f"Kafka at {away.kafka_bootstrap} did not answer" in line, err
