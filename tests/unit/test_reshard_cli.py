"""`rankstream reshard-board` refuses a bad argument with one line, exit 2, before asking Redis
or Kafka anything (the servers named here do not exist)."""

from __future__ import annotations

import os

import pytest

from rankstream.cli import main


@pytest.fixture
def boards(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith("RANKSTREAM_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "boards.yaml"
    path.write_text("types: {gift: {windows: [total], shards: 3}}\n")
    monkeypatch.setenv("RANKSTREAM_BOARDS", str(path))
    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RANKSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    return path


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["quest", "--shards", "3"], "rankstream: {path}: no board type 'quest'"),
        (["gift", "--shards", "0"], "rankstream: --shards must be 1 to 64, not 0"),
        (["gift", "--shards", "65"], "rankstream: --shards must be 1 to 64, not 65"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(boards, capsys, args, line):
    assert main(["reshard-board", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [line.format(path=boards)]
