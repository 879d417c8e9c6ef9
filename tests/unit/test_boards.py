"""The board-config loader: the contract's example, the defaults, and one clear line per mistake."""

from __future__ import annotations

import dataclasses
from datetime import date
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from common.boards import (
    BOARD_SCOPE_RE,
    BOARD_TYPE_RE,
    BoardType,
    HotBoard,
    Order,
    PeriodResults,
    TieBreak,
    Window,
    WindowKind,
    load_boards,
    parse_boards,
    split_board,
)
from common.errors import ConfigError
from common.store.encoding import window_bits
from common.store.shards import shard_names
from common.windows import Season, SeasonRule

CONTRACT_EXAMPLE = """\
timezone: Asia/Shanghai          # period boundaries are computed in this zone
types:
  gift:                          # boards "gift:<room>"
    order: desc                  # desc (default) | asc
    tie_break: first             # first (default): equal scores -> who got there first ranks higher
                                 # last | none
    windows: [total, hour, day, week, month, last_72h, last_7d]
    retention: {hour: 72, day: 31, week: 8, month: 12}   # periods kept, then expired
    max_members: 100000          # optional: ranking keeps the top N, every score stays exact
    late_grace: 10m              # a late event still counts in total and in open periods;
                                 # periods closed longer than this ignore it (counted in metrics)
  default: {windows: [total]}    # optional catch-all; without it an unknown type is a bad event
hot:                             # boards every API node holds in memory
  - {board: "gift:room42", windows: [total, day]}
"""


def test_contract_example_parses_into_the_expected_values() -> None:
    config = parse_boards(CONTRACT_EXAMPLE, "boards.yaml")

    assert config.timezone == ZoneInfo("Asia/Shanghai")
    assert list(config.types) == ["gift", "default"]
    assert config.types["gift"] == BoardType(
        name="gift",
        order=Order.DESC,
        tie_break=TieBreak.FIRST,
        windows=(
            Window("total", WindowKind.TOTAL),
            Window("hour", WindowKind.HOUR),
            Window("day", WindowKind.DAY),
            Window("week", WindowKind.WEEK),
            Window("month", WindowKind.MONTH),
            Window("last_72h", WindowKind.ROLLING, rolling_count=72, rolling_unit="h"),
            Window("last_7d", WindowKind.ROLLING, rolling_count=7, rolling_unit="d"),
        ),
        retention={"hour": 72, "day": 31, "week": 8, "month": 12, "last_72h": 2, "last_7d": 2},
        max_members=100_000,
        late_grace_ms=600_000,
    )
    assert config.types["default"] == BoardType(
        name="default",
        order=Order.DESC,
        tie_break=TieBreak.FIRST,
        windows=(Window("total", WindowKind.TOTAL),),
        retention={},
        max_members=None,
        late_grace_ms=600_000,
    )
    assert config.hot == (HotBoard(board="gift:room42", windows=("total", "day")),)


def test_defaults() -> None:
    config = parse_boards("types:\n  gift:\n")

    assert config.timezone == ZoneInfo("UTC")
    assert config.hot == ()
    gift = config.types["gift"]
    assert (gift.order, gift.tie_break, gift.max_members, gift.late_grace_ms) == (
        Order.DESC,
        TieBreak.FIRST,
        None,
        600_000,
    )
    assert gift.windows == (Window("total", WindowKind.TOTAL),)
    assert gift.retention == {}


def test_default_retention_covers_each_calendar_window_present() -> None:
    config = parse_boards("types: {gift: {windows: [year, hour, total, day, last_3d, week, month]}}")

    expected = {"year": 5, "hour": 72, "day": 31, "week": 8, "month": 12, "last_3d": 2}
    assert dict(config.types["gift"].retention) == expected


def test_retention_overrides_only_what_it_names() -> None:
    config = parse_boards("types: {gift: {windows: [total, day, week], retention: {week: 4}}}")

    assert dict(config.types["gift"].retention) == {"day": 31, "week": 4}


