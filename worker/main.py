"""`rankstream worker`: wires settings, clients, the loop, probes and signals together."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import orjson
import redis
from confluent_kafka import Producer

from common.boards import BoardsConfig, load_boards
from common.clients import kafka_consumer, kafka_producer, redis_client
from common.errors import InfrastructureError
from common.health import serve_probes
from common.settings import Settings
from worker.apply import Applier
from worker.backfill import backfill_all
from worker.consumer import WorkerLoop
from worker.dlq import DeadLetters
from worker.metrics import WorkerMetrics
from worker.publisher import CachePublisher

_log = logging.getLogger(__name__)


def lag_reporter(metrics: WorkerMetrics) -> Callable[[str], None]:
    """librdkafka statistics -> consumer lag per assigned partition."""

    def on_stats(raw: str) -> None:
        stats = orjson.loads(raw)
        for topic in stats.get("topics", {}).values():
            for partition, info in topic.get("partitions", {}).items():
                lag = info.get("consumer_lag", -1)
                if partition != "-1" and lag >= 0:
                    metrics.lag.labels(partition).set(lag)

    return on_stats


def cache_publisher(
    settings: Settings, boards: BoardsConfig, producer: Producer, client: redis.Redis
) -> CachePublisher:
    """The update_cache publisher; every hot board is backfilled before the worker consumes."""
    topic = producer.list_topics(settings.topic_cache, timeout=10).topics.get(settings.topic_cache)
    if topic is None or topic.error is not None or not topic.partitions:
        raise InfrastructureError(f"topic {settings.topic_cache} is missing: run `rankstream topics`")
    publisher = CachePublisher(
        producer,
        settings.topic_cache,
        partitions=len(topic.partitions),
        boards=boards,
        client=client,
        key_prefix=settings.key_prefix,
    )
    backfill_all(client, publisher, boards, settings.key_prefix)  # before consuming: see backfill.py
    return publisher


def build_loop(settings: Settings, metrics: WorkerMetrics) -> tuple[WorkerLoop, redis.Redis]:
    boards = load_boards(settings.boards)
    client = redis_client(settings)
    consumer = kafka_consumer(
        settings,
        # what exactly-once application depends on: never overridden
        {
            "group.id": settings.worker_group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "stats_cb": lag_reporter(metrics),
        },
        # tunable through RANKSTREAM_KAFKA_*: a crashed worker's partitions move after 10 s, not 45
        defaults={
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 2_000,
            "statistics.interval.ms": 5_000,
        },
    )
    producer = kafka_producer(
        settings, {"enable.idempotence": True, "acks": "all"}, defaults={"linger.ms": 5}
    )
    publisher = cache_publisher(settings, boards, producer, client) if boards.hot else None
    applier = Applier(client, boards, settings.key_prefix, settings.dedupe_window_s * 1000)
    loop = WorkerLoop(
        consumer=consumer,
        boards=boards,
        applier=applier,
        dead_letters=DeadLetters(producer, settings.topic_dlq),
        metrics=metrics,
        publisher=publisher,
        batch_size=settings.worker_batch_size,
        batch_timeout_s=settings.worker_batch_timeout_ms / 1000,
    )
    consumer.subscribe([settings.topic_updates], on_assign=loop.on_assign, on_revoke=loop.on_revoke)
    return loop, client


def run_worker(settings: Settings) -> int:
    metrics = WorkerMetrics()
    loop, client = build_loop(settings, metrics)

    def live() -> tuple[bool, dict[str, object]]:
        stalled = time.monotonic() - loop.last_loop
        return stalled < 60 + settings.worker_batch_timeout_ms / 1000, {"loop_stalled_s": round(stalled, 1)}

    def ready() -> tuple[bool, dict[str, object]]:
        try:
            redis_ok = bool(client.ping())
        except redis.RedisError:
            redis_ok = False
        return redis_ok, {"redis": redis_ok, "partitions": loop.assigned}

    server = serve_probes("0.0.0.0", settings.worker_http_port, live, ready, metrics.registry)  # noqa: S104
    deadline = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        _log.info("stopping: finishing the batch, committing", extra={"signal": signum})
        loop.request_stop()
        # the deadline: a batch stuck in back-off is abandoned uncommitted (safe: it is redone)
        timer = threading.Timer(settings.shutdown_deadline_s, deadline.set)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    _log.info("worker started", extra={"topic": settings.topic_updates, "group": settings.worker_group})
    try:
        loop.run()
    finally:
        if not deadline.is_set():
            loop.close()
        server.shutdown()
    _log.info("worker stopped")
    return 0
