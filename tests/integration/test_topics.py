"""`rankstream topics` on a real broker: topics made as the settings say, a replication factor the
cluster cannot hold refused in one line, and existing topics that differ reported one line per
difference with nothing changed (docs/operations/topics.md)."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime, not in the stub's __all__
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
)

from common.boards import parse_boards
from common.errors import TopicsDifferError
from common.settings import Settings
from common.store.encoding import encode_member, tie_mode
from common.store.keys import BoardKeys
from rankstream.devstack import stack_topics
from rankstream.topics import CACHE_PARTITIONS, UPDATE_PARTITIONS, ensure_topics
from tests.helpers import (
    applied_so_far,
    committed_offsets,
    running_worker,
    wait_applied_and_committed,
    wait_for,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000


def _names(settings: Settings) -> list[str]:
    """The topics, in the order `rankstream topics` checks them."""
    return [settings.topic_updates, settings.topic_dlq, settings.topic_cache, settings.topic_results,
            settings.topic_dlq_replayed]  # fmt: skip


@pytest.fixture
def admin(settings: Settings) -> Iterator[AdminClient]:
    """An admin client; the test's topics that exist at its end are deleted."""
    client = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    yield client
    present = [n for n in _names(settings) if n in client.list_topics(timeout=10).topics]
    if present:
        for future in client.delete_topics(present, operation_timeout=30).values():
            future.result(timeout=30)


def topics_command(settings: Settings, **env: str) -> tuple[int, str, str]:
    """`rankstream topics` run as people run it, on `settings`' broker and topic names, with the
    topic settings of `env` (RANKSTREAM_* variables); (status, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    environ.update(
        RANKSTREAM_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        RANKSTREAM_TOPIC_UPDATES=settings.topic_updates,
        RANKSTREAM_TOPIC_DLQ=settings.topic_dlq,
        RANKSTREAM_TOPIC_CACHE=settings.topic_cache,
        RANKSTREAM_TOPIC_RESULTS=settings.topic_results,
        RANKSTREAM_TOPIC_DLQ_REPLAYED=settings.topic_dlq_replayed,
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "topics"],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


SINGLE = {"RANKSTREAM_TOPIC_REPLICATION": "1", "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "1"}


def configs(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return dict(admin.describe_configs([resource])[resource].result(timeout=10))


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Deleted, and gone from the broker's metadata."""
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 30, f"{topic} deleted")