@pytest.mark.parametrize(
    ("name", "count", "unit"),
    [
        ("last_72h", 72, "h"),
        ("last_3d", 3, "d"),
        ("last_4w", 4, "w"),
        ("last_6m", 6, "m"),
        ("last_10000h", 10_000, "h"),
    ],
)
def test_rolling_windows(name: str, count: int, unit: str) -> None:
    board_type = parse_boards(f"types: {{gift: {{windows: [{name}]}}}}").types["gift"]

    assert board_type.window(name) == Window(name, WindowKind.ROLLING, rolling_count=count, rolling_unit=unit)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("2h", 7_200_000), ("1d", 86_400_000), ("0s", 0)],
)
def test_late_grace_durations(text: str, ms: int) -> None:
    assert parse_boards(f"types: {{gift: {{late_grace: {text}}}}}").types["gift"].late_grace_ms == ms


def test_asc_order_and_tie_rules() -> None:
    board_type = parse_boards("types: {shop: {order: asc, tie_break: none, max_members: 1}}").types["shop"]

    assert (board_type.order, board_type.tie_break, board_type.max_members) == (Order.ASC, TieBreak.NONE, 1)


def test_window_lookup() -> None:
    board_type = parse_boards(CONTRACT_EXAMPLE).types["gift"]

    assert board_type.window("day").kind is WindowKind.DAY
    with pytest.raises(KeyError):
        board_type.window("year")


def test_type_for_falls_back_to_default() -> None:
    with_default = parse_boards(CONTRACT_EXAMPLE)
    without_default = parse_boards("types: {gift: {}}")

    assert with_default.type_for("gift") is with_default.types["gift"]
    assert with_default.type_for("quest") is with_default.types["default"]
    assert without_default.type_for("quest") is None


def test_hot_windows() -> None:
    config = parse_boards(
        "types: {gift: {windows: [total, day]}, default: {windows: [total, week]}}\n"
        "hot: [{board: 'gift:room42', windows: [day]}, {board: gift}, {board: 'quest:eu:7'}]"
    )

    assert config.hot_windows("gift:room42") == ("day",)
    assert config.hot_windows("gift") == ("total", "day")
    assert config.hot_windows("quest:eu:7") == ("total", "week")
    assert config.hot_windows("gift:room43") == ()


def test_hot_windows_of_a_shard_are_its_boards_for_the_configured_count_only() -> None:
    config = parse_boards("types: {gift: {windows: [total], shards: 3}}\nhot: [{board: 'gift:r'}]")

    assert [config.hot_windows(name) for name in shard_names("gift:r", 3)] == [("total",)] * 3
    # another count's shards (left by `rankstream reshard-board`) are not the board's
    assert [config.hot_windows(name) for name in shard_names("gift:r", 2)] == [(), ()]


def test_config_is_frozen() -> None:
    config = parse_boards(CONTRACT_EXAMPLE)

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.types["gift"].max_members = 5  # type: ignore[misc]  # the point: assignment must fail
    with pytest.raises(TypeError):
        config.types["gift"].retention["hour"] = 1  # type: ignore[index]  # a read-only mapping


@pytest.mark.parametrize(
    ("board", "parts"),
    [
        ("gift:room42", ("gift", "room42")),
        ("gift", ("gift", None)),
        ("gift:eu:room:42", ("gift", "eu:room:42")),
        ("gift::", ("gift", ":")),
        ("g_2:A-z.0_9", ("g_2", "A-z.0_9")),
        ("gift:", None),
        (":room", None),
        ("Gift:room", None),
        ("gift:{room}", None),
        ("gift:room 42", None),
        ("gift:room42\n", None),
        ("g" * 33, None),
        ("gift:" + "s" * 161, None),
    ],
)
def test_split_board(board: str, parts: tuple[str, str | None] | None) -> None:
    assert split_board(board) == parts


