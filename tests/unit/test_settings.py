from __future__ import annotations

import pytest
from pydantic import SecretStr

from common.errors import ConfigError
from common.settings import KAFKA_LOG, load_settings


def test_defaults_point_at_the_local_stack():
    s = load_settings({})
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.redis_url.get_secret_value() == "redis://127.0.0.1:6379/0"
    assert (s.topic_updates, s.topic_dlq, s.topic_cache) == ("update_rank", "update_rank.dlq", "update_cache")
    assert (s.id_window_s, s.dedupe_window_s) == (3600, 7 * 24 * 3600)


def test_environment_is_read_and_frozen():
    s = load_settings({"RANKSTREAM_KAFKA_BOOTSTRAP": "k:1", "RANKSTREAM_API_PORT": "9000"})
    assert (s.kafka_bootstrap, s.api_port) == ("k:1", 9000)
    with pytest.raises(ValueError, match="frozen"):
        s.api_port = 1  # type: ignore[misc]  # the point: it must refuse


def test_librdkafka_passthrough_keeps_secrets_secret():
    s = load_settings(
        {
            "RANKSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "RANKSTREAM_KAFKA_SASL_PASSWORD": "hunter2",
        }
    )
    assert isinstance(s.kafka["sasl.password"], SecretStr)
    assert "hunter2" not in repr(s)
    conf = s.librdkafka({"group.id": "g"}, defaults={"linger.ms": 5, "security.protocol": "PLAINTEXT"})
    assert conf == {
        "bootstrap.servers": "127.0.0.1:9092",
        "linger.ms": 5,
        "security.protocol": "SASL_SSL",  # pass-through beats a default
        "sasl.password": "hunter2",
        "group.id": "g",
        "logger": KAFKA_LOG,  # librdkafka's lines become the process' log lines
    }


def test_redis_url_is_secret():
    s = load_settings({"RANKSTREAM_REDIS_URL": "redis://:pw@host:6379/0"})
    assert "pw" not in repr(s)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANKSTREAM_KAFKA_BOOTSTRAPP": "x"}, None),  # a typo of a pass-through is librdkafka's to refuse
        ({"RANKSTREAM_REDIS_ULR": "x"}, "unknown setting RANKSTREAM_REDIS_ULR"),
        ({"RANKSTREAM_API_PORT": "eighty"}, "RANKSTREAM_API_PORT"),
        ({"RANKSTREAM_API_PORT": "70000"}, "RANKSTREAM_API_PORT"),
        ({"RANKSTREAM_LOG_LEVEL": "LOUD"}, "unknown log level"),
        ({"RANKSTREAM_KEY_PREFIX": "a{b}"}, "RANKSTREAM_KEY_PREFIX"),
        ({"RANKSTREAM_DEDUPE_WINDOW_S": "1"}, "RANKSTREAM_DEDUPE_WINDOW_S"),
        ({"RANKSTREAM_WORKER_START_TIMEOUT_S": "0"}, "RANKSTREAM_WORKER_START_TIMEOUT_S"),
        ({"RANKSTREAM_WORKER_START_TIMEOUT_S": "601"}, "RANKSTREAM_WORKER_START_TIMEOUT_S"),
        ({"RANKSTREAM_TOPIC_UPDATES_PARTITIONS": "0"}, "RANKSTREAM_TOPIC_UPDATES_PARTITIONS"),
        ({"RANKSTREAM_TOPIC_CACHE_PARTITIONS": "10001"}, "RANKSTREAM_TOPIC_CACHE_PARTITIONS"),
        ({"RANKSTREAM_TOPIC_REPLICATION": "0"}, "RANKSTREAM_TOPIC_REPLICATION"),
        ({"RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "0"}, "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS"),
        # seconds written where milliseconds belong: 7 days of seconds is 10 minutes of ms
        ({"RANKSTREAM_TOPIC_UPDATES_RETENTION_MS": "604800"}, "RANKSTREAM_TOPIC_UPDATES_RETENTION_MS"),
        ({"RANKSTREAM_TOPIC_DLQ_RETENTION_MS": "0"}, "RANKSTREAM_TOPIC_DLQ_RETENTION_MS"),
        ({"RANKSTREAM_TOPIC_RESULTS_RETENTION_MS": "-2"}, "RANKSTREAM_TOPIC_RESULTS_RETENTION_MS"),
    ],
)
def test_bad_settings_fail_with_one_line(env, message):
    if message is None:
        assert load_settings(env).kafka["bootstrapp"] == "x"
        return
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(env)
    assert "\n" not in str(info.value)


def test_the_worker_state_cells_setting_bounds():
    assert load_settings({"RANKSTREAM_WORKER_STATE_CELLS": "0"}).worker_state_cells == 0
    with pytest.raises(ConfigError, match="RANKSTREAM_WORKER_STATE_CELLS"):
        load_settings({"RANKSTREAM_WORKER_STATE_CELLS": "-1"})


def test_topic_defaults_suit_a_three_broker_cluster():
    s = load_settings({})
    assert (s.topic_replication, s.topic_min_insync_replicas) == (3, 2)
    assert (s.topic_updates_partitions, s.topic_dlq_partitions) == (6, 1)
    assert (s.topic_cache_partitions, s.topic_results_partitions) == (6, 3)
    day = 86_400_000
    assert (s.topic_updates_retention_ms, s.topic_dlq_retention_ms, s.topic_results_retention_ms) == (
        7 * day,
        30 * day,
        30 * day,
    )


def test_retention_may_be_forever_or_an_hour_and_more():
    s = load_settings(
        {"RANKSTREAM_TOPIC_UPDATES_RETENTION_MS": "-1", "RANKSTREAM_TOPIC_DLQ_RETENTION_MS": "3600000"}
    )
    assert (s.topic_updates_retention_ms, s.topic_dlq_retention_ms) == (-1, 3_600_000)


def test_min_insync_replicas_above_the_replication_factor_is_one_config_line():
    env = {"RANKSTREAM_TOPIC_REPLICATION": "2", "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "3"}
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert str(info.value) == (
        "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS: 3 is more than RANKSTREAM_TOPIC_REPLICATION (2): "
        "no write with acks=all could ever succeed"
    )
    single = load_settings({"RANKSTREAM_TOPIC_REPLICATION": "1", "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "1"})
    assert (single.topic_replication, single.topic_min_insync_replicas) == (1, 1)
