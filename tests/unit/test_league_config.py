"""`league:` in the board config (common/boards.py, common/league.py): what a league type reads
as, and every mistake as one line naming its key."""

from __future__ import annotations

import pytest

from common.boards import parse_boards
from common.errors import ConfigError
from common.league import Movement, Seat, division_instance, parse_division, parse_seat, seat_text

SEASONS = "seasons: {every_days: 7, anchor: 2026-11-02}"


def league_type(league: str, extra: str = "", windows: str = "[total, season]") -> str:
    return f"types:\n  arena:\n    windows: {windows}\n    {SEASONS}\n    league: {league}\n{extra}"


def test_a_league_reads_as_declared_with_its_defaults() -> None:
    text = league_type(
        "{division_size: 100, tiers: [bronze, silver, gold], promote: {bronze: 0.2, silver: 10}, "
        "demote: {gold: 0.25}, rewards: {top: 3}}"
    )
    league = parse_boards(text).types["arena"].league
    assert league is not None
    assert league.tiers == ("bronze", "silver", "gold") and league.entry_tier == "bronze"
    assert dict(league.promote) == {"bronze": Movement(fraction=0.2), "silver": Movement(count=10)}
    assert dict(league.demote) == {"gold": Movement(fraction=0.25)}
    assert league.rewards_top == 3
    # a fraction rounds down; a count is at most the division's members
    assert league.promote["bronze"].of(9) == 1 and league.promote["silver"].of(4) == 4
    assert [league.division(k) for k in (0, 99, 100, 250)] == [1, 1, 2, 3]
    assert league.divisions(0) == 0 and league.divisions(100) == 1 and league.divisions(101) == 2


def test_a_league_season_is_never_packed_and_hot_only_by_the_config() -> None:
    from common.store.encoding import window_packing

    text = league_type("{division_size: 10, tiers: [a]}", "hot: [{board: arena}]", "[day, season]").replace(
        "league:", "score_range: [0, 1000]\n    league:"
    )
    config = parse_boards(text)
    board_type = config.types["arena"]
    assert window_packing(board_type, board_type.window("season"), 0) is None
    assert window_packing(board_type, board_type.window("day"), 0) is not None
    assert config.hot[0].windows == ("day", "season")
    assert [w.name for w in board_type.promotable_windows()] == ["day"]  # a node's own promotion: not


@pytest.mark.parametrize(
    ("league", "extra", "error"),
    [
        ("{division_size: 10, tiers: [a], bogus: 1}", "", "types.arena.league.bogus: unknown key"),
        ("{division_size: 1, tiers: [a]}", "", "types.arena.league.division_size"),
        ("{division_size: 10, tiers: []}", "", "types.arena.league.tiers: expected 1 to 32 tiers"),
        ("{division_size: 10, tiers: [a, A]}", "", "types.arena.league.tiers[1]: tier 'A' must be"),
        ("{division_size: 10, tiers: [a, a]}", "", "types.arena.league.tiers[1]: duplicate tier 'a'"),
        ("{division_size: 10, tiers: [a], entry_tier: b}", "", "types.arena.league.entry_tier: 'b' is not"),
        ("{division_size: 10, tiers: [a, b], promote: {b: 1}}", "", "promote.b: tier 'b' promotes no one"),
        ("{division_size: 10, tiers: [a, b], demote: {a: 1}}", "", "demote.a: tier 'a' demotes no one"),
        ("{division_size: 10, tiers: [a, b], promote: {c: 1}}", "", "promote.c: 'c' is not one of the tiers"),
        ("{division_size: 10, tiers: [a, b], promote: {a: 11}}", "", "a count from 0 to division_size (10)"),
        ("{division_size: 10, tiers: [a, b], promote: {a: 1.5}}", "", "a fraction from 0 to 1, got 1.5"),
        ("{division_size: 10, tiers: [a, b, c], promote: {b: 0.6}, demote: {b: 0.5}}", "",
         "types.arena.league.demote.b: a full division of tier 'b' would promote and demote more"),
        ("{division_size: 10, tiers: [a], rewards: {top: 11}}", "", "rewards.top: at most division_size"),
        ("{division_size: 10, tiers: [a]}", "    tie_break: first\n", "arena.tie_break: a league type can't"),
        ("{division_size: 10, tiers: [a]}", "    shards: 1\n", "types.arena.shards: a league type can't"),
        ("{division_size: 10, tiers: [a]}", "    max_members: 5\n", "types.arena.max_members: a league type"),
        ("{division_size: 10, tiers: [a]}", "    retention: {season: 30}\n"
         "    period_results: {windows: [season]}\n", "arena.period_results: a league's season has no"),
    ],
)  # fmt: skip
def test_a_mistaken_league_is_one_line_naming_its_key(league: str, extra: str, error: str) -> None:
    text = league_type(league)
    if extra.startswith("    "):  # a key of the type
        text = text.replace("    league:", extra + "    league:")
    else:
        text += extra
    with pytest.raises(ConfigError) as caught:
        parse_boards(text)
    message = str(caught.value)
    assert error in message and "\n" not in message, message


def test_a_league_needs_a_season_window() -> None:
    with pytest.raises(ConfigError, match=r"types\.arena\.league: a league divides a season"):
        parse_boards("types:\n  arena:\n    windows: [total]\n    league: {division_size: 10, tiers: [a]}\n")


def test_seats_and_divisions_are_named_one_way() -> None:
    assert parse_seat(seat_text(Seat("gold", 217))) == Seat("gold", 217)
    assert parse_seat(b"a_b:0") == Seat("a_b", 0)
    assert parse_division("gold.3") == ("gold", 3)
    for bad in ("gold", "gold.0", "gold.-1", "Gold.1", "gold.1.2", ".1", "gold.01"):
        assert parse_division(bad) is None, bad
    assert division_instance("season:2026-11-02+4", "gold", 3) == "season:2026-11-02+4@gold.3"