def test_board_regexes() -> None:
    assert BOARD_TYPE_RE.fullmatch("a" * 32)
    assert not BOARD_TYPE_RE.fullmatch("a" * 33)
    assert BOARD_SCOPE_RE.fullmatch("x" * 160)
    assert not BOARD_SCOPE_RE.fullmatch("x{y}")


BAD_CONFIGS: list[tuple[str, str, str, str]] = [
    # (test id, YAML, key path, reason fragment)
    ("unknown key", "types: {gift: {colour: red}}", "types.gift.colour", "unknown key"),
    ("unknown top-level key", "types: {gift: {}}\nboards: []", "boards", "unknown key"),
    ("unknown hot key", "types: {gift: {}}\nhot: [{board: gift, ttl: 1}]", "hot[0].ttl", "unknown key"),
    ("bad order", "types: {gift: {order: up}}", "types.gift.order", "'desc' or 'asc'"),
    (
        "bad tie_break",
        "types: {gift: {tie_break: random}}",
        "types.gift.tie_break",
        "'first', 'last' or 'none'",
    ),
    (
        "unknown window",
        "types: {gift: {windows: [total, day, fortnight]}}",
        "types.gift.windows[2]",
        "unknown window 'fortnight' (expected total, hour, day, week, month, year, <N>min, <N>h, season or "
        "last_<N>h|d|w|m)",
    ),
    (
        "duplicate window",
        "types: {gift: {windows: [total, day, day]}}",
        "types.gift.windows[2]",
        "duplicate window 'day'",
    ),
    ("no windows", "types: {gift: {windows: []}}", "types.gift.windows", "at least one window"),
    ("windows not a list", "types: {gift: {windows: total}}", "types.gift.windows", "must be a list"),
    ("rolling N of 0", "types: {gift: {windows: [last_0h]}}", "types.gift.windows[0]", "1..10000"),
    ("rolling N too large", "types: {gift: {windows: [last_10001d]}}", "types.gift.windows[0]", "1..10000"),
    (
        "an event would count in more instances than a call holds",
        "types: {gift: {windows: [total, hour, last_72h], retention: {last_72h: 72}, late_grace: 3d}}",
        "types.gift.windows",
        "may count in 80 window instances, more than one call holds (48)",
    ),
    (
        "rolling unit unknown",
        "types: {gift: {windows: [last_3y]}}",
        "types.gift.windows[0]",
        "unknown window 'last_3y'",
    ),
    (
        "retention for absent window",
        "types: {gift: {windows: [total, day], retention: {hour: 24}}}",
        "types.gift.retention.hour",
        "not in this type's windows",
    ),
    (
        "retention for non-calendar",
        "types: {gift: {windows: [total], retention: {total: 1}}}",
        "types.gift.retention.total",
        "not a period window",
    ),
    (
        "retention of 0",
        "types: {gift: {windows: [day], retention: {day: 0}}}",
        "types.gift.retention.day",
        "greater than or equal to 1",
    ),
    (
        "bad late_grace",
        "types: {gift: {late_grace: 10 minutes}}",
        "types.gift.late_grace",
        "invalid duration '10 minutes'",
    ),
    ("late_grace unit", "types: {gift: {late_grace: 1w}}", "types.gift.late_grace", "invalid duration '1w'"),
    ("late_grace number", "types: {gift: {late_grace: 600}}", "types.gift.late_grace", "must be a string"),
    (
        "bad timezone",
        "timezone: Mars/Olympus\ntypes: {gift: {}}",
        "timezone",
        "unknown time zone 'Mars/Olympus'",
    ),
    ("timezone path", "timezone: ../../etc/passwd\ntypes: {gift: {}}", "timezone", "unknown time zone"),
    (
        "max_members 0",
        "types: {gift: {max_members: 0}}",
        "types.gift.max_members",
        "greater than or equal to 1",
    ),
    ("max_members bool", "types: {gift: {max_members: yes}}", "types.gift.max_members", "must be an integer"),
    ("shards 0", "types: {gift: {shards: 0}}", "types.gift.shards", "greater than or equal to 1"),
    ("shards 65", "types: {gift: {shards: 65}}", "types.gift.shards", "less than or equal to 64"),
    ("shards text", "types: {gift: {shards: three}}", "types.gift.shards", "must be an integer"),
    ("bad type name", "types: {Gift: {}}", "types.Gift", "1-32 characters"),
    ("type name not a string", "types: {1: {}}", "types.1", "key must be a string"),
    ("no types", "timezone: UTC", "types", "required key is missing"),
    ("empty types", "types: {}", "types", "at least one board type"),
    ("type not a mapping", "types: {gift: 5}", "types.gift", "must be a mapping, got int 5"),
    ("hot entry not a mapping", "types: {gift: {}}\nhot: [gift]", "hot[0]", "must be a mapping, got str"),
    (
        "hot board unknown type",
        "types: {gift: {}}\nhot: [{board: 'foo:x'}]",
        "hot[0].board",
        "board type 'foo' is not configured",
    ),
    (
        "hot board bad syntax",
        "types: {gift: {}}\nhot: [{board: 'gift:{x}'}]",
        "hot[0].board",
        "invalid board id",
    ),
    (
        "hot board missing",
        "types: {gift: {}}\nhot: [{windows: [total]}]",
        "hot[0].board",
        "required key is missing",
    ),
    (
        "hot window not in type",
        "types: {gift: {windows: [total]}}\nhot: [{board: gift, windows: [total, day]}]",
        "hot[0].windows[1]",
        "window 'day' is not a window of board type 'gift'",
    ),
    (
        "hot window duplicate",
        "types: {gift: {}}\nhot: [{board: gift, windows: [total, total]}]",
        "hot[0].windows[1]",
        "duplicate window",
    ),
    (
        "hot board twice",
        "types: {gift: {}}\nhot: [{board: 'gift:a'}, {board: 'gift:a'}]",
        "hot[1].board",
        "listed twice",
    ),
    ("top level a list", "- types", "(top level)", "expected a mapping"),
    ("empty file", "", "(top level)", "the file is empty"),
    ("only comments", "# nothing here\n", "(top level)", "the file is empty"),
    ("yaml syntax error", "types:\n  gift: {order: desc\n  shop: {}\n", "line 3, column 7", "invalid YAML"),
    (
        "yaml bad indentation",
        "types:\n  gift:\n    order: desc\n   windows: [total]\n",
        "line 4",
        "invalid YAML",
    ),
    ("duplicate yaml key", "types:\n  gift: {}\n  gift: {order: asc}\n", "line 3", "duplicate key 'gift'"),
    ("score_range one value", "types: {gift: {score_range: [5]}}", "types.gift.score_range", "[min, max]"),
    ("score_range reversed", "types: {gift: {score_range: [5, 1]}}", "types.gift.score_range", "min < max"),
    ("score_range float", "types: {gift: {score_range: [0, 1.5]}}", "types.gift.score_range", "integer"),
    (
        "score_range beyond 53 bits",
        "types: {gift: {tie_break: none, score_range: [0, 9007199254740992]}}",
        "types.gift.score_range",
        "exact up to +/-(2^53 - 1)",
    ),
    ("fixed length not dividing a day", "types: {g: {windows: [7min]}}", "types.g.windows[0]", "divide 24 h"),
    ("season without seasons", "types: {g: {windows: [season]}}", "types.g.windows[0]", "needs the type's"),
    (
        "seasons without the season window",
        "types: {g: {windows: [total], seasons: {every_days: 7, anchor: 2027-01-04}}}",
        "types.g.seasons",
        "'season' is not in windows",
    ),
    (
        "overlapping seasons",
        "types: {g: {windows: [season], seasons: [{name: a, start: '2027-01-01', end: '2027-02-01'}, "
        "{name: b, start: '2027-01-15', end: '2027-03-01'}]}}",
        "types.g.seasons[1]",
        "starts before 'a' ends",
    ),
    (
        "season ending before it starts",
        "types: {g: {windows: [season], seasons: [{name: a, start: '2027-02-01', end: '2027-01-01'}]}}",
        "types.g.seasons[0]",
        "must start before it ends",
    ),
    (
        "bad season name",
        "types: {g: {windows: [season], seasons: [{name: 'a b', start: '2027-01-01', end: '2027-02-01'}]}}",
        "types.g.seasons[0].name",
        "1-64 characters",
    ),
    (
        "bad anchor",
        "types: {g: {windows: [season], seasons: {every_days: 7, anchor: soon}}}",
        "types.g.seasons",
        "anchor must be a date",
    ),
    (
        "anchor past the calendar",
        "types: {g: {windows: [season], seasons: {every_days: 3660, anchor: 9999-01-01}}}",
        "types.g.seasons",
        "in 2000..2199",
    ),
    ("bad ends_at", "types: {g: {ends_at: tomorrow}}", "types.g.ends_at", "not an ISO 8601 date-time"),
    (
        "fixed retention too long",
        "types: {g: {windows: [30min], retention: {30min: 20000}}}",
        "types.g.retention.30min",
        "at most 19200 periods",
    ),
    (
        "score_range leaves no room for the tie",
        "types: {gift: {windows: [total, day, month], score_range: [0, 2097152]}}",
        "types.gift.score_range",
        "window 'month' keeps 32 bits of tie time beside the score, which leaves [-2097152, 2097151]",
    ),
    (
        "results of an undeclared window",
        "types: {gift: {windows: [total, day], period_results: {windows: [week]}}}",
        "types.gift.period_results.windows[0]",
        "window 'week' is not in this type's windows",
    ),
    (
        "results of total",
        "types: {gift: {windows: [total, day], period_results: {windows: [day, total]}}}",
        "types.gift.period_results.windows[1]",
        "window 'total' has no periods to close",
    ),
    (
        "results of a window twice",
        "types: {gift: {windows: [day], period_results: {windows: [day, day]}}}",
        "types.gift.period_results.windows[1]",
        "duplicate window 'day'",
    ),
    (
        "results of no window",
        "types: {gift: {windows: [day], period_results: {windows: []}}}",
        "types.gift.period_results.windows",
        "at least one window",
    ),
    (
        "results top too large",
        "types: {gift: {windows: [day], period_results: {windows: [day], top: 10001}}}",
        "types.gift.period_results.top",
        "10000",
    ),
    (
        "results of a period gone at its close",
        "types: {gift: {windows: [hour], retention: {hour: 1}, period_results: {windows: [hour]}}}",
        "types.gift.period_results.windows[0]",
        "keeps a closed period for 0 more period(s), not a minute past its late_grace",
    ),
    (
        "results of a period gone a few seconds after its result is due",
        "types: {gift: {windows: [day], retention: {day: 2}, late_grace: 82790s,"
        " period_results: {windows: [day]}}}",
        "types.gift.period_results.windows[0]",
        "not a minute past its late_grace",
    ),
    (
        "results of a period gone before its grace ends",
        "types: {gift: {windows: [last_3h], retention: {last_3h: 2}, late_grace: 1h,"
        " period_results: {windows: [last_3h]}}}",
        "types.gift.period_results.windows[0]",
        "not a minute past its late_grace: its result could not be read; raise its retention",
    ),
]


