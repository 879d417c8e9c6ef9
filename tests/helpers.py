"""Helpers for integration tests: a worker loop in a thread, an API app on real Redis, waiting,
reading a topic."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import generate_latest
from redis.cluster import RedisCluster

from api.app import create_app
from api.state import APP_STATE
from chaos.traffic import Record, read_topic
from common.boards import load_boards
from common.clock import Clock, system_ms
from common.settings import Settings
from common.store.shards import shard_names
from common.store.topology import Store, node_client
from rankstream.stack import free_port
from rankstream.topics import UPDATE_PARTITIONS
from tests.oracle import BOARDS, RANGED_BOARDS, SHARDED_BOARDS, SHARDS, Model
from tests.oracle import Message as StreamMessage
from worker.consumer import WorkerLoop
from worker.dlq import HEADER_INDEX, HEADER_PARTITION, HEADER_REASON
from worker.main import build_loop, cache_publisher
from worker.metrics import WorkerMetrics

# an oracle suite's tests run on one Redis server and on a Redis Cluster (tests/conftest.py)
BOTH_TOPOLOGIES = pytest.mark.parametrize("topology", ["single", "cluster"], indirect=True)


@contextmanager
def running_worker(settings: Settings, clock: Clock = system_ms) -> Iterator[WorkerLoop]:
    """The real worker loop (same wiring as `rankstream worker`) in a thread; `clock`: the
    service's clock (a test's simulated one)."""
    loop, client = build_loop(settings, WorkerMetrics(), clock)
    thread = threading.Thread(target=loop.run, name="worker", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.request_stop()
        thread.join(30)
        loop.close()
        client.close()


def hot_markers(app: Any) -> dict[str, int]:
    """Each hot board's newest seq marker an API app applied: every change up to that seq is in
    its memory. (Its `seq`, the newest seq of any record, is no such promise: one batch's records
    of a board go out member by member, the member whose last event came last first of all, and
    the marker after them.) Run it on the app's loop."""
    return {board: hot.marker for board, hot in app[APP_STATE].hot.boards.items()}


