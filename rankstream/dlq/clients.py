"""The Kafka clients of `rankstream dlq`, and the one check that a topic is there.

librdkafka logs a line per connection attempt: a broker that refuses connections fills a
command's output with hundreds of the same line before the command can say, in one, that Kafka
did not answer. These clients log each distinct line once."""

from __future__ import annotations

import logging
import re
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from common.errors import ConfigError, InfrastructureError
from common.settings import KAFKA_LOG, Settings

METADATA_TIMEOUT_S = 10.0
_UNANSWERED = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)


class _Once(logging.Filter):
    """Each line once, lines that differ only in their numbers being the same line (librdkafka
    says how long each attempt took: `after 0ms in state CONNECT`, `after 7ms ...`)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        line = _NUMBERS.sub("#", record.getMessage())
        if line in self._seen:
            return False
        self._seen.add(line)
        return True


_NUMBERS = re.compile(r"\d+")


_LOG = KAFKA_LOG.getChild("dlq")
_LOG.addFilter(_Once())


def _config(settings: Settings, extra: dict[str, Any], defaults: dict[str, Any] | None) -> dict[str, Any]:
    return {**settings.librdkafka(extra, defaults), "logger": _LOG}


def consumer(settings: Settings, extra: dict[str, Any]) -> Consumer:
    try:
        return Consumer(_config(settings, extra, None))
    except KafkaException as exc:
        raise ConfigError(f"Kafka consumer config: {exc.args[0].str()}") from None


def producer(settings: Settings, extra: dict[str, Any], defaults: dict[str, Any]) -> Producer:
    try:
        return Producer(_config(settings, extra, defaults))
    except KafkaException as exc:
        raise ConfigError(f"Kafka producer config: {exc.args[0].str()}") from None


def unanswered(error: KafkaError) -> bool:
    """No broker answered (down, unreachable, a wrong bootstrap)."""
    return error.code() in _UNANSWERED


def topic_partitions(client: Consumer | Producer, settings: Settings, topic: str, setting: str) -> list[int]:
    """The topic's partitions. Missing: ConfigError naming `setting`; Kafka not answering:
    InfrastructureError; refused (no Describe ACL): Kafka's own error, said by the command."""
    try:
        found = client.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException as exc:
        if unanswered(exc.args[0]):
            raise InfrastructureError(
                f"Kafka at {settings.kafka_bootstrap} did not answer within {METADATA_TIMEOUT_S:g} s"
            ) from None
        raise
    error = None if found is None else found.error
    if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise ConfigError(f"topic {topic} ({setting}) does not exist: `rankstream topics` creates it")
    if error is not None:
        raise KafkaException(error)
    return sorted(found.partitions)
