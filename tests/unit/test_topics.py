"""What `rankstream topics` would create, from the settings, and how it reads Kafka's answers
(the broker itself: tests/integration/test_topics.py)."""

from __future__ import annotations

import os

import pytest

from common.errors import ConfigError
from common.settings import load_settings
from rankstream.cli import main
from rankstream.topics import (
    CACHE_PARTITIONS,
    RESULTS_PARTITIONS,
    UPDATE_PARTITIONS,
    _same,
    ensure_topics,
    topic_specs,
)


def test_the_specs_follow_the_settings():
    settings = load_settings(
        {
            "RANKSTREAM_TOPIC_REPLICATION": "5",
            "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "3",
            "RANKSTREAM_TOPIC_UPDATES_PARTITIONS": "24",
            "RANKSTREAM_TOPIC_UPDATES_RETENTION_MS": "-1",
            "RANKSTREAM_TOPIC_DLQ_PARTITIONS": "2",
            "RANKSTREAM_TOPIC_CACHE_PARTITIONS": "12",
            "RANKSTREAM_TOPIC_RESULTS_RETENTION_MS": "7200000",
            "RANKSTREAM_TOPIC_DLQ_REPLAYED_PARTITIONS": "4",
        }
    )
    updates, dlq, cache, results, replayed = specs = topic_specs(settings)
    assert [s.name for s in specs] == [
        "update_rank",
        "update_rank.dlq",
        "update_cache",
        "rank_period_closed",
        "update_rank.dlq.replayed",
    ]
    assert [s.partitions for s in specs] == [24, 2, 12, 3, 4]
    assert {s.replication for s in specs} == {5}
    assert all(s.config["min.insync.replicas"] == "3" for s in specs)
    assert updates.config == {"max.message.bytes": str(2 * 1024 * 1024), "retention.ms": "-1",
                              "min.insync.replicas": "3"}  # fmt: skip
    assert dlq.config["retention.ms"] == str(30 * 86_400_000)
    # compacted, no time retention: a member unchanged for a year still belongs to its board
    assert "retention.ms" not in cache.config
    assert cache.config["cleanup.policy"] == "compact"
    assert results.config["retention.ms"] == "7200000"
    assert results.config["cleanup.policy"] == "compact,delete"
    # the replay ledger: compacted, no time retention (a replayed dead letter stays known)
    assert replayed.config == {"cleanup.policy": "compact", "min.insync.replicas": "3"}
    assert replayed.settings["partitions"] == "RANKSTREAM_TOPIC_DLQ_REPLAYED_PARTITIONS"
    assert updates.settings["partitions"] == "RANKSTREAM_TOPIC_UPDATES_PARTITIONS"
    assert cache.settings["replication factor"] == "RANKSTREAM_TOPIC_REPLICATION"


def test_the_partition_constants_are_the_defaults():
    updates, _, cache, results, _ = topic_specs(load_settings({}))
    assert (updates.partitions, cache.partitions, results.partitions) == (
        UPDATE_PARTITIONS,
        CACHE_PARTITIONS,
        RESULTS_PARTITIONS,
    )


@pytest.mark.parametrize(
    ("key", "have", "want", "same"),
    [
        ("cleanup.policy", "delete,compact", "compact,delete", True),
        ("cleanup.policy", "compact", "compact,delete", False),
        ("min.cleanable.dirty.ratio", "0.10", "0.1", True),
        ("retention.ms", "604800000", "2592000000", False),
        ("retention.ms", "-1", "-1", True),
    ],
)
def test_kafka_s_spelling_of_a_value_is_not_a_difference(key, have, want, same):
    assert _same(key, have, want) is same


def test_a_copy_with_min_isr_above_replication_is_refused_before_kafka_is_asked():
    settings = load_settings({}).model_copy(update={"topic_replication": 1})  # min ISR stays 2
    with pytest.raises(ConfigError, match="RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS"):
        ensure_topics(settings, timeout=0.1)


def test_topics_with_min_isr_above_replication_exits_2_with_one_line(monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith("RANKSTREAM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RANKSTREAM_TOPIC_REPLICATION", "1")
    monkeypatch.setenv("RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS", "2")
    assert main(["topics"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "rankstream: RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS: 2 is more than RANKSTREAM_TOPIC_REPLICATION (1): "
        "no write with acks=all could ever succeed"
    ]
