"""Real Kafka and Redis for the whole session, and per-test isolation.

Where the servers come from, in order: RANKSTREAM_TEST_KAFKA / RANKSTREAM_TEST_REDIS (running
ones), testcontainers when a Docker engine answers, otherwise the local stack (Kafka from Maven
jars, redis-server) in .stack/test/<runner>/. Never a silent skip: if none works the session fails.

Parallel runs (pytest-xdist, `make test`): each runner process (gw0, gw1, ...; "main" without
xdist) has its own servers, folder and cluster; a test's isolation (its own topics, group and key
prefix) is the same either way. The controller picks the session's calendar boundary once
(tests/boundaries.py) and hands it to the runners through the environment.

Topology: a test runs on one Redis server unless it is parametrized over `topology`
(tests/helpers.py BOTH_TOPOLOGIES); its "cluster" case runs on a Redis Cluster of 3 masters with
a replica each, RANKSTREAM_TEST_REDIS_CLUSTER (any node's URL of a running one) or started from
the local redis-server binary in .stack/test/<runner>/cluster/ the first time a test asks for it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from hypothesis import settings as hypothesis_settings

from common.settings import Settings, load_settings
from common.store.topology import Store, connect
from rankstream.cluster import LocalRedisCluster
from rankstream.devstack import SINGLE_BROKER
from rankstream.stack import LocalKafka, LocalRedis, docker_engine_available, free_port
from rankstream.topics import ensure_topics
from tests.boundaries import ENV as BOUNDARY_ENV
from tests.boundaries import session_boundary

ROOT = Path(__file__).resolve().parent.parent
# A test proves behaviour, not speed: no per-example deadline (hypothesis' default, 200 ms, fails
# examples on a loaded 2-core box; timing belongs in `make bench`)
hypothesis_settings.register_profile("rankstream", deadline=None)
hypothesis_settings.load_profile("rankstream")
KAFKA_IMAGE = "apache/kafka:4.1.1"
REDIS_IMAGE = "redis:7.4"


@dataclass(frozen=True)
class Servers:
    kafka_bootstrap: str
    redis_url: str
    origin: str  # env | testcontainers | local


def _testcontainers(stack: ExitStack) -> Servers:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.redis import RedisContainer

    kafka = stack.enter_context(KafkaContainer(KAFKA_IMAGE).with_kraft())
    redis_c = stack.enter_context(RedisContainer(REDIS_IMAGE))
    redis_url = f"redis://{redis_c.get_container_host_ip()}:{redis_c.get_exposed_port(6379)}/0"
    return Servers(kafka.get_bootstrap_server(), redis_url, "testcontainers")


def _folder() -> Path:
    """This runner's local servers' folder (one per xdist worker; they run side by side)."""
    return ROOT / ".stack" / "test" / os.environ.get("PYTEST_XDIST_WORKER", "main")


def _local(stack: ExitStack) -> Servers:
    folder = _folder()
    shutil.rmtree(folder, ignore_errors=True)
    redis_server = LocalRedis("redis", folder / "redis", port=free_port())
    redis_server.start()
    stack.callback(redis_server.stop)
    kafka = LocalKafka("kafka", folder / "kafka", port=free_port(), controller_port=free_port())
    stack.callback(kafka.stop)
    kafka.start()
    return Servers(kafka.bootstrap, redis_server.url, "local")


def pytest_configure(config: pytest.Config) -> None:
    """One calendar boundary for the whole run: xdist's runners start later and inherit it."""
    os.environ.setdefault(BOUNDARY_ENV, str(session_boundary().at_ms))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (their order kept), then the rest: parallel runners start the long ones
    together and fill the gaps with short ones, so they finish together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header() -> str:
    """The session's calendar choice, and how to replay it (tests/boundaries.py)."""
    return session_boundary().describe()


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    env_kafka = os.environ.get("RANKSTREAM_TEST_KAFKA")
    env_redis = os.environ.get("RANKSTREAM_TEST_REDIS")
    with ExitStack() as stack:
        if env_kafka and env_redis:
            found = Servers(env_kafka, env_redis, "env")
        else:
            started = _testcontainers(stack) if docker_engine_available() else _local(stack)
            found = Servers(
                env_kafka or started.kafka_bootstrap, env_redis or started.redis_url, started.origin
            )
        yield found


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """A Redis Cluster shared by the session's cluster cases (started on first use)."""
    env = os.environ.get("RANKSTREAM_TEST_REDIS_CLUSTER")
    if env:
        yield env
        return
    cluster = LocalRedisCluster(_folder() / "cluster")
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """`single` unless the test is parametrized over it (tests/helpers.py BOTH_TOPOLOGIES)."""
    return str(getattr(request, "param", "single"))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def own_settings(servers: Servers, cluster_url: str | None = None) -> dict[str, Any]:
    """Settings (as keyword arguments) with their own topics, group and Redis key prefix, on
    the cluster at `cluster_url` if given, else on the session's Redis server."""
    tag = uuid.uuid4().hex[:10]
    return {
        "kafka_bootstrap": servers.kafka_bootstrap,
        "redis_url": cluster_url or servers.redis_url,
        "redis_cluster": cluster_url is not None,
        "boards": ROOT / "deploy" / "boards.yaml",
        "topic_updates": f"t{tag}.update_rank",
        "topic_dlq": f"t{tag}.update_rank.dlq",
        "topic_cache": f"t{tag}.update_cache",
        "topic_results": f"t{tag}.rank_period_closed",
        "topic_dlq_replayed": f"t{tag}.update_rank.dlq.replayed",
        "worker_group": f"g{tag}",
        "key_prefix": f"t{tag}:",
        "worker_http_port": 0,
        **SINGLE_BROKER,  # the session's Kafka has one broker
    }