@pytest.mark.parametrize(
    ("config", "packed"),
    [
        # a day keeps 27 bits of tie: 2^26 - 1 is the widest top; total keeps its ties in members
        ("{windows: [total, day], score_range: [-67108864, 67108863]}", {"total": None, "day": 27}),
        ("{windows: [hour, week, year], score_range: [0, 1000]}", {"hour": 25, "week": 30, "year": 35}),
        # without ties nothing is packed beside the score: every window packs, total too
        ("{tie_break: none, windows: [total, month], score_range: [-5, 5]}", {"total": 0, "month": 0}),
        ("{windows: [total, day]}", {"total": None, "day": None}),  # no declared range
    ],
)
def test_declared_score_range_packs_the_windows_it_fits(config: str, packed: dict[str, int | None]) -> None:
    board_type = parse_boards(f"types: {{gift: {config}}}").types["gift"]
    assert {w.name: window_bits(board_type, w) for w in board_type.windows} == packed


def test_period_results() -> None:
    config = parse_boards(
        "types: {gift: {windows: [total, hour, 30min, last_7d, season], seasons: {every_days: 7, anchor: "
        "2026-01-05}, period_results: {windows: [hour, 30min, last_7d, season], top: 10000}}, plain: {}}"
    )
    results = config.types["gift"].results
    assert results is not None
    assert (results.windows, results.top) == (frozenset({"hour", "30min", "last_7d", "season"}), 10_000)
    assert config.types["plain"].results is None
    default_top = parse_boards("types: {gift: {windows: [day], period_results: {windows: [day]}}}")
    assert default_top.types["gift"].results == PeriodResults(frozenset({"day"}), 100)


