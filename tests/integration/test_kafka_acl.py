"""The Kafka ACLs docs/operations/requirements.md documents are enough: on a broker with Kafka's
authorizer on and nothing allowed but those ACLs (set from the page's own commands), each
process logs in as its documented principal and does its whole job: `rankstream topics`, an
idempotent producer, the worker (with its dead letters and hot board), the API's replay,
`rankstream erase` with its wait for the outcome, `dlq replay` (its ledger and transactions),
`recover` and `accept-redis`. And a principal without its ACLs is refused, so the broker does
enforce them."""

from __future__ import annotations

import io
import logging
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from common.boards import load_boards
from common.clients import kafka_producer
from common.clock import system_ms
from common.errors import InfrastructureError
from common.settings import Settings, load_settings
from common.store.keys import BoardKeys
from common.store.topology import connect
from rankstream.admin import erase
from rankstream.dlq.replay import Options, replay
from rankstream.periods import republish
from rankstream.recover import accept_redis, recover
from rankstream.stack import LocalKafka, SaslListener, TlsFiles, free_port
from rankstream.topics import ensure_topics
from tests.conftest import Servers, own_settings, remove_keys
from tests.helpers import api_call, read_all, read_results, running_worker, wait_for, worker_env
from tests.integration.test_producers import EXAMPLE_PROGRAMS
from tests.tls import authority, issue
from worker.main import cache_publisher

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a broker of its own

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations" / "requirements.md"
PRINCIPALS = ("rankstream-worker", "rankstream-api", "game-server", "rankstream-admin")
RESOURCE = {
    "--topic": ResourceType.TOPIC,
    "--group": ResourceType.GROUP,
    "--transactional-id": ResourceType.TRANSACTIONAL_ID,
    "--cluster": ResourceType.BROKER,
}


def documented_acls() -> list[list[str]]:
    """The arguments of each `acl ...` line of the page's shell block."""
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index("```sh\nacl()") :]
    block = block[: block.index("\n```\n")]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("acl --")]


def bindings(args: list[str], names: dict[str, str]) -> list[AclBinding]:
    """One AclBinding per (operation, resource) of one documented line; `names`: the documented
    topic and group names -> this test's."""
    principal, operations, resources = "", [], []
    pattern = ResourcePatternType.LITERAL
    pairs = iter(args)
    for flag in pairs:
        value = next(pairs)
        if flag == "--allow-principal":
            principal = value
        elif flag == "--operation":
            operations.append(AclOperation[re.sub(r"(?<=[a-z])(?=[A-Z])", "_", value).upper()])
        elif flag == "--resource-pattern-type":
            pattern = ResourcePatternType[value.upper()]
        else:
            resources.append((RESOURCE[flag], names.get(value, value)))
    assert principal and operations and resources, args
    return [
        AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
        for kind, name in resources
        for op in operations
    ]


