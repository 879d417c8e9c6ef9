"""The Redis users docs/operations/requirements.md documents are enough, each for its part: the
worker (hot, rolling, capped and packed boards, dead letters) and its rolling preparer as
`rankstream-worker`; the API (a hot board, a board it makes hot itself, the others from Redis)
as `rankstream-api`, which may write nothing but a board's `:promoted` key; `rankstream erase`,
`reset` and `recover` as `rankstream-admin`; on one Redis and on a Cluster, and Redis refuses
nothing (`ACL LOG`). And each user without one of its rights is refused, and says so."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest
import redis
from confluent_kafka import Producer
from pydantic import SecretStr

from common.boards import load_boards
from common.periods import parse_period
from common.settings import Settings
from common.store.keys import partition_sources
from common.store.topology import Store, connect
from rankstream.admin import erase, reset
from rankstream.recover import recover
from tests.helpers import api_call, every_server, running_worker, wait_for, worker_env
from tests.integration.test_hot_boards import NodeRunner
from worker.rolling import RollingPreparer, claim_lead_ms
from worker.sources import EPOCH

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations" / "requirements.md"
HOUR = 3_600_000
DEFAULT_PREFIX = "rs:"
ROLES = ("rankstream-worker", "rankstream-api", "rankstream-admin")


def documented_rules() -> dict[str, list[str]]:
    """Each user's rules, from the page's `ACL SETUSER <user> ...` lines (after the name)."""
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("ACL SETUSER ")]
    rules = {line.split()[2]: line.split()[3:] for line in lines}
    assert sorted(rules) == sorted(ROLES) and len(lines) == len(ROLES), "one ACL SETUSER line per user"
    return rules


def test_the_documented_rules_name_the_default_prefix_and_a_placeholder_password():
    for user, rules in documented_rules().items():
        assert any(r.endswith(f"~{DEFAULT_PREFIX}*") for r in rules) and f"&{DEFAULT_PREFIX}*" in rules, user
        assert ">CHANGE-ME" in rules and "-@all" in rules and "resetkeys" in rules, user
    api = documented_rules()["rankstream-api"]
    assert f"~{DEFAULT_PREFIX}*" not in api, "the API's user writes only :promoted keys"


def _acl(server: redis.Redis, *args: str) -> Any:
    return server.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


def _as_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


Roles = dict[str, Settings]  # role -> the test's settings, connecting as that role's user


@pytest.fixture
def limited(topics: Settings, rclient: Store) -> Iterator[tuple[Roles, dict[str, str]]]:
    """Per role: the test's settings, connecting as a new user with the role's documented
    rules (a password and the test's key prefix put in); and role -> user name. The users are
    removed afterwards."""
    tag, servers = uuid.uuid4().hex[:8], every_server(rclient)
    roles, users = {}, {}
    for role, documented in documented_rules().items():
        user, password = f"{role}-{tag}", uuid.uuid4().hex
        rules = [
            rule.replace(DEFAULT_PREFIX, topics.key_prefix).replace(">CHANGE-ME", f">{password}")
            for rule in documented
        ]
        for server in servers:
            _acl(server, "SETUSER", user, *rules)
        url = _as_user(topics.redis_url.get_secret_value(), user, password)
        roles[role], users[role] = topics.model_copy(update={"redis_url": SecretStr(url)}), user
    for server in servers:
        _acl(server, "LOG", "RESET")
    try:
        yield roles, users
    finally:
        for server in servers:
            for user in users.values():
                _acl(server, "DELUSER", user)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusals(rclient: Store, users: dict[str, str]) -> list[str]:
    """What Redis refused these users (their ACL LOG, every server): "<user> <reason> <object>"."""
    found = []
    for server in every_server(rclient):
        for entry in _acl(server, "LOG"):
            pairs = zip(entry[::2], entry[1::2], strict=True) if isinstance(entry, list) else entry.items()
            fields = {_text(k): _text(v) for k, v in pairs}
            if fields["username"] in users.values():
                found.append(f"{fields['username']} {fields['reason']} {fields['object']}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["single", "cluster"], indirect=True)
def test_the_service_runs_as_the_documented_redis_users(limited, rclient, producer):
    roles, users = limited
    try:
        _run_the_service(roles, producer)
    except Exception as exc:  # a refusal shows as a stalled worker: name what Redis refused
        raise AssertionError(f"Redis refused: {_refusals(rclient, users)}") from exc
    assert _refusals(rclient, users) == []


def _top(settings: Settings, board: str, window: str) -> dict[str, int]:
    status, body = api_call(settings, "GET", f"/v1/boards/{board}/top?limit=100&window={window}")
    assert status == 200, body
    return {item["member"]: item["score"] for item in body["items"]}


def _run_the_service(roles: Roles, producer: Producer) -> None:
    settings, api, admin = roles["rankstream-worker"], roles["rankstream-api"], roles["rankstream-admin"]
    events = [
        *((f"g{i}", "gift:room42", f"u{i % 7}", i) for i in range(40)),
        *((f"c{i}", "coins:global", f"u{i % 5}", 10 + i) for i in range(20)),
        *((f"l{i}", "live:acl", f"u{i % 3}", 1) for i in range(9)),
    ]
    model: dict[str, dict[str, int]] = {}
    for event_id, board, member, score in events:
        model.setdefault(board, {})[member] = model.get(board, {}).get(member, 0) + score
        event = {"id": event_id, "board": board, "member": member, "score": score}
        producer.produce(settings.topic_updates, orjson.dumps(event), key=board.encode())
    producer.produce(settings.topic_updates, b"{not json", key=b"gift:room42")
    assert producer.flush(10) == 0

    client = connect(settings.redis_url.get_secret_value(), settings.redis_cluster)
    seq = f"{settings.key_prefix}{{gift:room42}}:seq"
    with running_worker(settings):
        wait_for(lambda: int(client.get(seq) or 0) >= 40, what="gift:room42's 40 events")
        for board, scores in model.items():
            for window in ("total", "day") if board != "live:acl" else ("total", "30min"):
                assert _top(api, board, window) == scores, (board, window)
        _made_hot(api, "coins:global", model["coins:global"])
        assert "erased 'u1'" in erase(admin, "gift:room42", "u1", wait_s=60)
        assert "reset" in reset(admin, "live:acl", "30min", None, wait_s=60)
        del model["gift:room42"]["u1"]
        for window in ("total", "last_7d"):
            assert _top(api, "gift:room42", window) == model["gift:room42"], window
        assert _top(api, "live:acl", "30min") == {}
        assert _top(api, "live:acl", "total") == model["live:acl"]

    # the next hour's rolling periods, prepared by the preparer as this user
    now = int(time.time() * 1000)
    at = now - now % HOUR + HOUR - claim_lead_ms(HOUR, 10)
    boards = load_boards(settings.boards)
    sources = partition_sources(settings.key_prefix, settings.worker_group, settings.topic_updates)
    epoch = _text(client.hget(sources, EPOCH))  # the data set's, as the worker's own preparer has it
    preparer = RollingPreparer(
        client, boards, settings.key_prefix, clock=lambda: at, epoch=lambda: epoch, owner="t"
    )
    marks = f"{settings.key_prefix}{{gift:room42}}:rp:*"
    board_type = boards.type_for("gift")
    assert board_type is not None

    def ahead(key: Any) -> bool:  # the marker of a period not begun yet (one a preparer prepares)
        window, period = _text(key).rsplit(":", 2)[1:]
        return parse_period(board_type.window(window), period, boards.timezone).start_ms > now

    # within the claim lead of the hour's end, the worker's own preparer (the real clock) has
    # prepared them already: undone, so that this user's preparer prepares them whatever the time
    for key in [k for k in client.scan_iter(marks) if ahead(k)]:
        client.delete(key)
    before = set(client.scan_iter(marks))
    deadline = time.monotonic() + 60
    while preparer.step():
        assert time.monotonic() < deadline, "the preparer did not finish"
    prepared = set(client.scan_iter(marks)) - before
    # last_72h's next period (hourly buckets); last_7d's (its buckets are days) too when the
    # hour's end falls in the last part of a day of the board's zone
    windows = sorted(_text(k).rsplit(":", 2)[1] for k in prepared)
    assert "last_72h" in windows and set(windows) <= {"last_72h", "last_7d"}, windows
    assert all(client.get(k) == b"done" for k in prepared)

    lines = recover(admin)
    assert lines and all(isinstance(line, str) for line in lines)
    client.close()


def _made_hot(api: Settings, board: str, scores: dict[str, int]) -> None:
    """An API node makes `board` hot itself (it registers it in Redis, then loads it) once read
    often, and serves it from memory."""
    path = f"/v1/boards/{board}/top?limit=100"
    with NodeRunner(api.model_copy(update={"hot_promote_reads_per_s": 5.0})) as node:

        def from_memory() -> bool:
            status, body = node.get(path)
            assert status == 200, body
            return bool(body["source"] == "memory")

        wait_for(from_memory, 60, f"{board} served from memory")
        _, body = node.get(path)
        assert {item["member"]: item["score"] for item in body["items"]} == scores


def _take(rclient: Store, user: str, rule: str) -> None:
    for server in every_server(rclient):
        _acl(server, "SETUSER", user, rule)


@pytest.mark.slow
def test_a_worker_without_a_right_says_so_and_applies_once_it_is_back(limited, rclient, producer, caplog):
    roles, users = limited
    settings = roles["rankstream-worker"]
    _take(rclient, users["rankstream-worker"], "-zadd")
    event = {"id": "e1", "board": "coins:global", "member": "u1", "score": 7}
    producer.produce(settings.topic_updates, orjson.dumps(event), key=b"coins:global")
    assert producer.flush(10) == 0
    caplog.set_level(logging.WARNING)
    seq = f"{settings.key_prefix}{{coins:global}}:seq"
    with running_worker(settings):
        said = "NoPermissionError: .* no permissions to run the 'zadd' command"
        wait_for(
            lambda: any(re.search(said, str(r.__dict__.get("error"))) for r in caplog.records),
            what="the worker's line naming the refused command",
        )
        assert rclient.get(seq) is None  # nothing applied, nothing dead-lettered
        _take(rclient, users["rankstream-worker"], "+zadd")
        wait_for(lambda: rclient.get(seq) == b"1", what="the event applied once the right is back")


def test_an_api_without_a_right_answers_503_and_logs_the_refusal(limited, rclient, caplog):
    roles, users = limited
    _take(rclient, users["rankstream-api"], "-evalsha_ro")
    caplog.set_level(logging.ERROR)
    status, body = api_call(roles["rankstream-api"], "GET", "/v1/boards/coins:global/top")
    assert (status, body["error"]["code"]) == (503, "redis_unavailable")
    refused = [r for r in caplog.records if r.getMessage() == "redis refused the call"]
    assert refused and "permission" in str(refused[0].__dict__["error"]), caplog.text


def test_a_command_without_a_right_says_so_in_one_line(limited, rclient):
    roles, users = limited
    _take(rclient, users["rankstream-admin"], "-scan")
    env = worker_env(roles["rankstream-admin"])
    done = subprocess.run(
        [sys.executable, "-m", "rankstream.cli", "backfill"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "no permissions to run the 'scan' command" in line, line
    password = urlsplit(env["RANKSTREAM_REDIS_URL"]).password
    assert password and password not in done.stderr  # the secret stays out