@pytest.fixture
def make_settings(servers: Servers, topology: str, request: pytest.FixtureRequest) -> Callable[..., Settings]:
    """Settings of one test: its own topics, group and Redis key prefix, on its topology."""
    base = own_settings(servers, request.getfixturevalue("cluster_url") if topology == "cluster" else None)

    def build(**overrides: Any) -> Settings:
        return load_settings({}, **{**base, **overrides})

    return build


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@contextmanager
def own_topics(settings: Settings) -> Iterator[Settings]:
    """The topics of `settings` exist inside, and are deleted after."""
    ensure_topics(settings)
    yield settings
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    names = [settings.topic_updates, settings.topic_dlq, settings.topic_cache, settings.topic_results,
             settings.topic_dlq_replayed]  # fmt: skip
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result(timeout=30)


@pytest.fixture
def topics(settings: Settings) -> Iterator[Settings]:
    """The test's topics exist for its duration, then are deleted."""
    with own_topics(settings):
        yield settings


@pytest.fixture
def rclient(settings: Settings) -> Iterator[Store]:
    """A Redis client of the test's topology; the test's keys (its prefix) are removed afterwards."""
    client = connect(settings.redis_url.get_secret_value(), settings.redis_cluster)
    yield client
    remove_keys(client, settings.key_prefix)
    client.close()


def remove_keys(client: Store, prefix: str) -> None:
    """Every key under `prefix`, unlinked."""
    keys = list(client.scan_iter(match=f"{prefix}*", count=5000))
    for start in range(0, len(keys), 5000):
        pipe = client.pipeline(transaction=False)  # a key a command: a cluster's go to their slots
        for key in keys[start : start + 5000]:
            pipe.unlink(key)
        pipe.execute()


@pytest.fixture
def producer(settings: Settings) -> Iterator[Producer]:
    prod = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
    yield prod
    prod.flush(10)


@pytest.fixture
def consumer_factory(settings: Settings) -> Iterator[Callable[..., Consumer]]:
    opened: list[Consumer] = []

    def make(topic: str, **conf: Any) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": unique("reader"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **conf,
            }
        )
        consumer.subscribe([topic])
        opened.append(consumer)
        return consumer

    yield make
    for consumer in opened:
        consumer.close()
