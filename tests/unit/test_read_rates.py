"""Which boards a node makes hot by itself (api/readrates.py), and which periods it loads and
serves from memory (api/promoted.py coverage), on a chosen clock and zone."""

from __future__ import annotations

from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from api.promoted import coverage
from api.readrates import DEMOTE_FRACTION, MAX_FOLLOWED, ReadRates
from common.boards import parse_boards

CONFIG = """
timezone: Asia/Tokyo
types:
  gift: {windows: [total, hour, day, last_3h], late_grace: 1h}
"""


def run(
    rates: ReadRates,
    per_second: dict[str, int],
    seconds: int,
    promoted: set[str],
    hot: frozenset[str] = frozenset(),
) -> tuple[set[str], set[str]]:
    """`seconds` one-second samples of these reads: every board asked to promote, and to drop."""
    wanted: set[str] = set()
    dropped: set[str] = set()
    for _ in range(seconds):
        for board, count in per_second.items():
            for _ in range(count):
                rates.seen(board)
        up, down = rates.sample(1.0, set(hot), promoted)
        wanted.update(up)
        dropped.update(down)
    return wanted, dropped


def test_a_board_read_above_the_threshold_is_promoted_and_one_below_is_not():
    rates = ReadRates(threshold=10, idle_s=60, max_promoted=4)
    wanted, _ = run(rates, {"gift:hot": 40, "gift:cold": 5}, 5, set())
    assert wanted == {"gift:hot"}


def test_boards_the_config_makes_hot_are_never_promoted_and_at_most_max_are():
    rates = ReadRates(threshold=10, idle_s=60, max_promoted=2)
    reads = {f"gift:{i}": 20 + i for i in range(5)}
    wanted, _ = run(rates, reads, 10, set(), hot=frozenset({"gift:4"}))
    assert wanted == {"gift:3", "gift:2"}  # the most read first, within the room


def test_a_promoted_board_is_dropped_once_its_long_average_falls_below_a_quarter():
    rates = ReadRates(threshold=10, idle_s=30, max_promoted=4)
    run(rates, {"gift:a": 50}, 10, set())
    rates.promoted_now("gift:a")
    _, dropped = run(rates, {"gift:a": 5}, 20, {"gift:a"})  # under the threshold, above a quarter of it
    assert dropped == set()
    _, dropped = run(rates, {}, 200, {"gift:a"})
    assert dropped == {"gift:a"}
    assert rates.rate_long("gift:a") < 10 * DEMOTE_FRACTION


def test_off_promotes_nothing_and_forgets_the_counts():
    rates = ReadRates(threshold=0, idle_s=30, max_promoted=4)
    assert run(rates, {"gift:a": 1000}, 5, set()) == (set(), set())
    assert rates.counts == {}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 60)), max_size=40),
    st.integers(1, 3),
)
def test_never_more_promoted_than_the_room_and_never_a_promoted_or_hot_one_again(reads, room):
    rates = ReadRates(threshold=20, idle_s=5, max_promoted=room)
    promoted: set[str] = set()
    for second in reads:
        for board, count in second.items():
            for _ in range(count):
                rates.seen(board)
        up, down = rates.sample(1.0, {"d"}, promoted)
        assert not set(up) & (promoted | {"d"})
        promoted -= set(down)
        promoted |= set(up)
        assert len(promoted) <= room


def test_a_promoted_board_serves_the_current_and_previous_periods_and_later_ones():
    boards = parse_boards(CONFIG)
    board_type = boards.type_for("gift")
    assert board_type is not None
    tz = ZoneInfo("Asia/Tokyo")
    now = 1_795_969_454_000  # 2026-11-30 01:24 in Tokyo
    since, load = coverage(board_type, now, 3 * 3600, tz)
    assert since == {"hour": 1_795_964_400_000, "day": 1_795_878_000_000, "last_3h": 1_795_964_400_000}
    assert "total" in load
    assert [i for i in load if i.startswith("day:")] == ["day:2026-11-30", "day:2026-11-29"]
    hours = sorted(i for i in load if i.startswith("hour:"))
    assert hours == [f"hour:2026-11-30T0{h}" for h in range(5)]  # the previous, the current, 3 h ahead
    assert sorted(i for i in load if i.startswith("last_3h:"))[0] == "last_3h:2026-11-30T00"


def test_a_flood_of_names_read_rarely_is_not_followed_and_what_is_followed_is_bounded():
    """Names are the callers': what a node keeps of them stays bounded, and a board read often is
    still made hot."""
    rates = ReadRates(threshold=20, idle_s=300, max_promoted=4)
    run(rates, {f"gift:{i}": 4 for i in range(2_000)}, 3, set())  # below a quarter of the threshold
    assert not rates._rates
    run(rates, {f"gift:{i}": 6 for i in range(3 * MAX_FOLLOWED)}, 1, set())
    assert len(rates._rates) <= MAX_FOLLOWED
    wanted, _ = run(rates, {"gift:a": 200}, 5, set())  # a board read often still finds room
    assert wanted == {"gift:a"}
