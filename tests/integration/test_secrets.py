"""No secret leaves a process: with a distinct password in every secret setting (the Redis
URL's, the SASL login's, the TLS key's), a worker logging in with SASL/SCRAM and an API node
with a TLS client certificate run at DEBUG, with librdkafka's own security and config debug
on, serve their probes, metrics and error answers, and processes started with a wrong password
or a bad setting fail; none of the passwords shows anywhere: logs, /readyz, /metrics, error
answers, failure output."""

from __future__ import annotations

import http.client
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import orjson
import pytest
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at runtime
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from common.settings import Settings, load_settings
from rankstream.stack import free_port
from rankstream.topics import ensure_topics
from tests.conftest import Servers, own_settings
from tests.helpers import api_env, stop_workers, wait_for, worker_env
from tests.integration.test_kafka_acl import Secured, grant, secure_broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a broker of its own

__all__ = ["secure_broker"]  # the fixture, shared with tests/integration/test_kafka_acl.py

REDIS_PASSWORD = f"redis-{uuid.uuid4().hex}-p@ss/word"  # characters a URL must quote


READ_TOKEN, ADMIN_TOKEN = f"read-{uuid.uuid4().hex}", f"admin-{uuid.uuid4().hex}"


def _get(url: str, token: str = READ_TOKEN) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


@pytest.fixture
def redis_user(servers: Servers) -> Iterator[str]:
    """The session Redis' URL as a user whose password is REDIS_PASSWORD (quoted in the URL)."""
    parts = urlsplit(servers.redis_url)
    admin = redis.Redis.from_url(servers.redis_url)
    user = f"secret-{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{REDIS_PASSWORD}", "~*", "&*", "+@all")  # type: ignore[no-untyped-call]
    try:
        netloc = f"{user}:{quote(REDIS_PASSWORD, safe='')}@{parts.hostname}:{parts.port}"
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        admin.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
        admin.close()


def _allow_all(secured: Secured, settings: Settings, *principals: str) -> None:
    """These principals may do anything with the test's topics, group and transactions."""
    acls = [
        AclBinding(
            kind,
            name,
            ResourcePatternType.PREFIXED,
            f"User:{p}",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        )
        for p in principals
        for kind, name in (
            (ResourceType.TOPIC, settings.topic_updates.split(".")[0]),
            (ResourceType.GROUP, settings.worker_group),
            (ResourceType.TRANSACTIONAL_ID, settings.worker_group),
        )
    ]
    grant(secured.broker, acls)


def _start(env: dict[str, str], command: str, out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "rankstream.cli", command], env=env, stdout=sink, stderr=subprocess.STDOUT
        )


