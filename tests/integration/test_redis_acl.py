"""The Redis user docs/operations/requirements.md documents is enough: the worker (hot, rolling,
capped and packed boards, dead letters), its rolling preparer, the API and `rankstream erase`,
`reset` and `recover` run as that user, on one Redis and on a Cluster, and Redis refuses
nothing (`ACL LOG`)."""

from __future__ import annotations

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
from tests.helpers import api_call, every_server, running_worker, wait_for
from worker.rolling import RollingPreparer, claim_lead_ms
from worker.sources import EPOCH

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations" / "requirements.md"
HOUR = 3_600_000
DEFAULT_PREFIX = "rs:"


def documented_rules() -> list[str]:
    """The rules of the page's `ACL SETUSER rankstream ...` line, after the user name."""
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("ACL SETUSER ")]
    assert len(lines) == 1, "the requirements page has one ACL SETUSER line"
    words = lines[0].split()
    assert words[2] == "rankstream"
    return words[3:]


def test_the_documented_rules_name_the_default_prefix_and_a_placeholder_password():
    rules = documented_rules()
    assert f"~{DEFAULT_PREFIX}*" in rules and f"&{DEFAULT_PREFIX}*" in rules
    assert ">CHANGE-ME" in rules and "-@all" in rules and "resetkeys" in rules


def _acl(server: redis.Redis, *args: str) -> Any:
    return server.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


def _as_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def limited(topics: Settings, rclient: Store) -> Iterator[tuple[Settings, str]]:
    """The test's settings, connecting as a new user with the documented rules (its password and
    key prefix put in); the user is removed afterwards."""
    user, password = f"acl-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = [
        rule.replace(DEFAULT_PREFIX, topics.key_prefix).replace(">CHANGE-ME", f">{password}")
        for rule in documented_rules()
    ]
    servers = every_server(rclient)
    for server in servers:
        _acl(server, "SETUSER", user, *rules)
        _acl(server, "LOG", "RESET")
    url = _as_user(topics.redis_url.get_secret_value(), user, password)
    try:
        yield topics.model_copy(update={"redis_url": SecretStr(url)}), user
    finally:
        for server in servers:
            _acl(server, "DELUSER", user)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusals(rclient: Store, user: str) -> list[str]:
    """What Redis refused `user` (its ACL LOG, every server): "<reason> <object>" each."""
    found = []
    for server in every_server(rclient):
        for entry in _acl(server, "LOG"):
            pairs = zip(entry[::2], entry[1::2], strict=True) if isinstance(entry, list) else entry.items()
            fields = {_text(k): _text(v) for k, v in pairs}
            if fields["username"] == user:
                found.append(f"{fields['reason']} {fields['object']}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["single", "cluster"], indirect=True)
def test_the_service_runs_as_the_documented_redis_user(limited, rclient, producer):
    settings, user = limited
    try:
        _run_the_service(settings, producer)
    except Exception as exc:  # a refusal shows as a stalled worker: name what Redis refused
        raise AssertionError(f"Redis refused: {_refusals(rclient, user)}") from exc
    assert _refusals(rclient, user) == []


def _top(settings: Settings, board: str, window: str) -> dict[str, int]:
    status, body = api_call(settings, "GET", f"/v1/boards/{board}/top?limit=100&window={window}")
    assert status == 200, body
    return {item["member"]: item["score"] for item in body["items"]}


def _run_the_service(settings: Settings, producer: Producer) -> None:
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
                assert _top(settings, board, window) == scores, (board, window)
        assert "erased 'u1'" in erase(settings, "gift:room42", "u1", wait_s=60)
        assert "reset" in reset(settings, "live:acl", "30min", None, wait_s=60)
        del model["gift:room42"]["u1"]
        for window in ("total", "last_7d"):
            assert _top(settings, "gift:room42", window) == model["gift:room42"], window
        assert _top(settings, "live:acl", "30min") == {}
        assert _top(settings, "live:acl", "total") == model["live:acl"]

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

    lines = recover(settings)
    assert lines and all(isinstance(line, str) for line in lines)
    client.close()
