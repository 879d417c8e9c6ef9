"""Builds the Redis and Kafka clients from settings, turning config mistakes into ConfigError."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from redis.exceptions import RedisClusterException, RedisError

from common.errors import ConfigError, InfrastructureError
from common.settings import Settings
from common.store.topology import CLUSTER_HINT, Store, connect, is_cluster_node


def redis_client(settings: Settings, **kwargs: Any) -> Store:
    """A client of the configured Redis: one server or a cluster (common/store/topology.py). A
    cluster client reads the slot map from its node when built: an unreachable node is an
    InfrastructureError here, as it would be at the first call of a single-node client."""
    url = settings.redis_url.get_secret_value()
    if url.startswith("rediss://"):
        kwargs = {**settings.redis_tls().redis_kwargs(), **kwargs}
    try:
        client = connect(url, settings.redis_cluster, socket_timeout=5, socket_connect_timeout=2, **kwargs)
    except ValueError as exc:
        raise ConfigError(f"RANKSTREAM_REDIS_URL: {exc}") from None
    except (RedisError, RedisClusterException) as exc:  # a cluster client reads the slot map now
        where = urlsplit(url)
        raise InfrastructureError(
            f"cannot reach the Redis Cluster at {where.hostname}:{where.port or 6379}: {str(exc)[:200]}"
        ) from None
    if isinstance(client, redis.Redis) and _answers_as_cluster(client):
        raise ConfigError(f"RANKSTREAM_REDIS_URL names a Redis Cluster node: {CLUSTER_HINT}")
    return client


def _answers_as_cluster(client: redis.Redis) -> bool:
    """A single-node client talking to a cluster node would meet MOVED on most keys. Unknown
    (Redis away, INFO refused): False, and the calls that follow report the trouble."""
    try:
        return is_cluster_node(client)
    except RedisError:
        return False


def kafka_producer(
    settings: Settings, extra: dict[str, Any], defaults: dict[str, Any] | None = None
) -> Producer:
    """`extra` always applies; `defaults` yield to RANKSTREAM_KAFKA_* pass-through keys."""
    try:
        return Producer(settings.librdkafka(extra, defaults))
    except KafkaException as exc:
        raise ConfigError(f"Kafka producer config: {exc.args[0].str()}") from None


def kafka_consumer(
    settings: Settings, extra: dict[str, Any], defaults: dict[str, Any] | None = None
) -> Consumer:
    """`extra` always applies; `defaults` yield to RANKSTREAM_KAFKA_* pass-through keys."""
    try:
        return Consumer(settings.librdkafka(extra, defaults))
    except KafkaException as exc:
        raise ConfigError(f"Kafka consumer config: {exc.args[0].str()}") from None


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The Kafka error a failed call carries: a KafkaException's, or that of the KafkaException a
    SystemError wraps (confluent-kafka raises a fatal error, such as an idempotent producer
    refused its producer id, as a SystemError from the next callback it runs)."""
    for found in (exc, exc.__cause__, exc.__context__):
        if isinstance(found, KafkaException) and found.args and isinstance(found.args[0], KafkaError):
            return found.args[0]
    return None


def is_authorization(error: KafkaError) -> bool:
    """Kafka refused the call for want of an ACL."""
    return "AUTHORIZATION" in (error.name() or "")
