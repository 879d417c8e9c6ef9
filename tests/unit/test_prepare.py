"""`rankstream stack prepare` (`make setup`): nginx is installed where it can be, and a machine
where it cannot still gets everything the service needs (only one test needs nginx)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import StackError
from rankstream import devstack


def test_prepare_goes_on_without_nginx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_nginx() -> str:
        raise StackError("nginx not found: install it")

    monkeypatch.setattr(devstack, "ensure_redis_server", lambda: "/usr/bin/redis-server")
    monkeypatch.setattr(devstack, "ensure_java", lambda: "/usr/bin/java")
    monkeypatch.setattr(devstack, "ensure_kafka_jars", lambda: tmp_path)
    monkeypatch.setattr(devstack, "ensure_nginx", no_nginx)
    said = devstack.DevStack(tmp_path).prepare()
    assert said.startswith("ready: /usr/bin/redis-server") and "no nginx (nginx not found" in said
