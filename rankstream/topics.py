"""Creates rankstream's topics as the settings describe them, and checks the ones that exist:
`rankstream topics`, the local stack, tests and a deploy job use it (docs/operations/topics.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime, not in the stub's __all__
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from common.errors import ConfigError, InfrastructureError, TopicsDifferError
from common.results import MAX_RESULT_BYTES
from common.settings import CACHE_PARTITIONS, RESULTS_PARTITIONS, UPDATES_PARTITIONS, Settings, env_name

_log = logging.getLogger(__name__)

# The defaults' one home is common/settings.py; tests and benchmarks count partitions with these.
UPDATE_PARTITIONS = UPDATES_PARTITIONS
__all__ = [
    "CACHE_PARTITIONS",
    "RESULTS_PARTITIONS",
    "UPDATE_PARTITIONS",
    "TopicSpec",
    "differences",
    "ensure_topics",
    "topic_specs",
]


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication: int
    config: dict[str, str]
    # what sets what, for the lines that name a difference: "partitions" or a config key -> variable
    settings: dict[str, str] = field(default_factory=dict)


# update_rank takes messages up to 2 MiB (an array of 500 events with 1 KiB metas is ~1 MiB);
# the dead-letter topic the same, and the worker truncates what still does not fit.
MAX_MESSAGE_BYTES = str(2 * 1024 * 1024)
_ISR = "min.insync.replicas"


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The five topics: partitions, replication and the configs `rankstream topics` sets."""
    isr = {_ISR: str(settings.topic_min_insync_replicas)}
    isr_env = {_ISR: env_name("topic_min_insync_replicas")}

    def spec(name: str, partitions: str, config: dict[str, str], retention: str | None = None) -> TopicSpec:
        names = {
            "partitions": env_name(partitions),
            "replication factor": env_name("topic_replication"),
            **isr_env,
        }
        if retention is not None:
            config = {**config, "retention.ms": str(getattr(settings, retention))}
            names["retention.ms"] = env_name(retention)
        return TopicSpec(
            name, getattr(settings, partitions), settings.topic_replication, {**config, **isr}, names
        )

    return [
        spec(
            settings.topic_updates,
            "topic_updates_partitions",
            {"max.message.bytes": MAX_MESSAGE_BYTES},
            "topic_updates_retention_ms",
        ),
        spec(
            settings.topic_dlq,
            "topic_dlq_partitions",
            {"max.message.bytes": MAX_MESSAGE_BYTES},
            "topic_dlq_retention_ms",
        ),
        # Compacted: replay cost grows with members, not events; no time retention (a hot board's
        # member that has not changed for a year is still part of it). Hourly segments let the
        # cleaner compact the log instead of leaving a week of history in the active segment.
        spec(
            settings.topic_cache,
            "topic_cache_partitions",
            {"cleanup.policy": "compact", "segment.ms": "3600000", "min.cleanable.dirty.ratio": "0.1"},
        ),
        # Compaction keeps one record per period key (a republished result replaces the first),
        # so a consumer that compacts, or reads late, sees each period once.
        spec(
            settings.topic_results,
            "topic_results_partitions",
            {"cleanup.policy": "compact,delete", "max.message.bytes": str(MAX_RESULT_BYTES)},
            "topic_results_retention_ms",
        ),
        # The dead-letter replay ledger (rankstream/dlq/ledger.py): a record per replayed dead
        # letter, keyed by its place. Compacted, no time retention: a record must stay known as
        # replayed for as long as the dead-letter topic may still hold it.
        spec(settings.topic_dlq_replayed, "topic_dlq_replayed_partitions", {"cleanup.policy": "compact"}),
    ]


