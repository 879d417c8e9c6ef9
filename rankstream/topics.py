"""Creates rankstream's topics (idempotent): the local stack, tests and a deploy job use it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported at runtime, not in the stub's __all__

from common.errors import InfrastructureError
from common.results import MAX_RESULT_BYTES
from common.settings import Settings

UPDATE_PARTITIONS = 6
CACHE_PARTITIONS = 6
RESULTS_PARTITIONS = 3


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


# update_rank takes messages up to 2 MiB (an array of 500 events with 1 KiB metas is ~1 MiB);
# the dead-letter topic the same, and the worker truncates what still does not fit.
MAX_MESSAGE_BYTES = str(2 * 1024 * 1024)
# Results are kept 30 days; compaction keeps one record per period key (a republished result
# replaces the first), so a consumer that compacts, or reads late, sees each period once.
RESULTS_RETENTION_MS = str(30 * 86_400_000)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    return [
        TopicSpec(settings.topic_updates, UPDATE_PARTITIONS, {"max.message.bytes": MAX_MESSAGE_BYTES}),
        TopicSpec(settings.topic_dlq, 1, {"max.message.bytes": MAX_MESSAGE_BYTES}),
        # Compacted: replay cost grows with members, not events. Hourly segments let the
        # cleaner compact the log instead of leaving a week of history in the active segment.
        TopicSpec(
            settings.topic_cache,
            CACHE_PARTITIONS,
            {"cleanup.policy": "compact", "segment.ms": "3600000", "min.cleanable.dirty.ratio": "0.1"},
        ),
        TopicSpec(
            settings.topic_results,
            RESULTS_PARTITIONS,
            {
                "cleanup.policy": "compact,delete",
                "retention.ms": RESULTS_RETENTION_MS,
                "max.message.bytes": str(MAX_RESULT_BYTES),
            },
        ),
    ]


def ensure_topics(settings: Settings, replication: int = 1, timeout: float = 30.0) -> list[str]:
    """Create missing topics; return the names created. Existing topics are left as they are."""
    admin = AdminClient(settings.librdkafka())
    specs = topic_specs(settings)
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, replication, config=s.config) for s in specs],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfrastructureError(f"creating topic {name}: {exc.args[0].str()}") from None
        except TimeoutError:  # no broker answered (a wrong bootstrap, or Kafka down)
            raise InfrastructureError(
                f"creating topic {name}: Kafka at {settings.kafka_bootstrap} did not answer in {timeout:g} s"
            ) from None
    _wait_visible(admin, created, timeout)
    return created


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Until the broker's metadata shows every topic in `names` with its partitions: the
    controller creates a topic, and a broker answers metadata from a cache that learns of it a
    moment later, so a step right after (a backfill, a worker's start) could find it missing."""
    deadline = time.monotonic() + timeout
    missing = set(names)
    while missing:
        topics = admin.list_topics(timeout=max(deadline - time.monotonic(), 1.0)).topics
        missing = {
            n for n in missing if n not in topics or topics[n].error is not None or not topics[n].partitions
        }
        if missing and time.monotonic() > deadline:
            raise InfrastructureError(
                f"topics created but not in the broker's metadata: {', '.join(sorted(missing))}"
            )
        if missing:
            time.sleep(0.05)