def test_declared_score_range_is_kept() -> None:
    board_type = parse_boards("types: {gift: {score_range: [-10, 10]}}").types["gift"]
    assert board_type.score_range == (-10, 10)


@pytest.mark.parametrize(
    ("text", "path", "reason"), [row[1:] for row in BAD_CONFIGS], ids=[row[0] for row in BAD_CONFIGS]
)
def test_bad_config_names_file_path_and_reason(text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_boards(text, "boards.yaml")

    message = str(caught.value)
    assert message.startswith(f"boards.yaml: {path}"), message
    assert reason in message, message
    assert "\n" not in message


def test_hot_board_of_unknown_type_is_fine_with_a_default() -> None:
    config = parse_boards("types: {default: {}}\nhot: [{board: 'foo:x'}]")

    assert config.hot_windows("foo:x") == ("total",)


def test_load_boards_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "boards.yaml"
    path.write_text(CONTRACT_EXAMPLE, encoding="utf-8")

    assert load_boards(path) == parse_boards(CONTRACT_EXAMPLE)


def test_load_boards_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "boards.yaml"
    path.write_text("types: {gift: {order: up}}\n", encoding="utf-8")

    with pytest.raises(ConfigError, match=r"boards\.yaml: types\.gift\.order: "):
        load_boards(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"

    with pytest.raises(ConfigError) as caught:
        load_boards(path)

    assert str(path) in str(caught.value)
    assert "cannot read" in str(caught.value)


def test_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "boards.yaml"
    path.write_bytes(b"types: {gift: {}}\n# caf\xe9\n")

    with pytest.raises(ConfigError, match="not UTF-8"):
        load_boards(path)


def test_fixed_length_windows_seasons_and_activity_end() -> None:
    config = parse_boards(
        "timezone: Asia/Shanghai\n"
        "types:\n"
        "  live:\n"
        "    windows: [total, 30min, 2h, season]\n"
        "    retention: {30min: 96}\n"
        "    seasons: [{name: s1, start: '2027-01-01T00:00', end: 2027-02-01T00:00:00+08:00}]\n"
        "    ends_at: '2027-01-20T22:00:00Z'\n"
        "  ladder: {windows: [season], seasons: {every_days: 28, anchor: 2027-01-04}}\n"
    )
    live = config.types["live"]
    assert [(w.name, w.kind, w.minutes) for w in live.windows[1:3]] == [
        ("30min", WindowKind.FIXED, 30),
        ("2h", WindowKind.FIXED, 120),
    ]
    # 96 declared; 2h keeps 3 days of periods by default; seasons 4
    assert dict(live.retention) == {"30min": 96, "2h": 36, "season": 4}
    start = 1_798_732_800_000  # 2027-01-01T00:00+08:00: an instant without offset is local time
    assert live.window("season").seasons == (Season("s1", start, start + 31 * 86_400_000),)
    assert live.ends_at_ms == 1_800_482_400_000
    assert config.types["ladder"].window("season").rule == SeasonRule(28, date(2027, 1, 4))
