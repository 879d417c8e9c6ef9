"""`rankstream worker`: wires settings, clients, the loop, probes and signals together."""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType

import orjson
import redis
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]  # re-exported at runtime

from common.boards import BoardsConfig, load_boards
from common.clients import kafka_consumer, kafka_producer, redis_client
from common.clock import Clock, service_clock, system_ms
from common.deadline import Deadline, exit_at
from common.errors import InfrastructureError
from common.health import serve_probes
from common.results import MAX_RESULT_BYTES
from common.settings import Settings
from common.store import shardcount
from common.store.replicas import ReplicaWait
from common.store.topology import Store
from worker.apply import Applier
from worker.backfill import backfill_all
from worker.consumer import WorkerLoop, exit_reserve
from worker.delivery import Deliveries
from worker.dlq import DeadLetters
from worker.fencing import PredecessorFence
from worker.metrics import WorkerMetrics
from worker.outputs import ProducerFenced, TransactionalOutputs
from worker.promotions import Promotions
from worker.publisher import CachePublisher
from worker.results import ResultEmitter, ResultsThread
from worker.rolling import PreparerThread, RollingPreparer
from worker.sources import SourceGuard, commits_reader

_log = logging.getLogger(__name__)
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


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
    settings: Settings,
    boards: BoardsConfig,
    producer: Producer,
    client: Store,
    promotions: Promotions | None = None,
) -> CachePublisher:
    """A publisher over a plain (acknowledged) producer that backfills every hot board not yet
    backfilled: what a worker does before it consumes, and `rankstream backfill` by hand."""
    topic = producer.list_topics(settings.topic_cache, timeout=10).topics.get(settings.topic_cache)
    if topic is None or topic.error is not None or not topic.partitions:
        raise InfrastructureError(f"topic {settings.topic_cache} is missing: run `rankstream topics`")
    publisher = CachePublisher(
        Deliveries(producer, "update_cache"),
        settings.topic_cache,
        partitions=len(topic.partitions),
        boards=boards,
        client=client,
        key_prefix=settings.key_prefix,
        record_format=settings.cache_record_format,
        promotions=promotions,
    )
    backfill_all(client, publisher, boards, settings.key_prefix)  # before consuming: see backfill.py
    return publisher


def worker_id(settings: Settings) -> str:
    return settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"


def dlq_record_limit(settings: Settings) -> int:
    """The largest dead-letter record that fits both the producer and the topic."""
    producer_limit = int(settings.librdkafka().get("message.max.bytes", PRODUCER_MESSAGE_MAX_BYTES))
    try:
        resource = ConfigResource(ResourceType.TOPIC, settings.topic_dlq)
        admin = AdminClient(settings.librdkafka())
        config = admin.describe_configs([resource], request_timeout=10)[resource].result(timeout=10)
        topic_limit = int(config["max.message.bytes"].value)
    except (KafkaException, KeyError, ValueError, TimeoutError) as exc:  # TimeoutError: no broker answered
        _log.warning(
            "dead-letter topic limit unknown, assuming the broker default", extra={"error": str(exc)}
        )
        topic_limit = BROKER_DEFAULT_MAX_MESSAGE_BYTES
    return min(producer_limit, topic_limit)


