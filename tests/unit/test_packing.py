"""Packed windows' pure rules (common/store/packing.py, common/store/encoding.py Packing): a bound
on scores, turned into a bound on packed values, selects exactly the same members, and a packed
value unpacks to its score and tie. Redis' side is tested in test_store_order.py."""

from __future__ import annotations

import math
from datetime import date

from hypothesis import given
from hypothesis import strategies as st

from common.store.encoding import EXACT_MAX, Packing, packed_bound
from common.store.packing import longest_period_ms, packable, packable_bounds, tie_bits
from common.windows import SeasonRule, Window, WindowKind, parse_window

BITS = 27
LOW, HIGH = packable_bounds(BITS)
BASE = 1_795_276_800_000
SCORES = st.integers(LOW, HIGH)
OFFSETS = st.integers(0, 2**BITS - 1)
BOUNDS = st.one_of(
    st.floats(allow_nan=False),
    st.integers(LOW - 2, HIGH + 2).map(float),
    st.sampled_from([math.inf, -math.inf, 0.5, -0.5, float(EXACT_MAX), -float(EXACT_MAX), 1e300]),
)


def redis_bound(value: float, exclusive: bool) -> str:
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    text = repr(value) if not value.is_integer() else str(int(value))
    return f"({text}" if exclusive else text


def in_range(x: float, low: str, high: str) -> bool:
    """ZCOUNT's test of one value against two bounds in Redis syntax."""

    def parse(bound: str) -> tuple[float, bool]:
        exclusive = bound.startswith("(")
        return float((bound[1:] if exclusive else bound).replace("+inf", "inf")), exclusive

    (lo, lx), (hi, hx) = parse(low), parse(high)
    return (x > lo if lx else x >= lo) and (x < hi if hx else x <= hi)


@given(
    rows=st.lists(st.tuples(SCORES, OFFSETS), min_size=1, max_size=20),
    low=st.tuples(BOUNDS, st.booleans()),
    high=st.tuples(BOUNDS, st.booleans()),
    inv=st.booleans(),
)
def test_a_bound_on_scores_selects_the_same_members_of_packed_values(rows, low, high, inv):
    """(bound, exclusive) pairs: fractions, integers around the range's ends, infinities."""
    packing = Packing(BITS, BASE, inv)
    scores_low, scores_high = redis_bound(*low), redis_bound(*high)
    packed_low = packed_bound(packing, scores_low, True)
    packed_high = packed_bound(packing, scores_high, False)
    for score, offset in rows:
        value = score * 2**BITS + offset  # any tie of the score
        assert in_range(value, packed_low, packed_high) == in_range(score, scores_low, scores_high)
        state = packing.unpack(str(value))
        assert state.score == score
        assert state.tie_ms == BASE + (2**BITS - 1 - offset if inv else offset)


def test_tie_bits_fit_the_longest_period_and_total_packs_only_without_ties():
    windows = {kind: Window(kind, WindowKind(kind)) for kind in ("hour", "day", "week", "month", "year")}
    assert {kind: tie_bits(longest_period_ms(w), True) for kind, w in windows.items()} == {
        "hour": 25,
        "day": 27,
        "week": 30,
        "month": 32,
        "year": 35,
    }
    total = Window("total", WindowKind.TOTAL)
    assert tie_bits(longest_period_ms(total), True) is None
    assert tie_bits(longest_period_ms(total), False) == 0
    # fixed-length periods and seasons: their length plus a repeated local time
    assert tie_bits(longest_period_ms(parse_window("30min")), True) == 24  # 4.5 h + 2 h before the start
    assert (
        tie_bits(
            longest_period_ms(Window("season", WindowKind.SEASON, rule=SeasonRule(28, date(2026, 1, 5)))),
            True,
        )
        == 32
    )
    assert packable((-(2**26), 2**26 - 1), 27)
    assert not packable((0, 2**26), 27)
    assert not packable((-(2**26) - 1, 0), 27)