def partitions(admin: AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def shapes(admin: AdminClient, topics: list[str]) -> dict[str, tuple[int, str]]:
    """Each topic's partitions and retention.ms."""
    return {t: (partitions(admin, t), configs(admin, t)["retention.ms"].value) for t in topics}


def test_topics_are_created_with_the_configured_partitions_retention_and_min_isr(settings, admin):
    env = {
        **SINGLE,
        "RANKSTREAM_TOPIC_UPDATES_PARTITIONS": "4",
        "RANKSTREAM_TOPIC_UPDATES_RETENTION_MS": str(2 * DAY_MS),
        "RANKSTREAM_TOPIC_DLQ_PARTITIONS": "2",
        "RANKSTREAM_TOPIC_DLQ_RETENTION_MS": str(3 * DAY_MS),
        "RANKSTREAM_TOPIC_CACHE_PARTITIONS": "5",
        "RANKSTREAM_TOPIC_RESULTS_PARTITIONS": "2",
        "RANKSTREAM_TOPIC_RESULTS_RETENTION_MS": "-1",
        "RANKSTREAM_TOPIC_DLQ_REPLAYED_PARTITIONS": "3",
    }
    status, out, err = topics_command(settings, **env)
    assert status == 0, err
    assert out.startswith("topics ready (") and all(n in out for n in _names(settings)), out
    expected = {
        settings.topic_updates: (4, str(2 * DAY_MS)),
        settings.topic_dlq: (2, str(3 * DAY_MS)),
        settings.topic_cache: (5, None),
        settings.topic_results: (2, "-1"),
        settings.topic_dlq_replayed: (3, None),
    }
    for topic, (count, retention) in expected.items():
        assert partitions(admin, topic) == count, topic
        found = configs(admin, topic)
        # set on the topic, not the broker's default that happens to be 1 too
        assert found["min.insync.replicas"].value == "1"
        assert found["min.insync.replicas"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, topic
        if retention is None:  # compacted: no time retention set, the broker's default applies
            assert found["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            assert found["cleanup.policy"].value == "compact"
        else:
            assert found["retention.ms"].value == retention, topic
    # the same settings again: every topic is as it would create it
    status, out, err = topics_command(settings, **env)
    assert (status, out.strip(), err) == (0, "topics ready (all existed created)", "")


def test_a_replication_factor_above_the_brokers_is_refused_in_one_line(settings, admin):
    brokers = len(admin.list_topics(timeout=10).brokers)
    too_many = brokers + 1
    status, out, err = topics_command(
        settings,
        RANKSTREAM_TOPIC_REPLICATION=str(too_many),
        RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS="1",
    )
    assert status == 2, (out, err)
    assert err.splitlines() == [
        f"rankstream: RANKSTREAM_TOPIC_REPLICATION is {too_many}, more than the {brokers} "
        f"broker{'' if brokers == 1 else 's'} Kafka at {settings.kafka_bootstrap} reports: "
        f"set it to at most {brokers}"
    ]
    assert not set(_names(settings)) & set(admin.list_topics(timeout=10).topics)  # nothing created


def test_existing_topics_that_differ_fail_one_line_each_and_nothing_changes(make_settings, admin):
    settings = make_settings(topic_updates_partitions=3, topic_updates_retention_ms=DAY_MS)
    ensure_topics(settings)
    delete_topic(admin, settings.topic_results)
    existing = [t for t in _names(settings) if t != settings.topic_results]
    before = {t: (partitions(admin, t), configs(admin, t)["retention.ms"].value) for t in existing}

    status, out, err = topics_command(settings, **SINGLE)  # the defaults: 6 partitions, 7 days
    assert status == 1, (out, err)
    assert err.splitlines() == [
        f"rankstream: topic {settings.topic_updates}: partitions 3, configured 6 "
        "(RANKSTREAM_TOPIC_UPDATES_PARTITIONS)",
        f"rankstream: topic {settings.topic_updates}: retention.ms {DAY_MS}, configured {7 * DAY_MS} "
        "(RANKSTREAM_TOPIC_UPDATES_RETENTION_MS)",
    ]
    assert out == ""
    assert shapes(admin, existing) == before
    assert before[settings.topic_updates] == (3, str(DAY_MS))
    # and the missing topic was not created either: a run that fails changes nothing
    assert settings.topic_results not in admin.list_topics(timeout=10).topics

    # a replication factor other than the topics': every existing topic says so, before the
    # broker count is looked at
    status, _, err = topics_command(
        settings,
        RANKSTREAM_TOPIC_UPDATES_PARTITIONS="3",
        RANKSTREAM_TOPIC_UPDATES_RETENTION_MS=str(DAY_MS),
        RANKSTREAM_TOPIC_REPLICATION="2",
        RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS="2",
    )
    assert status == 1, err
    assert err.splitlines() == [
        line
        for topic in existing
        for line in (
            f"rankstream: topic {topic}: replication factor 1, configured 2 (RANKSTREAM_TOPIC_REPLICATION)",
            f"rankstream: topic {topic}: min.insync.replicas 1, configured 2 "
            "(RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS)",
        )
    ]
    assert settings.topic_results not in admin.list_topics(timeout=10).topics


def test_the_local_stack_logs_differences_and_creates_what_is_missing(make_settings, admin, caplog):
    """`rankstream dev` / `stack up` (rankstream.devstack): one broker whatever the environment
    says, and not strict: a stack kept from an older release still comes up."""
    settings = make_settings()
    ensure_topics(make_settings(topic_dlq_retention_ms=7 * DAY_MS))  # the same names
    delete_topic(admin, settings.topic_cache)
    production = make_settings(topic_replication=3, topic_min_insync_replicas=2)  # the defaults
    with caplog.at_level(logging.WARNING, logger="rankstream.topics"):
        stack_topics(production, settings.kafka_bootstrap)
    assert partitions(admin, settings.topic_cache) == CACHE_PARTITIONS  # created, on the one broker
    assert configs(admin, settings.topic_dlq)["retention.ms"].value == str(7 * DAY_MS)  # left as it was
    differences = [r.difference for r in caplog.records if hasattr(r, "difference")]
    assert differences == [
        f"topic {settings.topic_dlq}: retention.ms {7 * DAY_MS}, configured {30 * DAY_MS} "
        "(RANKSTREAM_TOPIC_DLQ_RETENTION_MS)"
    ]


GROW_YAML = "timezone: UTC\ntypes:\n  grow: {windows: [total]}\n"
GROW_BOARDS = [f"grow:room{i}" for i in range(12)]


@pytest.mark.slow
def test_partitions_added_to_update_rank_while_a_worker_runs_count_every_event_once(
    make_settings, admin, rclient, tmp_path
):
    """docs/operations/topics.md: after `--alter --partitions`, a board's events go to its new
    partition as each producer learns of it, while producers that have not yet send to the old
    one: both are applied, each behind its own fence, each event once (retries of an id on the
    other partition dropped by the id window)."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(GROW_YAML)
    # the worker learns of new partitions at its next metadata refresh: 5 minutes by default
    settings = make_settings(
        boards=boards, topic_updates_partitions=3, kafka={"topic.metadata.refresh.interval.ms": "500"}
    )
    ensure_topics(settings)
    rng = random.Random(11)
    now = int(time.time() * 1000)
    members = [f"m{i:03d}" for i in range(50)]
    ts = {m: now - 60_000 - i for i, m in enumerate(members)}  # a member's tie, whatever the order
    scores: dict[str, dict[str, int]] = {b: defaultdict(int) for b in GROW_BOARDS}
    counts = dict.fromkeys(GROW_BOARDS, 0)

    def send(n: int, phase: str, targets: Callable[[str], list[int]]) -> None:
        # a new producer each phase: it knows the partitions there are now
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
        for i in range(n):
            board, member, score = rng.choice(GROW_BOARDS), rng.choice(members), rng.randrange(1, 9)
            value = json.dumps({"id": f"{phase}-{i}", "board": board, "member": member, "op": "incr",
                                "score": score, "ts": ts[member]}).encode()  # fmt: skip
            first, *other = rng.sample(targets(board), len(targets(board)))
            producer.produce(settings.topic_updates, value, key=board.encode(), partition=first)
            if other and rng.random() < 0.1:  # a producer's retry, on the other partition
                producer.produce(settings.topic_updates, value, key=board.encode(), partition=other[0])
            scores[board][member] += score
            counts[board] += 1
        assert producer.flush(30) == 0

    def old(board: str) -> int:
        return zlib.crc32(board.encode()) % 3

    def new(board: str) -> int:
        return zlib.crc32(board.encode()) % UPDATE_PARTITIONS

    moved = [b for b in GROW_BOARDS if new(b) >= 3]
    assert moved  # some boards' partition changes with the count: the case this test is about
    with running_worker(settings):
        send(3_000, "before", lambda b: [old(b)])
        wait_for(lambda: applied_so_far(rclient, settings, GROW_BOARDS) >= 3_000, 120, "the first events")
        admin.create_partitions([NewPartitions(settings.topic_updates, UPDATE_PARTITIONS)])[
            settings.topic_updates
        ].result(30)
        wait_for(lambda: partitions(admin, settings.topic_updates) == UPDATE_PARTITIONS, 30, "the partitions")
        send(3_000, "switch", lambda b: sorted({old(b), new(b)}))  # producers switching one by one
        send(3_000, "after", lambda b: [new(b)])
        wait_applied_and_committed(rclient, settings, sum(counts.values()), boards=GROW_BOARDS)
    committed = committed_offsets(settings)
    assert all(committed.get(new(b), 0) > 0 for b in moved)  # the new partitions were consumed
    mode = tie_mode(parse_boards(GROW_YAML).types["grow"])
    for board in GROW_BOARDS:
        keys = BoardKeys(settings.key_prefix, board)
        assert int(rclient.get(keys.seq) or 0) == counts[board], board
        got = {m.decode(): s for m, s in rclient.zrange(keys.rank("total"), 0, -1, withscores=True)}
        assert got == {encode_member(mode, ts[m], m): float(s) for m, s in scores[board].items()}, board
    # `rankstream topics` now tells the setting to follow the topic, and is content once it does
    with pytest.raises(TopicsDifferError, match="partitions 6, configured 3"):
        ensure_topics(settings)
    assert ensure_topics(settings.model_copy(update={"topic_updates_partitions": UPDATE_PARTITIONS})) == []