def grant(broker: LocalKafka, acls: list[AclBinding]) -> None:
    """Create `acls` (as the super user) and wait until the broker's authorizer holds each: the
    controller acknowledges a creation before the broker applies it, and a client refused
    meanwhile meets a non-retriable authorization error."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_acls(acls, request_timeout=30).values():
        future.result(timeout=30)

    def held(binding: AclBinding) -> bool:
        found = admin.describe_acls(
            AclBindingFilter(binding.restype, binding.name, binding.resource_pattern_type, binding.principal,
                             binding.host, binding.operation, binding.permission_type),
            request_timeout=10,
        ).result(timeout=10)  # fmt: skip
        return bool(found)

    wait_for(lambda: all(held(b) for b in acls), 30, "the ACLs in force on the broker")


def test_the_page_documents_each_principal():
    lines = documented_acls()
    assert {args[args.index("--allow-principal") + 1] for args in lines} == {f"User:{p}" for p in PRINCIPALS}


class Secured:
    """A broker of its own: its SASL/SCRAM listener admits the page's principals, and so does
    its TLS listener, each principal showing a certificate with its name (its key encrypted
    with a password of its own); each with nothing allowed until the test sets the ACLs (the
    PLAINTEXT listener is the super user). `via`: which listener the logins use."""

    def __init__(self, broker: LocalKafka, users: dict[str, str], certs: dict[str, TlsFiles]) -> None:
        self.broker, self.users, self.certs = broker, users, certs
        self.key_passwords = {name: f"key-{password}" for name, password in users.items()}
        self.via = "sasl"

    def login(self, user: str) -> dict[str, str]:
        """The environment that has every Kafka client log in as `user`, on `via`'s listener."""
        sasl = self.broker.sasl
        assert sasl is not None
        if self.via == "sasl":
            return {
                "RANKSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{sasl.port}",
                "RANKSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "RANKSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "RANKSTREAM_KAFKA_SASL_USERNAME": user,
                "RANKSTREAM_KAFKA_SASL_PASSWORD": self.users[user],
            }
        cert = self.certs[user]
        return {
            "RANKSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{sasl.tls_port}",
            "RANKSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
            "RANKSTREAM_KAFKA_SSL_CA_LOCATION": str(cert.ca),
            "RANKSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION": str(cert.cert),
            "RANKSTREAM_KAFKA_SSL_KEY_LOCATION": str(cert.key),
            "RANKSTREAM_KAFKA_SSL_KEY_PASSWORD": self.key_passwords[user],
        }


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    users = {name: uuid.uuid4().hex for name in PRINCIPALS}
    users["stranger"] = uuid.uuid4().hex  # no ACL at all
    users["describer"] = uuid.uuid4().hex  # may describe the topics, nothing more
    folder = tmp_path_factory.mktemp("kafka-acl")
    ca = authority(folder / "tls", "ca")
    server = issue(ca, folder / "tls", "kafka")
    certs = {
        name: issue(ca, folder / "tls", name, password=f"key-{password}".encode())
        for name, password in users.items()
    }
    broker = LocalKafka(
        "kafka",
        folder,
        port=free_port(),
        controller_port=free_port(),
        sasl=SaslListener(free_port(), users, tls=server, tls_port=free_port(), sasl_tls_port=free_port()),
    )
    try:
        broker.start()
        yield Secured(broker, users, certs)
    finally:
        broker.stop()


@pytest.fixture(params=["sasl", "tls"])
def secured(secure_broker: Secured, request: pytest.FixtureRequest) -> Secured:
    """The broker, its logins on the SASL/SCRAM listener, then on the TLS one."""
    secure_broker.via = request.param
    return secure_broker


def _as(base: dict[str, Any], secured: Secured, user: str) -> Settings:
    login = secured.login(user)  # the base's own bootstrap would override the login's
    return load_settings(login, **{**base, "kafka_bootstrap": login["RANKSTREAM_KAFKA_BOOTSTRAP"]})


def hour_results(settings: Settings) -> list[dict[str, Any]]:
    """The period results sent so far of an hour window."""
    sent = [orjson.loads(record.value or b"") for record in read_results(settings)]
    return [result for result in sent if result["window"] == "hour"]


