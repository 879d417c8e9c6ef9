"""`rankstream worker`: wires settings, clients, the loop, probes and signals together."""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import redis

from common.boards import load_boards
from common.clients import kafka_consumer, kafka_producer, redis_client
from common.health import serve_probes
from common.settings import Settings
from worker.apply import Applier
from worker.consumer import WorkerLoop
from worker.dlq import DeadLetters
from worker.metrics import WorkerMetrics

_log = logging.getLogger(__name__)


def build_loop(settings: Settings, metrics: WorkerMetrics) -> tuple[WorkerLoop, redis.Redis]:
    boards = load_boards(settings.boards)
    client = redis_client(settings)
    consumer = kafka_consumer(
        settings,
        **{
            "group.id": settings.worker_group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.partition.eof": False,
        },
    )
    producer = kafka_producer(settings, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5})
    applier = Applier(client, boards, settings.key_prefix, settings.dedupe_window_s * 1000)
    loop = WorkerLoop(
        consumer=consumer,
        boards=boards,
        applier=applier,
        dead_letters=DeadLetters(producer, settings.topic_dlq),
        metrics=metrics,
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