def build_loop(
    settings: Settings, metrics: WorkerMetrics, clock: Clock = system_ms
) -> tuple[WorkerLoop, Store]:
    """The worker's wiring; `clock` is the service's clock (common/clock.py)."""
    boards = load_boards(settings.boards)
    client = redis_client(settings)
    deadline = Deadline()
    transactional_id = f"{settings.worker_group}-{worker_id(settings)}"
    consumer = kafka_consumer(
        settings,
        # what exactly-once application depends on: never overridden
        {
            "group.id": settings.worker_group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
            "stats_cb": lag_reporter(metrics),
        },
        # tunable through RANKSTREAM_KAFKA_*: a crashed worker's partitions move after 6 s
        # (the broker's smallest session timeout by default), not 45
        defaults={
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 6_000,
            "heartbeat.interval.ms": 1_500,
            "statistics.interval.ms": 5_000,
        },
    )
    transactional = functools.partial(
        kafka_producer,
        settings,
        {
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
        },
        # a dead worker's open transaction holds read_committed readers until it is aborted:
        # by its successor's init_transactions, or by the broker after this timeout
        defaults={"linger.ms": 5, "transaction.timeout.ms": 10_000},
    )
    outputs = TransactionalOutputs(transactional, deadline)
    # the settings are checked (the consumer above refuses a bad one); before Kafka is asked
    # anything, a config that would move a type's data under other keys must not start
    try:
        shardcount.check(client, settings.key_prefix, boards, os.fspath(settings.boards))
    except redis.RedisError as exc:
        raise InfrastructureError(f"Redis did not answer the worker's start (shard counts): {exc}") from None
    _log.info("registering the transactional id with Kafka", extra={"bootstrap": settings.kafka_bootstrap})
    try:
        outputs.init(settings.worker_start_timeout_s)
    except KafkaException as exc:  # no broker, or none that answers: one line, exit 1 (the pod restarts)
        raise InfrastructureError(
            f"Kafka at {settings.kafka_bootstrap} did not answer the worker's start "
            f"(init_transactions): {exc.args[0] if exc.args else exc}"
        ) from None
    applier = Applier(
        client, boards, settings.key_prefix, settings.id_window_s, now_ms=clock,
        state_cells=settings.worker_state_cells,
    )  # fmt: skip
    # every worker publishes: a board of the config's hot list, or one an API node registered
    # (worker/promotions.py). The backfill on a plain producer (it may outgrow a transaction),
    # live records in the batches' transactions
    backfill_producer = kafka_producer(settings, {"enable.idempotence": True, "acks": "all"})
    acked = cache_publisher(settings, boards, backfill_producer, client, applier.promotions)  # the preparer's
    publisher = acked.over(outputs)
    applier.tie_index = settings.tie_index
    applier.max_future_skew_s = settings.max_future_skew_s
    guard = SourceGuard(
        client,
        lambda: AdminClient(settings.librdkafka()),
        applier,
        make_reader=lambda: commits_reader(settings),
        key_prefix=settings.key_prefix,
        group=settings.worker_group,
        topic=settings.topic_updates,
        legacy_ttl_ms=settings.dedupe_window_s * 1000,
        adopt_window_ms=settings.id_window_s * 1000,
        slot_marks=settings.redis_cluster,
    )
    guard.start()
    preparer = None
    if any(board_type.rolling for board_type in boards.types.values()):
        rolling = RollingPreparer(
            redis_client(settings), boards, settings.key_prefix, clock=clock, epoch=lambda: applier.epoch,
            owner=transactional_id, publisher=acked, metrics=metrics,
        )  # fmt: skip
        preparer = PreparerThread(rolling)
    results = None
    # (a league's seasons end in records of their own: worker/results.py)
    if any(board_type.results or board_type.league for board_type in boards.types.values()):
        emitter = results_emitter(settings, redis_client(settings), boards, transactional_id, clock=clock,
                                  metrics=metrics)  # fmt: skip
        results = ResultsThread(emitter)
    fence = PredecessorFence(settings, client, transactional_id)
    metrics.watch(lambda: outputs.replaced, lambda: len(fence.fenced))
    metrics.watch_blocked(lambda: dict(guard.blocked))  # a copy: the apply thread writes it
    if applier.states is not None:
        metrics.watch_states(applier.states.stats)
    loop = WorkerLoop(
        consumer=consumer,
        boards=boards,
        applier=applier,
        outputs=outputs,
        dead_letters=DeadLetters(outputs, settings.topic_dlq, dlq_record_limit(settings)),
        metrics=metrics,
        deadline=deadline,
        publisher=publisher,
        fence=fence,
        guard=guard,
        preparer=preparer,
        results=results,
        replicas=ReplicaWait(
            client, settings.key_prefix, settings.redis_wait_replicas, settings.redis_wait_timeout_ms
        )
        if settings.redis_wait_replicas
        else None,
        batch_size=settings.worker_batch_size,
        batch_timeout_s=settings.worker_batch_timeout_ms / 1000,
        max_future_skew_s=settings.max_future_skew_s,
        shutdown_deadline_s=settings.shutdown_deadline_s,
        clock=clock,
    )
    consumer.subscribe(
        [settings.topic_updates], on_assign=loop.on_assign, on_revoke=loop.on_revoke, on_lost=loop.on_lost
    )
    return loop, client