def test_each_process_does_its_job_with_the_documented_acls_alone(
    secured: Secured, servers: Servers, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    broker = secured.broker
    base = own_settings(servers)
    as_admin = _as(base, secured, "rankstream-admin")
    names = {
        "update_rank": as_admin.topic_updates,
        "update_rank.dlq": as_admin.topic_dlq,
        "update_cache": as_admin.topic_cache,
        "rank_period_closed": as_admin.topic_results,
        "update_rank.dlq.replayed": as_admin.topic_dlq_replayed,
        "rankstream-worker": as_admin.worker_group,
        "rankstream-worker-": f"{as_admin.worker_group}-",
    }
    grant(broker, [b for args in documented_acls() for b in bindings(args, names)])

    # a principal without ACLs is refused: the broker enforces them
    stranger = _as(base, secured, "stranger")
    with pytest.raises(InfrastructureError, match="Authorization failed"):
        ensure_topics(stranger)

    caplog.set_level(logging.WARNING)
    ensure_topics(as_admin)  # `rankstream topics`, strict
    producer = Producer(
        {
            **_as(base, secured, "game-server").librdkafka(),
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    model: dict[str, int] = {}
    for i in range(30):
        member = f"u{i % 6}"
        model[member] = model.get(member, 0) + i
        event = {"id": f"e{i}", "board": "gift:room42", "member": member, "score": i}
        producer.produce(as_admin.topic_updates, orjson.dumps(event), key=b"gift:room42")
    coins = {"id": "c1", "board": "coins:global", "member": "u1", "score": 5}  # declares hour results
    producer.produce(as_admin.topic_updates, orjson.dumps(coins), key=b"coins:global")
    producer.produce(as_admin.topic_updates, b"{not json", key=b"gift:room42")
    typo = {"id": "t1", "board": "gift:room42", "member": "u9", "scor": 4}  # dead-lettered, replayed fixed
    producer.produce(as_admin.topic_updates, orjson.dumps(typo), key=b"gift:room42")
    assert producer.flush(30) == 0

    as_worker = _as(base, secured, "rankstream-worker")
    as_api = _as(base, secured, "rankstream-api")
    client = connect(as_worker.redis_url.get_secret_value(), as_worker.redis_cluster)
    ahead = [0]  # the worker's clock, moved past the hour's end below
    with running_worker(as_worker, clock=lambda: system_ms() + ahead[0]):
        seq = f"{as_worker.key_prefix}{{gift:room42}}:seq"
        wait_for(lambda: int(client.get(seq) or 0) >= 30, what="30 applied events")
        status, body = api_call(as_api, "GET", "/v1/boards/gift:room42/top?limit=100")
        assert status == 200 and body["source"] == "memory", body  # replayed from update_cache
        assert {item["member"]: item["score"] for item in body["items"]} == model
        assert "erased 'u1'" in erase(as_admin, "gift:room42", "u1", wait_s=60)
        # coins:global's hour closes: its result goes out in the emitter's own transactions
        ahead[0] = 2 * 3_600_000
        results = super_settings(as_admin, broker)
        wait_for(lambda: len(hour_results(results)) >= 1, what="coins:global's hour result")
    # (two hours on, its day may close too, when a midnight of the board's zone falls in them)
    (sent,) = hour_results(results)
    assert sent["board"] == "coins:global"
    assert "republished" in republish(as_admin, "coins:global", sent["period"], "hour")
    # `rankstream backfill`, as after its board's flag was dropped: the whole board again
    client.delete(BoardKeys(as_admin.key_prefix, "gift:room42").hot_ready)
    boards = load_boards(as_admin.boards)
    producer = kafka_producer(as_admin, {"enable.idempotence": True, "acks": "all"})
    backfilled = cache_publisher(as_admin, boards, producer, client).published
    assert backfilled >= 3 + 1  # a chunk of each of its 3 hot windows (u1 erased), and a marker
    dead = read_all(_reader(broker, as_admin.topic_dlq), 2)
    assert [m.value() for m in dead] == [b"{not json", orjson.dumps(typo)]
    # `rankstream dlq replay`: the ledger read, the event and its ledger record in a transaction
    fix = tmp_path / "fix.py"
    fix.write_text("def fix(event):\n    event['score'] = event.pop('scor')\n    return event\n")
    out = io.StringIO()
    assert replay(as_admin, Options(reason="unknown_field", fix_path=fix), out=out) == 0
    assert out.getvalue().splitlines()[-1] == "replayed 1, already replayed 0, skipped 0, refused 0"

    assert recover(as_admin)
    assert accept_redis(as_admin)
    remove_keys(client, as_admin.key_prefix)
    client.close()
    # nothing refused on the way, not even what a process carries on without (the dead-letter
    # topic's size limit, read with DescribeConfigs)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    refused = [m for m in warned if re.search(r"authoriz|denied|limit unknown", m, re.IGNORECASE)]
    assert refused == [], "\n".join(refused)


def super_settings(settings: Settings, broker: LocalKafka) -> Settings:
    """`settings` on the broker's PLAINTEXT listener: the super user, for the test's own reads."""
    return settings.model_copy(update={"kafka_bootstrap": broker.bootstrap})


def _reader(broker: LocalKafka, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"r{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    return consumer


@pytest.mark.parametrize(
    ("user", "command"),
    [
        ("stranger", ["topics"]),
        ("stranger", ["erase", "gift:room42", "u1", "--no-wait"]),
        ("stranger", ["reset", "gift:room42", "--no-wait"]),
        ("stranger", ["recover"]),
        ("stranger", ["accept-redis"]),
        ("stranger", ["dlq", "stats"]),
        ("stranger", ["dlq", "replay"]),
        # may see the topic but not write it: its idempotent producer is refused a producer id, a
        # fatal error that confluent-kafka raises from inside the next callback
        ("describer", ["erase", "gift:room42", "u1", "--no-wait"]),
    ],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_a_command_without_its_acls_says_so_in_one_line(
    secure_broker: Secured, servers: Servers, user: str, command: list[str]
) -> None:
    secure_broker.via = "sasl"
    broker = secure_broker.broker
    settings = load_settings({}, **own_settings(servers))
    if user == "describer":
        ensure_topics(super_settings(settings, broker))
        see = AclBinding(
            ResourceType.TOPIC,
            settings.topic_updates,
            ResourcePatternType.LITERAL,
            "User:describer",
            "*",
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        )
        grant(broker, [see])
    env = {
        **worker_env(settings),
        **secure_broker.login(user),
        "RANKSTREAM_LOG_LEVEL": "ERROR",
        "RANKSTREAM_TOPIC_REPLICATION": "1",  # the broker is alone
        "RANKSTREAM_TOPIC_MIN_INSYNC_REPLICAS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert secure_broker.users[user] not in done.stdout + done.stderr  # the secret stays out
    # one line says it, "rankstream: ..." or the JSON log line of an error; before it at most
    # librdkafka's own JSON log line of the same refusal
    *before, line = done.stderr.splitlines()
    assert len(before) <= 1 and all(b.startswith('{"') for b in before), done.stderr
    assert re.search(r"authoriz", line, re.IGNORECASE), line


@pytest.mark.parametrize("language", list(EXAMPLE_PROGRAMS))
def test_the_example_producers_log_in_with_scram_over_tls(
    secure_broker: Secured, servers: Servers, language: str
) -> None:
    """Each producer example (examples/) sends its events as `game-server`, with that principal's
    documented ACLs alone, over SASL/SCRAM on TLS (TLS_CA, SASL_MECHANISM, SASL_USERNAME,
    SASL_PASSWORD)."""
    broker = secure_broker.broker
    assert broker.sasl is not None
    argv = EXAMPLE_PROGRAMS[language]()  # built first: a missing toolchain fails here, in one line
    settings = load_settings({}, **own_settings(servers))
    ensure_topics(super_settings(settings, broker))
    names = {"update_rank": settings.topic_updates}
    acls = [b for args in documented_acls() if "User:game-server" in args for b in bindings(args, names)]
    grant(broker, acls)
    env = {
        **os.environ,
        "BOOTSTRAP": f"127.0.0.1:{broker.sasl.sasl_tls_port}",
        "TOPIC": settings.topic_updates,
        "TLS_CA": str(secure_broker.certs["game-server"].ca),
        "SASL_MECHANISM": "SCRAM-SHA-512",
        "SASL_USERNAME": "game-server",
        "SASL_PASSWORD": secure_broker.users["game-server"],
    }
    done = subprocess.run([*argv, "room9"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([line for line in done.stdout.splitlines() if line.startswith("sent ")]) == 2, done.stdout
    sent = read_all(_reader(broker, settings.topic_updates), 2)
    assert [m.key() for m in sent] == [b"gift:room9", b"gift:room9"]
