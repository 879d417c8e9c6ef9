"""Builds the Redis and Kafka clients from settings, turning config mistakes into ConfigError."""

from __future__ import annotations

from typing import Any

import redis
from confluent_kafka import Consumer, KafkaException, Producer

from common.errors import ConfigError
from common.settings import Settings


def redis_client(settings: Settings, **kwargs: Any) -> redis.Redis:
    try:
        return redis.Redis.from_url(
            settings.redis_url.get_secret_value(), socket_timeout=5, socket_connect_timeout=2, **kwargs
        )
    except ValueError as exc:
        raise ConfigError(f"RANKSTREAM_REDIS_URL: {exc}") from None


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
