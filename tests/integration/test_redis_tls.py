"""Redis over TLS, against redis-server itself with certificates made for the module
(tests/tls.py): a server, and a Cluster whose nodes also talk TLS among themselves, both
speaking TLS only and wanting a client certificate. The worker, the API (its reads and its
change feed) and the `rankstream` commands reach them through RANKSTREAM_REDIS_TLS_*; each bad
setting or certificate ends in one line that says what is wrong."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from api.app import CHANGES_NAME, READS_NAME, create_app
from common.boards import load_boards
from common.clients import redis_client
from common.settings import Settings, load_settings
from rankstream.cluster import LocalRedisCluster
from rankstream.stack import LocalRedis, TlsFiles, free_port
from tests.conftest import Servers, own_settings, own_topics
from tests.helpers import named_connections, running_worker, wait_for, worker_env
from tests.tls import Authority, authority, issue

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # servers of its own


class Certificates:
    """An authority and what it signed; another authority that signed nothing the servers show."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca: Authority = authority(folder, "ca")
        self.other: Authority = authority(folder, "other-ca")
        self.server: TlsFiles = issue(self.ca, folder, "redis")
        self.client: TlsFiles = issue(self.ca, folder, "client")
        self.expired: TlsFiles = issue(self.ca, folder, "expired", expired=True)

    def settings(self, ca: Path | None = None, client: TlsFiles | None = None) -> dict[str, Any]:
        client = client or self.client
        return {
            "redis_tls_ca_file": ca or self.ca.file,
            "redis_tls_cert_file": client.cert,
            "redis_tls_key_file": client.key,
        }


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(certs: Certificates) -> Iterator[LocalRedis]:
    server = LocalRedis("redis", certs.folder / "single", port=free_port(), tls=certs.server)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls_cluster(certs: Certificates) -> Iterator[LocalRedisCluster]:
    cluster = LocalRedisCluster(certs.folder / "cluster", masters=3, replicas=0, tls=certs.server)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _produce(settings: Settings) -> dict[str, dict[str, int]]:
    """A few events on a hot board (gift), a capped one (coins) and a limited-time one (live);
    what each board's total should then hold."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    model: dict[str, dict[str, int]] = {}
    for i in range(30):
        board = ("gift:room42", "coins:global", "live:tls")[i % 3]
        member = f"u{i % 4}"
        model.setdefault(board, {})[member] = model.get(board, {}).get(member, 0) + i
        event = {"id": f"e{i}", "board": board, "member": member, "score": i}
        producer.produce(settings.topic_updates, orjson.dumps(event), key=board.encode())
    assert producer.flush(30) == 0
    return model


async def _read_through_the_api(settings: Settings, model: dict[str, dict[str, int]]) -> None:
    """Every board's total as the API answers it (memory for the hot board, Redis for the others,
    twice: the second from what the change feed lets it keep), while its change feed listens."""
    client = redis_client(settings)
    app = create_app(settings, load_boards(settings.boards))
    async with TestClient(TestServer(app)) as http:
        wait = asyncio.get_running_loop().time() + 60
        while (await http.get("/readyz")).status != 200:
            assert asyncio.get_running_loop().time() < wait, "the API never became ready"
            await asyncio.sleep(0.05)
        for board, scores in model.items():
            for _ in range(2):
                resp = await http.get(f"/v1/boards/{board}/top?limit=100")
                body = await resp.json()
                assert resp.status == 200, body
                assert {i["member"]: i["score"] for i in body["items"]} == scores, board
        # the API's own connections, over TLS: its reads and its change feed
        for name in (READS_NAME, CHANGES_NAME):
            assert await asyncio.to_thread(named_connections, client, name), f"no {name} connection"
    client.close()


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_the_worker_the_api_and_the_commands_talk_tls(
    topology: str, certs: Certificates, servers: Servers, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("tls_redis" if topology == "single" else "tls_cluster")
    base = {**own_settings(servers), "redis_url": server.url, "redis_cluster": topology == "cluster"}
    settings = load_settings({}, **base, **certs.settings())
    with own_topics(settings):
        model = _produce(settings)
        client = redis_client(settings)
        seqs = [f"{settings.key_prefix}{{{b}}}:seq" for b in model]
        with running_worker(settings):
            wait_for(lambda: sum(int(client.get(s) or 0) for s in seqs) >= 30, what="30 applied events")
            asyncio.run(_read_through_the_api(settings, model))
        client.close()
        done = _command(settings, certs.settings(), "periods", "coins:global")
        assert done.returncode == 0, done.stderr


def _command(
    settings: Settings, tls: dict[str, Any], *argv: str, url: str = ""
) -> subprocess.CompletedProcess[str]:
    """`rankstream <argv>` with `settings`' environment, these TLS settings and `url` if given."""
    env = worker_env(settings)
    env.update({f"RANKSTREAM_{k.upper()}": str(v) for k, v in tls.items()})
    if url:
        env["RANKSTREAM_REDIS_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "rankstream.cli", *argv],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _bad(certs: Certificates, case: str, url: str) -> tuple[str, dict[str, Any]]:
    """(the Redis URL, the TLS settings) of one bad case."""
    good = certs.settings()
    plain = url.replace("rediss://", "redis://")
    return {
        "other_ca": (url, certs.settings(ca=certs.other.file)),
        "no_client_certificate": (url, {"redis_tls_ca_file": certs.ca.file}),
        "missing_ca_file": (url, certs.settings(ca=certs.folder / "nope.pem")),
        "key_not_matching": (url, {**good, "redis_tls_key_file": certs.server.key}),
        "plain_url": (plain, {}),
        "tls_files_with_a_plain_url": (plain, good),
        "url_options": (url + "?ssl_ca_certs=/etc/ca.pem", good),
    }[case]


CASES = {
    "other_ca": "certificate verify failed",
    # TLS 1.3: the server's alert, or the socket it closed, whichever the client meets first
    "no_client_certificate": r"certificate required|EOF occurred in violation of protocol",
    "missing_ca_file": "RANKSTREAM_REDIS_TLS_CA_FILE: cannot load",
    "key_not_matching": "RANKSTREAM_REDIS_TLS_CERT_FILE/KEY_FILE: cannot load .*KEY_VALUES_MISMATCH",
    "plain_url": r"Connection reset by peer|Connection closed by server",
    "tls_files_with_a_plain_url": "use rediss://",
    "url_options": r"options after '\?' are not read",
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_tls_setting_is_one_line(
    case: str, certs: Certificates, tls_redis: LocalRedis, servers: Servers
) -> None:
    url, tls = _bad(certs, case, tls_redis.url)
    done = _command(load_settings({}, **own_settings(servers)), tls, "periods", "coins:global", url=url)
    _one_line(done, CASES[case])


def _one_line(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(says, lines[0]), done.stderr


def test_an_expired_server_certificate_is_refused(certs: Certificates, servers: Servers) -> None:
    server = LocalRedis("expired", certs.folder / "expired", port=free_port(), tls=certs.server)
    server.start()
    try:  # from now on, new connections meet a certificate whose validity has ended
        admin = server.client()
        admin.execute_command(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            "CONFIG", "SET", "tls-cert-file", str(certs.expired.cert), "tls-key-file", str(certs.expired.key)
        )
        admin.close()
        done = _command(
            load_settings({}, **own_settings(servers)),
            certs.settings(),
            "periods",
            "coins:global",
            url=server.url,
        )
        _one_line(done, "certificate has expired")
    finally:
        server.stop()


def test_the_api_with_a_wrong_authority_answers_503_and_reports_redis_down(
    certs: Certificates, tls_redis: LocalRedis, servers: Servers
) -> None:
    settings = load_settings(
        {}, **{**own_settings(servers), "redis_url": tls_redis.url}, **certs.settings(ca=certs.other.file)
    )

    async def go() -> None:
        async with TestClient(TestServer(create_app(settings, load_boards(settings.boards)))) as http:
            resp = await http.get("/v1/boards/coins:global/top")
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "redis_unavailable"
            ready = await http.get("/readyz")
            assert (await ready.json())["redis"] is False

    asyncio.run(go())