def _run(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", *argv],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout + done.stderr


def test_no_password_shows_in_logs_probes_metrics_errors_or_failures(
    secure_broker: Secured, servers: Servers, redis_user: str, tmp_path: Path
) -> None:
    secured = secure_broker
    base = {**own_settings(servers), "redis_url": redis_user}
    secured.via = "sasl"
    worker_login = secured.login("rankstream-worker")
    secured.via = "tls"
    api_login = secured.login("rankstream-api")
    settings = load_settings(
        worker_login, **{**base, "kafka_bootstrap": worker_login["RANKSTREAM_KAFKA_BOOTSTRAP"]}
    )
    secrets = {
        "redis": REDIS_PASSWORD,
        "sasl": worker_login["RANKSTREAM_KAFKA_SASL_PASSWORD"],
        "ssl key": api_login["RANKSTREAM_KAFKA_SSL_KEY_PASSWORD"],
        "read token": READ_TOKEN,
        "admin token": ADMIN_TOKEN,
    }
    _allow_all(secured, settings, "rankstream-worker", "rankstream-api")
    ensure_topics(load_settings({}, **{**base, "kafka_bootstrap": secured.broker.bootstrap}))  # super user
    debug = {"RANKSTREAM_LOG_LEVEL": "DEBUG", "RANKSTREAM_KAFKA_DEBUG": "security,conf,broker"}

    worker_port, api_port, admin_port = free_port(), free_port(), free_port()
    worker_env_ = {**worker_env(settings, http_port=worker_port), **worker_login, **debug}
    tokens = {"RANKSTREAM_API_READ_TOKENS": READ_TOKEN, "RANKSTREAM_API_ADMIN_TOKENS": ADMIN_TOKEN}
    api_env_ = {**api_env(settings, api_port, admin_port), **api_login, **debug, **tokens}
    seen: list[str] = []
    worker = _start(worker_env_, "worker", tmp_path / "worker.out")
    api = _start(api_env_, "api", tmp_path / "api.out")
    try:
        producer = Producer({"bootstrap.servers": secured.broker.bootstrap})
        for i in range(5):
            event = {"id": f"e{i}", "board": "coins:global", "member": f"u{i}", "score": i + 1}
            producer.produce(settings.topic_updates, orjson.dumps(event), key=b"coins:global")
        producer.produce(settings.topic_updates, b"{not json", key=b"coins:global")  # a dead letter
        assert producer.flush(30) == 0
        top = f"http://127.0.0.1:{api_port}/v1/boards/coins:global/top"
        wait_for(lambda: '"u4"' in _get(top)[1], 90, "the API answering the worker's writes")
        for url, expected in (
            (f"http://127.0.0.1:{worker_port}/readyz", 200),
            (f"http://127.0.0.1:{worker_port}/metrics", 200),
            (f"http://127.0.0.1:{api_port}/readyz", 200),
            (f"http://127.0.0.1:{admin_port}/readyz", 200),
            (f"http://127.0.0.1:{admin_port}/metrics", 200),
            (f"http://127.0.0.1:{api_port}/v1/boards/coins:global/top?limit=-3", 400),
            (f"http://127.0.0.1:{api_port}/v1/nothing", 404),
            (f"{top}?nocache=1", 403),  # a read token asking what only an admin token may
        ):
            status, body = _get(url)
            assert status == expected, (url, status, body)
            seen.append(f"{url} {status} {body}")
        # a browser opening the page with the token in its address: moved to an HttpOnly cookie
        # at once (a redirect without it), and never in a log line (the logs are read below)
        page = http.client.HTTPConnection("127.0.0.1", api_port, timeout=5)
        page.request("GET", f"/boards/coins:global?token={READ_TOKEN}")
        answer = page.getresponse()
        assert answer.status == 303
        assert answer.getheader("Location") == "/boards/coins:global"
        assert "HttpOnly" in answer.getheader("Set-Cookie", "")
        seen.append(f"{answer.getheader('Location')} {answer.read().decode()}")
        page.close()
        wrong = f"{READ_TOKEN[:-4]}xxxx"  # almost a token: the answer must not say which
        status, body = _get(top, wrong)
        assert status == 401, body
        seen.append(body)
    finally:
        stop_workers(worker, api)
    seen += [(tmp_path / "worker.out").read_text(), (tmp_path / "api.out").read_text()]
    assert any('"level":"debug"' in text for text in seen), "the processes logged at DEBUG"

    # failures, each with every secret set: a wrong Redis password, a wrong SASL password, a bad
    # setting
    every = {**worker_env_, **api_login}
    wrong_redis = settings.redis_url.get_secret_value().replace(quote(REDIS_PASSWORD, safe=""), "wrong")
    failed = _run({**every, "RANKSTREAM_REDIS_URL": wrong_redis}, "periods", "coins:global")
    assert "invalid username-password pair" in failed, failed
    failed = _run(
        {**worker_env_, "RANKSTREAM_KAFKA_SASL_PASSWORD": "wrong", "RANKSTREAM_LOG_LEVEL": "ERROR"}, "topics"
    )
    assert "refused the login" in failed and "SASL authentication error" in failed, failed
    seen.append(failed)
    failed = _run({**every, "RANKSTREAM_API_PORT": "not-a-port"}, "api")
    assert "RANKSTREAM_API_PORT" in failed, failed
    seen.append(failed)

    everything = "\n".join(seen)
    # librdkafka dumped the clients' config where the passwords would be: it names them only
    assert "sasl.password = [redacted]" in everything and "ssl.key.password = [redacted]" in everything
    for what, secret in secrets.items():
        for form in {secret, quote(secret, safe="")}:
            assert form not in everything, f"the {what} password shows"
