"""The chaos suite's stream (chaos/stream.py): each kind of bad event it produces is refused by
the service's parser with the reason the suite expects of it (the checker then holds the
dead-letter topic to those reasons), and a seed plans the same stream every time."""

from __future__ import annotations

import orjson
import pytest

from chaos.config import boards_yaml
from chaos.stream import BAD_KINDS, ELEMENT_KINDS, SKEW_MS, Stream, parse_bad
from common.boards import parse_boards
from common.events import parse_message

NOW = 1_796_000_000_000
BOARDS = parse_boards(boards_yaml(NOW))
GOOD = {"id": "e1", "board": "gift:r1", "member": "m1", "score": 5}


def test_at_least_thirty_kinds_of_bad_event_over_every_parse_reason():
    assert len(BAD_KINDS) >= 30
    assert len({name for name, _, _ in BAD_KINDS}) == len(BAD_KINDS)
    reasons = {reason for _, reason, _ in BAD_KINDS}
    assert len(reasons) >= 17, reasons


@pytest.mark.parametrize(("name", "reason", "make"), BAD_KINDS, ids=[k[0] for k in BAD_KINDS])
def test_each_bad_kind_is_refused_with_its_reason(name, reason, make):
    result = parse_message(make(dict(GOOD), NOW), BOARDS, NOW + SKEW_MS)
    assert not result.events, name
    assert [r.reason for r in result.rejections][:1] == [reason], (name, result.rejections)


@pytest.mark.parametrize(("name", "reason", "make"), ELEMENT_KINDS, ids=[k[0] for k in ELEMENT_KINDS])
def test_a_bad_element_is_refused_alone_with_its_index(name, reason, make):
    element = orjson.loads(make(dict(GOOD), NOW))
    value = orjson.dumps([GOOD, element, {**GOOD, "id": "e2"}])
    result = parse_message(value, BOARDS, NOW + SKEW_MS)
    assert [(r.reason, r.index) for r in result.rejections] == [(reason, 1)], name
    assert [e.id for e in result.events] == ["e1", "e2"]


def test_a_seed_plans_the_same_stream():
    def plan(seed: int) -> list[tuple[str, list[tuple[int | None, str]]]]:
        return [(p.key, p.bad) for p in Stream(seed, NOW).messages(3_000)]

    assert plan(5) == plan(5)
    assert plan(5) != plan(6)


def test_the_bad_header_reads_back():
    planned = next(p for p in Stream(3, NOW).messages(3_000) if p.bad)
    [(name, raw)] = planned.headers()
    assert name == "chaos-bad"
    assert isinstance(raw, bytes)
    assert parse_bad(raw) == planned.bad