def markers_reached(markers: dict[str, int], seqs: dict[str, int]) -> bool:
    """Whether memory holds every change up to each board's seq (a board without events has none
    to wait for: no marker is published for it)."""
    return all(seq == 0 or markers.get(board, -1) >= seq for board, seq in seqs.items())


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_all(consumer: Consumer, count: int, timeout: float = 60.0, exact: bool = True) -> list[Message]:
    """`count` messages (or at least `count` when not `exact`): reads until that many arrived,
    then until the topic stays quiet for 2 s, so extras are seen too."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < count:
        got += [m for m in consumer.consume(500, 0.5) if m.error() is None]
    while batch := [m for m in consumer.consume(500, 2.0) if m.error() is None]:
        got += batch
    assert len(got) == count if exact else len(got) >= count, f"expected {count} messages, got {len(got)}"
    return got


def header_map(msg: Message) -> dict[str, bytes]:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return {k: v for k, v in pairs if isinstance(v, bytes)}


def api_call(settings: Settings, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """One request against the real API app on real Redis: (status, JSON body)."""

    async def go() -> tuple[int, Any]:
        app = create_app(settings, load_boards(settings.boards))
        async with TestClient(TestServer(app)) as http:
            # like Kubernetes: no request before the node is ready (hot boards replayed)
            deadline = time.monotonic() + 60
            while (await http.get("/readyz")).status != 200:
                assert time.monotonic() < deadline, "the API never became ready"
                await asyncio.sleep(0.05)
            resp = await http.request(method, path, **kwargs)
            return resp.status, await resp.json()

    return asyncio.run(go())


def produce(settings: Settings, messages: list[StreamMessage]) -> None:
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20, "enable.idempotence": True}
    )
    for i, msg in enumerate(messages):
        producer.produce(settings.topic_updates, msg.value, key=msg.key)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def mget(client: Store, keys: list[str]) -> list[Any]:
    """MGET on either topology (a cluster's keys of several slots: one MGET per slot)."""
    if isinstance(client, RedisCluster):
        return list(client.mget_nonatomic(keys))
    return list(client.mget(keys))


def named_connections(client: Store, name: str) -> list[tuple[redis.Redis, str]]:
    """(server, client id) of every connection called `name`, on every node of a cluster."""
    found = [(node, c) for node in every_server(client) for c in node.client_list()]
    return [(node, str(c["id"])) for node, c in found if c.get("name") == name]


def every_server(client: Store) -> list[redis.Redis]:
    """A client per server: the one, or every node of a cluster, replicas included."""
    if isinstance(client, redis.Redis):
        return [client]
    nodes = client.get_nodes()  # type: ignore[no-untyped-call]
    return [node_client(client, n) for n in nodes]


def kill_connections(client: Store, name: str) -> int:
    """Redis drops every connection called `name` (a node's reads or change feed)."""
    found = named_connections(client, name)
    for node, client_id in found:
        node.client_kill_filter(_id=client_id)
    return len(found)


ORACLE_ALL = (*BOARDS, *RANGED_BOARDS, *SHARDED_BOARDS)


EVENT_OUTCOMES = ("applied", "duplicate", "redelivered")


def event_counts(metrics: WorkerMetrics) -> dict[str, float]:
    """A worker's events by outcome. It counts a batch after its commit, so a reader racing the
    commit sees the offsets move first: wait on these counts, not on the committed offsets."""
    sample = metrics.registry.get_sample_value
    return {o: sample("rankstream_worker_events_total", {"outcome": o}) or 0.0 for o in EVENT_OUTCOMES}


def applied_so_far(rclient: Store, settings: Settings, boards: Sequence[str] = ORACLE_ALL) -> int:
    """Events applied so far over `boards` (the oracle's): the sum of their seq numbers."""
    pipe = rclient.pipeline(transaction=False)  # one board a slot: no MGET across a cluster
    for board in boards:  # a sharded board's: its shards'
        for name in shard_names(board, SHARDS.get(board.split(":", 1)[0], 1)):
            pipe.get(f"{settings.key_prefix}{{{name}}}:seq")
    return sum(int(v or 0) for v in pipe.execute())


@contextmanager
def _group_reader(settings: Settings, stable: bool = True) -> Iterator[tuple[Consumer, list[TopicPartition]]]:
    """A consumer of the worker group that reads its commits and never joins it, and the updates
    topic's partitions. `stable=False`: committed() does not wait for open transactions' offsets
    (read_uncommitted)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.worker_group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if stable else "read_uncommitted",
        }
    )
    try:
        yield consumer, [TopicPartition(settings.topic_updates, p) for p in range(UPDATE_PARTITIONS)]
    finally:
        consumer.close()


def committed_offsets(settings: Settings, stable: bool = True) -> dict[int, int]:
    """The worker group's committed offset of each partition of the updates topic (< 0: none)."""
    with _group_reader(settings, stable) as (reader, parts):
        return {tp.partition: tp.offset for tp in reader.committed(parts, timeout=10)}


def committed_total(settings: Settings) -> int:
    """Messages of the updates topic the worker group has committed."""
    return sum(max(offset, 0) for offset in committed_offsets(settings).values())


def committed_so_far(settings: Settings) -> int:
    """committed_total, 0 while the group's coordinator is still moving (a condition to wait on)."""
    try:
        return committed_total(settings)
    except KafkaException:
        return 0


def group_offsets(settings: Settings) -> tuple[int, int]:
    """(offsets the worker group committed, offsets produced) over the updates topic's partitions."""
    with _group_reader(settings) as (reader, parts):
        committed = reader.committed(parts, timeout=10)
        done = sum(max(tp.offset, 0) for tp in committed)
        return done, sum(reader.get_watermark_offsets(tp, timeout=10)[1] for tp in committed)


def kafka_lag(settings: Settings) -> int:
    """Messages of the updates topic the worker group has not committed yet."""
    done, produced = group_offsets(settings)
    return produced - done


def wait_applied_and_committed(
    rclient: Store, settings: Settings, target: int, timeout: float = 180, boards: Sequence[str] = ORACLE_ALL
) -> None:
    """Every event applied in Redis (over `boards`), then every message committed by the group:
    only then is the dead-letter topic whole (a batch applied whose commit failed, e.g.
    ILLEGAL_GENERATION in a rebalance, is redone with its dead letters by whoever holds its
    partition next)."""
    wait_for(lambda: applied_so_far(rclient, settings, boards) >= target, timeout, "every event applied")
    wait_for(lambda: kafka_lag(settings) == 0, 60, "every message committed")


def check_dlq(
    consumer_factory: Callable[..., Consumer], settings: Settings, model: Model, exact: bool
) -> None:
    """Every bad event is in the dead-letter topic with its reason and index. After a crash a
    record may appear twice (at-least-once), never zero times."""
    expected = Counter(model.dlq)
    records = read_all(consumer_factory(settings.topic_dlq), len(model.dlq), timeout=60, exact=exact)
    got: Counter[tuple[str, bytes | None, int | None]] = Counter()
    for record in records:
        headers = header_map(record)
        assert headers[HEADER_PARTITION].isdigit()
        index = headers.get(HEADER_INDEX)
        got[(headers[HEADER_REASON].decode(), record.value(), None if index is None else int(index))] += 1
    if exact:
        assert got == expected
    else:
        assert set(got) == set(expected)
        assert all(got[k] >= n for k, n in expected.items())


def backfill(settings: Settings, client: Store) -> None:
    """What a worker does at start: publish every hot board's current state to update_cache."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    publisher = cache_publisher(settings, load_boards(settings.boards), producer, client)
    assert publisher.published >= 0
    producer.flush(10)


def http_status(url: str) -> int:
    """The status of a GET to a local server; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def api_env(settings: Settings, port: int, admin_port: int = 0) -> dict[str, str]:
    """The environment of a `rankstream api` process reading this test's Redis keys and topics;
    its admin port `admin_port`, or a free one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env.update(
        RANKSTREAM_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        RANKSTREAM_REDIS_URL=settings.redis_url.get_secret_value(),
        RANKSTREAM_BOARDS=str(settings.boards),
        RANKSTREAM_KEY_PREFIX=settings.key_prefix,
        RANKSTREAM_TOPIC_CACHE=settings.topic_cache,
        RANKSTREAM_API_PORT=str(port),
        RANKSTREAM_API_ADMIN_PORT=str(admin_port or free_port()),
        RANKSTREAM_API_HOST="127.0.0.1",
    )
    return env


def worker_env(settings: Settings, http_port: int = 0, worker_id: str = "") -> dict[str, str]:
    """The environment of a `rankstream worker` subprocess for `settings` (none of the test
    process' own RANKSTREAM_ variables leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env.update(
        {
            "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "RANKSTREAM_REDIS_URL": settings.redis_url.get_secret_value(),
            "RANKSTREAM_BOARDS": str(settings.boards),
            "RANKSTREAM_TOPIC_UPDATES": settings.topic_updates,
            "RANKSTREAM_TOPIC_DLQ": settings.topic_dlq,
            "RANKSTREAM_TOPIC_CACHE": settings.topic_cache,
            "RANKSTREAM_TOPIC_RESULTS": settings.topic_results,
            "RANKSTREAM_TOPIC_DLQ_REPLAYED": settings.topic_dlq_replayed,
            "RANKSTREAM_WORKER_GROUP": settings.worker_group,
            "RANKSTREAM_KEY_PREFIX": settings.key_prefix,
            "RANKSTREAM_WORKER_HTTP_PORT": str(http_port or free_port()),
            "RANKSTREAM_LOG_LEVEL": "WARNING",
        }
    )
    if settings.redis_cluster:  # only then: a previous release (tests/integration/test_upgrade.py) refuses it
        env["RANKSTREAM_REDIS_CLUSTER"] = "true"
    if worker_id:  # like a pod's name: the same id after a restart fences the dead one's transaction
        env["RANKSTREAM_WORKER_ID"] = worker_id
    return env


def read_results(settings: Settings) -> list[Record]:
    """Every committed record of the results topic (read_committed, to the end of each partition)."""
    return list(read_topic(settings.kafka_bootstrap, settings.topic_results))


def stop_workers(*procs: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the worker subprocesses still running and wait for them (the tests' finally)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def scrape(http: Any) -> str:
    """What the admin port's /metrics answers for the node a TestClient serves (rendered from its
    registry, as the route does; the route itself: tests/integration/test_api_contract.py)."""
    return generate_latest(http.server.app[APP_STATE].metrics.registry).decode()