def ensure_topics(settings: Settings, timeout: float = 30.0, *, strict: bool = True) -> list[str]:
    """Create the missing topics; return the names created.

    Existing topics are never changed: each is compared with what would be created (partitions,
    replication factor, the configs set here). `strict` (`rankstream topics`): any difference
    raises TopicsDifferError, one line each, before anything is created. Not strict (the local
    stack, which may hold topics an older release made): each difference is logged, and the
    missing topics are created all the same. A replication factor above the brokers the cluster
    reports raises ConfigError."""
    if settings.topic_min_insync_replicas > settings.topic_replication:  # a model_copy skips validation
        raise ConfigError(
            f"{env_name('topic_min_insync_replicas')} ({settings.topic_min_insync_replicas}) is more than "
            f"{env_name('topic_replication')} ({settings.topic_replication})"
        )
    refused: list[KafkaError] = []  # a refused login: librdkafka says it here, and retries
    admin = AdminClient(settings.librdkafka({"error_cb": refused.append}))
    specs = topic_specs(settings)
    metadata = _metadata(admin, settings, timeout, refused)
    existing = [s for s in specs if s.name in metadata.topics and metadata.topics[s.name].partitions]
    lines = differences(admin, existing, metadata.topics, timeout) if existing else []
    if lines and strict:
        raise TopicsDifferError(lines)
    for line in lines:
        _log.warning("existing topic differs from the settings; left as it is", extra={"difference": line})
    missing = [s for s in specs if s.name not in {e.name for e in existing}]
    if not missing:
        return []
    brokers = len(metadata.brokers)
    if settings.topic_replication > brokers:
        raise ConfigError(
            f"{env_name('topic_replication')} is {settings.topic_replication}, more than the "
            f"{brokers} broker{'' if brokers == 1 else 's'} Kafka at {settings.kafka_bootstrap} "
            f"reports: set it to at most {brokers}"
        )
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication, config=s.config) for s in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            # already exists: created meanwhile by another run (or still being deleted)
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfrastructureError(f"creating topic {name}: {exc.args[0].str()}") from None
        except TimeoutError:  # no broker answered (a wrong bootstrap, or Kafka down)
            raise InfrastructureError(
                f"creating topic {name}: Kafka at {settings.kafka_bootstrap} did not answer in {timeout:g} s"
            ) from None
    _wait_visible(admin, created, timeout)
    return created


_LOGIN_REFUSED = (KafkaError._AUTHENTICATION, KafkaError._SSL)
_UNANSWERED = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)


def _metadata(admin: AdminClient, settings: Settings, timeout: float, refused: list[KafkaError]) -> Any:
    """The cluster's metadata: every topic with its partitions' replicas, and the brokers. A
    login the brokers refuse (a wrong password, a certificate they do not trust) is said as
    soon as librdkafka reports it, not as a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            error = exc.args[0]
            admin.poll(0)  # serves the error callback
            login = next((e for e in refused if e.code() in _LOGIN_REFUSED), None)
            if login is not None:
                raise InfrastructureError(
                    f"Kafka at {settings.kafka_bootstrap} refused the login: {login.str()}"
                ) from None
            if error.code() not in (
                KafkaError._TRANSPORT,
                KafkaError._TIMED_OUT,
                KafkaError._ALL_BROKERS_DOWN,
            ):
                raise InfrastructureError(f"listing topics: {error.str()}") from None
            if time.monotonic() >= deadline:
                raise InfrastructureError(
                    f"listing topics: Kafka at {settings.kafka_bootstrap} did not answer in {timeout:g} s"
                ) from None


def differences(
    admin: AdminClient, specs: list[TopicSpec], topics: Mapping[str, Any], timeout: float
) -> list[str]:
    """One line per setting in which an existing topic differs from its spec: partitions,
    replication factor (of every partition), and each config the spec sets."""
    resources = {s.name: ConfigResource(ResourceType.TOPIC, s.name) for s in specs}
    futures = admin.describe_configs(list(resources.values()), request_timeout=timeout)
    lines = []
    for spec in specs:
        partitions = topics[spec.name].partitions
        found: dict[str, str] = {"partitions": str(len(partitions))}
        factors = sorted({len(p.replicas) for p in partitions.values()})
        found["replication factor"] = "/".join(str(f) for f in factors)
        reading = f"reading the config of topic {spec.name}"
        try:
            configs = futures[resources[spec.name]].result(timeout=timeout)
        except KafkaException as exc:
            raise InfrastructureError(f"{reading}: {exc.args[0].str()}") from None
        except TimeoutError:
            raise InfrastructureError(f"{reading}: no answer in {timeout:g} s") from None
        found.update({key: configs[key].value for key in spec.config if key in configs})
        wanted = {
            "partitions": str(spec.partitions),
            "replication factor": str(spec.replication),
            **spec.config,
        }
        for key, value in wanted.items():
            have = found.get(key)
            if have is None or not _same(key, have, value):
                setting = spec.settings.get(key)
                named = f" ({setting})" if setting else ""
                lines.append(f"topic {spec.name}: {key} {have or '(not set)'}, configured {value}{named}")
    return lines


def _same(key: str, have: str, want: str) -> bool:
    """Kafka may hand back a list in another order, a number in another spelling."""
    if key == "cleanup.policy":
        return sorted(have.replace(" ", "").split(",")) == sorted(want.split(","))
    try:
        return float(have) == float(want)
    except ValueError:
        return have == want


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