def results_emitter(
    settings: Settings,
    client: Store,
    boards: BoardsConfig,
    owner: str,
    *,
    clock: Clock,
    metrics: WorkerMetrics | None,
) -> ResultEmitter:
    """worker/results.py's emitter: one transactional id for whichever worker holds its lease."""
    producer = functools.partial(
        kafka_producer,
        settings,
        {
            "transactional.id": f"{settings.worker_group}-results",
            "enable.idempotence": True,
            "acks": "all",
            "message.max.bytes": MAX_RESULT_BYTES + 65_536,  # a record's framing beyond it
            "allow.auto.create.topics": False,  # `rankstream topics` makes it, with its config
        },
        defaults={"compression.type": "zstd", "linger.ms": 0, "transaction.timeout.ms": 60_000},
    )
    reader = functools.partial(
        kafka_consumer,
        settings,
        {
            "group.id": f"{settings.worker_group}-results",  # never subscribes nor commits
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # a noted offset the log no longer holds (retention): read from what it holds
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": MAX_RESULT_BYTES * 2,
            "allow.auto.create.topics": False,
        },
    )
    return ResultEmitter(
        client, boards, prefix=settings.key_prefix, topic=settings.topic_results, owner=owner,
        producer=producer, reader=reader, clock=clock, metrics=metrics,
    )  # fmt: skip


def stop_on_signals(loop: WorkerLoop, shutdown_deadline_s: float) -> None:
    """SIGTERM and SIGINT start the one deadline: every blocking call from then on waits at most
    what is left of it, and the loop finishes its batch, commits and closes. Whatever still runs
    when the deadline has passed (a librdkafka destructor, say) is cut short: the process exits
    then, logging each thread's stack (common/deadline.py exit_at)."""

    asked: list[int] = []

    def _stop(signum: int, frame: FrameType | None) -> None:
        asked.append(signum)
        loop.request_stop()  # before the log: a log write that fails or blocks must not lose it
        _log.info("stopping: finishing the batch, committing", extra={"signal": signum})

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # a loop that ended by itself (fenced, a bug) and is cut short exits 1, as it would have
    exit_at(loop.deadline, exit_reserve(shutdown_deadline_s), status=lambda: 0 if asked else 1)


def run_worker(settings: Settings) -> int:
    metrics = WorkerMetrics()
    loop, client = build_loop(settings, metrics, service_clock(settings))
    guard = loop.guard

    def live() -> tuple[bool, dict[str, object]]:
        stalled = time.monotonic() - loop.last_loop
        return stalled < 60 + settings.worker_batch_timeout_ms / 1000, {"loop_stalled_s": round(stalled, 1)}

    def ready() -> tuple[bool, dict[str, object]]:
        try:
            redis_ok = bool(client.ping())
        except redis.RedisError:
            redis_ok = False
        now_blocked = dict(guard.blocked) if guard is not None else {}  # a copy: the apply thread writes it
        blocked = {str(p): b.reason for p, b in now_blocked.items()}
        return redis_ok and not blocked, {"redis": redis_ok, "partitions": loop.assigned, "blocked": blocked}

    metrics.ready.set_function(lambda: 1.0 if ready()[0] else 0.0)
    server = serve_probes("0.0.0.0", settings.worker_http_port, live, ready, metrics.registry)  # noqa: S104

    stop_on_signals(loop, settings.shutdown_deadline_s)
    _log.info("worker started", extra={"topic": settings.topic_updates, "group": settings.worker_group})
    code = 0
    try:
        loop.run()
    except ProducerFenced as exc:
        _log.error("stopping: %s", exc)
        code = 1
    finally:
        loop.request_stop()  # however the loop ended (fenced, a bug): closing has the deadline too
        loop.close()
        if not loop.abandoned:
            server.shutdown()
    if loop.abandoned:
        # a thread is still blocked on Redis or Kafka: don't wait for it (nor for librdkafka's
        # destructors) past the deadline; what it holds is uncommitted and will be redone
        _log.warning("worker stopped at the deadline, abandoning blocked calls")
        logging.shutdown()
        os._exit(code)
    _log.info("worker stopped")
    return code
