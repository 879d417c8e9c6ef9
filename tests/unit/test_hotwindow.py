"""The in-memory order is Redis' order: checked against a reference sort of what Redis does
(score, then the tie-encoded member bytes; reversed for desc boards) on random data."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.hotwindow import HotWindow
from common.cache_records import V2_SCORE, V2_SEQ, V2_TIE, RecordWriter
from common.store.encoding import (
    TIE_MAX,
    TieMode,
    encode_member,
    memory_body,
    memory_key_maker,
    sortable_score,
)


def redis_order(rows: dict[str, tuple[float, int]], desc: bool, mode: TieMode) -> list[str]:
    keyed = [(score, encode_member(mode, tie, m).encode(), m) for m, (score, tie) in rows.items()]
    keyed.sort(key=lambda r: (r[0], r[1]), reverse=desc)  # ZREVRANGE / ZRANGE
    return [m for _, _, m in keyed]


@pytest.mark.parametrize("desc", [True, False])
@pytest.mark.parametrize("mode", list(TieMode))
def test_memory_order_is_redis_order(desc, mode):
    rng = random.Random(7)
    rows: dict[str, tuple[float, int]] = {}
    window = HotWindow(desc, mode)
    for seq in range(3000):
        member = rng.choice(["a", "ab", "b", "ba", "z", "é", "m1", "m10", "m2"]) + str(rng.randrange(40))
        if rng.random() < 0.1 and member in rows:
            window.delete(member, seq)
            del rows[member]
            continue
        score = float(rng.choice([0, -0.0, 1, 2.5, -3, 1e15, -1e15, rng.randrange(20)]))
        tie = rng.randrange(1_000_000_000_000, 1_000_000_000_100)
        window.put(member, score, tie, seq)
        rows[member] = (score, tie)
        if seq == 1500:
            window.finish_loading()
    expected = redis_order(rows, desc, mode)
    assert [m for m, _ in window.page(0, len(rows), reverse=False)] == expected
    assert [m for m, _ in window.page(0, len(rows), reverse=True)] == expected[::-1]
    for position, member in enumerate(expected):
        score, at, better = window.locate(member, reverse=False) or (0.0, -1, -1)
        assert at == position and score == rows[member][0]
        assert better == sum(1 for s, _ in rows.values() if (s > score if desc else s < score))


def test_older_states_lose_whatever_order_they_arrive_in():
    window = HotWindow(True, TieMode.INV)
    window.finish_loading()
    assert window.put("m", 5.0, 100, seq=7)
    assert not window.put("m", 9.0, 50, seq=6)  # an older record arriving late
    assert not window.delete("m", seq=3)
    assert window.page(0, 10, reverse=False) == [("m", 5.0)]
    assert window.delete("m", seq=8)
    assert not window.put("m", 1.0, 1, seq=7)  # older than the delete
    assert len(window) == 0
    assert window.count_between(float("-inf"), float("inf")) == 0


@settings(max_examples=300, deadline=None)
@given(
    score=st.floats(allow_nan=False, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.0, -1.0]),
    tie=st.integers(0, TIE_MAX),
    member=st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1),
    desc=st.booleans(),
    mode=st.sampled_from(list(TieMode)),
)
def test_keys_built_from_a_records_bytes_are_the_memory_order(score, tie, member, desc, mode):
    """A replay builds keys from a format-2 record's bytes (memory_key_maker): the very keys
    sortable_score + memory_body make, whatever the score (-0.0, infinities), tie and member."""
    _, value = RecordWriter(2).state("b", "total", member, score=score, tie_ms=tie, seq=1, meta=None)
    make = memory_key_maker(mode, desc, score_at=V2_SCORE, tie_at=V2_TIE, seq_at=V2_SEQ)
    built = make(value, member.encode())
    assert built == sortable_score(score, desc) + memory_body(mode, desc, member, tie) + value[V2_SEQ]


@pytest.mark.parametrize("desc", [True, False])
@pytest.mark.parametrize("mode", list(TieMode))
def test_a_window_loaded_from_record_bytes_reads_as_one_built_state_by_state(desc, mode):
    rng = random.Random(11)
    staged, built = HotWindow(desc, mode), HotWindow(desc, mode)
    built.finish_loading()
    writer = RecordWriter(2)
    for seq in range(2000):
        member = f"m{rng.randrange(300)}"
        score, tie = float(rng.randrange(-50, 50)), rng.randrange(10**12, 10**12 + 50)
        if rng.random() < 0.1:
            assert staged.delete(member, seq) == built.delete(member, seq)
            continue
        _, value = writer.state("b", "total", member, score=score, tie_ms=tie, seq=seq, meta=None)
        assert staged.stage(member.encode(), value) == built.put(member, score, tie, seq)
    staged.finish_loading()
    assert staged.items() == built.items()
    assert staged.page(0, 400, reverse=False) == built.page(0, 400, reverse=False)
