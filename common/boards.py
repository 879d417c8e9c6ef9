"""Board types: which boards exist, how they rank, which windows they keep (docs/contract.md §3).

The worker and the API both load the same YAML file at start-up. Every mistake becomes one
`ConfigError` line, `<source>: <key.path>: <reason>`, so a bad deploy fails before it consumes or
serves anything. Pydantic checks the shape (types, unknown keys); the rules that span several keys
(retention vs windows, hot boards vs types) are checked after, with paths written out by hand.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import ConfigError
from common.league import MAX_DIVISION_SIZE, MAX_TIERS, TIER_RE, League, Movement
from common.store.packing import longest_period_ms, packable, packable_bounds, tie_bits
from common.store.shards import MAX_SHARDS, SHARD_MARK, board_of, shard_names
from common.windows import (
    CALENDAR_KINDS,
    DAY_MINUTES,
    MAX_INSTANCES_PER_CALL,
    PERIOD_KINDS,
    SEASON_WINDOW,
    SHORTEST_BUCKET_MS,
    Season,
    SeasonRule,
    Window,
    WindowError,
    WindowKind,
    check_seasons,
    parse_anchor,
    parse_instant,
    parse_window,
)

__all__ = ["CALENDAR_KINDS", "PERIOD_KINDS", "Window", "WindowKind"]  # re-exported: callers' one import

# Use with fullmatch: a board id is "<type>" or "<type>:<scope>", and it ends up inside a Redis
# hash tag, so braces, spaces and control characters are kept out by construction.
BOARD_TYPE_RE = re.compile(r"[a-z0-9_]{1,32}")
BOARD_SCOPE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,160}")
# Both in one pattern, so the worker's per-event check is a single regex call. The type holds no
# colon, so the first colon is where the scope starts.
_BOARD_RE = re.compile(rf"({BOARD_TYPE_RE.pattern})(?::({BOARD_SCOPE_RE.pattern}))?")

DEFAULT_TYPE = "default"
DEFAULT_RETENTION: Mapping[str, int] = MappingProxyType(
    {"hour": 72, "day": 31, "week": 8, "month": 12, "year": 5, SEASON_WINDOW: 4}
)
DEFAULT_FIXED_RETENTION_DAYS = 3  # a fixed-length window keeps 3 days of periods (30min: 144)
# a rolling window keeps its current period and the previous one (trend=1) unless told more: each
# period is a whole board; its buckets are kept N units whatever this says
DEFAULT_ROLLING_RETENTION = 2

# At most a century of periods kept (hours: 400 days, counted one by one across DST changes), and
# a late grace of at most a year: expiry and lateness stay far inside the calendar's range.
MAX_RETENTION: Mapping[str, int] = MappingProxyType(
    {"hour": 400 * 24, "day": 100 * 366, "week": 100 * 53, "month": 100 * 12, "year": 100, SEASON_WINDOW: 100}
)
MAX_FIXED_RETENTION_DAYS = 400
MAX_LATE_GRACE_MS = 366 * 86_400_000
# period_results (docs/contract.md §6): the most members one period's result record carries, and how many
# when the declaration does not say
MAX_RESULT_TOP = 10_000
DEFAULT_RESULT_TOP = 100
# A result is due this long after its period's late grace ends (common/results.py): a worker whose
# clock trails the emitter's by less still counts its late events before the result is sealed (a
# later one is refused by the seal, apply.lua), and the period's last batch is in.
RESULT_SETTLE_MS = 5_000
RESULT_MARGIN_MS = 60_000  # and a period is kept at least this long after its result is due
_EXACT_INTEGER = 2**53 - 1  # common/store/encoding.py EXACT_MAX (which imports this module)


class Order(StrEnum):
    DESC = "desc"
    ASC = "asc"


class TieBreak(StrEnum):
    FIRST = "first"
    LAST = "last"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class PeriodResults:
    """`period_results: {windows, top}`: the windows whose closed periods each emit one record to
    rank_period_closed (worker/results.py), with their best `top` members."""

    windows: frozenset[str]
    top: int


@dataclass(frozen=True, slots=True)
class BoardType:
    name: str
    order: Order
    tie_break: TieBreak
    windows: tuple[Window, ...]
    retention: Mapping[str, int]
    max_members: int | None
    late_grace_ms: int
    # declared: every score of the type is an integer in [low, high] (common/store/encoding.py
    # packs the tie into the score of the windows where both fit in 53 bits)
    score_range: tuple[int, int] | None = None
    # an activity's end: events at or after it, or processed after it plus late_grace, are
    # dead-lettered with board_closed (reads go on until retention ends)
    ends_at_ms: int | None = None
    results: PeriodResults | None = None  # period_results: None emits nothing
    shards: int = 1  # each board's members spread over this many Redis slots (common/store/shards.py)
    league: League | None = None  # its season window is split in divisions (common/league.py)
    rolling: tuple[Window, ...] = field(init=False, repr=False, compare=False)  # its last_<N>... windows

    def __post_init__(self) -> None:
        rolling = tuple(w for w in self.windows if w.kind is WindowKind.ROLLING)
        object.__setattr__(self, "rolling", rolling)

    def promotable_windows(self) -> tuple[Window, ...]:
        """The windows an API node holds in memory of a board it makes hot by itself (read often:
        api/promoted.py): all but a league's season, whose divisions only the config's `hot:`
        puts in memory (an API node reads a board's state from Redis to promote it, and reads no
        division's)."""
        if self.league is None:
            return self.windows
        return tuple(w for w in self.windows if w.kind is not WindowKind.SEASON)

    def window(self, name: str) -> Window:
        for window in self.windows:
            if window.name == name:
                return window
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class HotBoard:
    board: str
    windows: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BoardsConfig:
    timezone: ZoneInfo
    types: Mapping[str, BoardType]
    hot: tuple[HotBoard, ...]
    # Asked once per touched board by the worker, so a dict rather than a scan of `hot`.
    _hot_index: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = MappingProxyType({hot.board: hot.windows for hot in self.hot})
        object.__setattr__(self, "_hot_index", index)

    def type_for(self, type_name: str) -> BoardType | None:
        board_type = self.types.get(type_name)
        return board_type if board_type is not None else self.types.get(DEFAULT_TYPE)

    def hot_windows(self, board: str) -> tuple[str, ...]:
        """The hot windows of a board, or of the board a shard's name belongs to: a shard of the
        type's shard count (another count's are left from before `rankstream reshard-board`)."""
        found = self._hot_index.get(board)
        if found is None and SHARD_MARK in board:
            whole = board_of(board)
            if board in shard_names(whole, self.shards_of(whole)):
                found = self._hot_index.get(whole)
        return found or ()

    def shards_of(self, board: str) -> int:
        """How many shards `board` has in Redis (its type's `shards`; 1 for an invalid id)."""
        parts = split_board(board)
        board_type = None if parts is None else self.type_for(parts[0])
        return 1 if board_type is None else board_type.shards


def split_board(board: str) -> tuple[str, str | None] | None:
    """("gift", "room42") for "gift:room42", ("gift", None) for "gift", None when invalid."""
    match = _BOARD_RE.fullmatch(board)
    return None if match is None else (match[1], match[2])


def parse_boards(text: str, source: str = "<string>") -> BoardsConfig:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {_yaml_error(exc)}") from None
    try:
        return _build(_validate_shape(data))
    except _InvalidConfigError as exc:
        raise ConfigError(f"{source}: {exc.path}: {_one_line(exc.reason)}") from None


def load_boards(path: str | os.PathLike[str]) -> BoardsConfig:
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the board config: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: byte {exc.start}: the board config is not UTF-8") from None
    return parse_boards(text, source)


# --- reading the YAML -------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys without a word; a repeated key in a config file is
    nearly always an edit gone wrong, so it is an error here."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or exc.context or "syntax error"
        return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {_one_line(problem)}"
    return f"invalid YAML: {_one_line(str(exc))}"


# --- the shape, checked by pydantic -----------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _SeasonModel(_Strict):
    name: str
    start: str | datetime
    end: str | datetime


class _SeasonRuleModel(_Strict):
    every_days: Annotated[int, Field(ge=1, le=3660)]
    anchor: str | date


class _RewardsModel(_Strict):
    top: Annotated[int, Field(ge=0)]


class _ResultsModel(_Strict):
    windows: list[str]
    top: Annotated[int, Field(ge=1, le=MAX_RESULT_TOP)] = DEFAULT_RESULT_TOP


class _LeagueModel(_Strict):
    division_size: Annotated[int, Field(ge=2, le=MAX_DIVISION_SIZE)]
    tiers: list[str]
    entry_tier: str | None = None
    promote: dict[str, int | float] = Field(default_factory=dict)
    demote: dict[str, int | float] = Field(default_factory=dict)
    rewards: _RewardsModel | None = None


class _TypeModel(_Strict):
    order: Literal["desc", "asc"] = "desc"
    tie_break: Literal["first", "last", "none"] = "first"
    windows: list[str] = Field(default_factory=lambda: ["total"])
    retention: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    max_members: Annotated[int, Field(ge=1)] | None = None
    late_grace: str = "10m"
    score_range: list[int] | None = None
    seasons: list[_SeasonModel] | _SeasonRuleModel | None = None
    ends_at: str | datetime | None = None
    period_results: _ResultsModel | None = None
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)] = 1
    league: _LeagueModel | None = None


class _HotModel(_Strict):
    board: str
    windows: list[str] | None = None


class _FileModel(_Strict):
    timezone: str = "UTC"
    types: dict[str, _TypeModel | None]  # `gift:` with nothing under it means all defaults
    hot: list[_HotModel] | None = None


class _InvalidConfigError(Exception):
    """Carries a key path and a reason to `parse_boards`, which adds the source."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _validate_shape(data: object) -> _FileModel:
    if data is None:
        raise _InvalidConfigError(
            "(top level)", "the file is empty; expected a mapping with at least 'types'"
        )
    if not isinstance(data, dict):
        raise _InvalidConfigError("(top level)", f"expected a mapping with 'types', got {_kind(data)}")
    for key in data:
        if not isinstance(key, str):
            raise _InvalidConfigError(str(key), f"key must be a string, got {_kind(key)}")
    try:
        return _FileModel.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise _InvalidConfigError(
            *_describe(error["loc"], error["type"], error["msg"], error.get("input"))
        ) from None


def _describe(loc: tuple[int | str, ...], kind: str, msg: str, value: object) -> tuple[str, str]:
    if kind == "missing":
        return _path(loc), "required key is missing"
    if kind == "extra_forbidden":
        allowed = ", ".join(_allowed_keys(loc[:-1]))
        return _path(loc), f"unknown key (expected one of {allowed})"
    if len(loc) >= 2 and loc[-1] == "[key]":
        # pydantic reports a bad key as (..., key, "[key]"); name it like any other key.
        return _path((*loc[:-2], str(loc[-2]))), f"key must be a string, got {_kind(value)}"
    expected = _EXPECTED.get(kind) or msg.replace("Input should be", "must be", 1)
    return _path(loc), f"{expected}, got {_show(value)}"


# YAML words for pydantic's type errors, which would otherwise say "dictionary or instance of _TypeModel".
_EXPECTED = {
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
}


def _allowed_keys(parent: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = _FileModel
    if parent[:1] == ("types",) and len(parent) == 2:
        model = _TypeModel
    elif parent[:1] == ("hot",) and len(parent) == 2:
        model = _HotModel
    elif parent[:1] == ("types",) and parent[2:] == ("league",):
        model = _LeagueModel
    elif parent[:1] == ("types",) and parent[2:] == ("league", "rewards"):
        model = _RewardsModel
    return list(model.model_fields)


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _show(value: object) -> str:
    text = repr(value)
    return f"{_kind(value)} {text if len(text) <= 60 else text[:57] + '...'}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- the rules across keys --------------------------------------------------------------------

_DURATION_RE = re.compile(r"(\d{1,12})(ms|s|m|h|d)")
_DURATION_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _build(model: _FileModel) -> BoardsConfig:
    try:
        timezone = ZoneInfo(model.timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise _InvalidConfigError("timezone", f"unknown time zone {model.timezone!r}") from None
    if not model.types:
        raise _InvalidConfigError("types", "at least one board type is required")
    types: dict[str, BoardType] = {}
    for name, type_model in model.types.items():
        path = f"types.{name}"
        if BOARD_TYPE_RE.fullmatch(name) is None:
            raise _InvalidConfigError(
                path, f"board type name {name!r} must be 1-32 characters of a-z, 0-9 and _"
            )
        declared = type_model if type_model is not None else _TypeModel()
        types[name] = _build_type(name, declared, path, timezone)
    hot = tuple(_build_hot(index, hot_model, types) for index, hot_model in enumerate(model.hot or ()))
    seen: set[str] = set()
    for index, hot_board in enumerate(hot):
        if hot_board.board in seen:
            raise _InvalidConfigError(f"hot[{index}].board", f"board {hot_board.board!r} is listed twice")
        seen.add(hot_board.board)
    return BoardsConfig(timezone=timezone, types=MappingProxyType(types), hot=hot)


def _build_type(name: str, model: _TypeModel, path: str, tz: ZoneInfo) -> BoardType:
    if not model.windows:
        raise _InvalidConfigError(f"{path}.windows", "at least one window is required")
    named, rule = _seasons(model.seasons, f"{path}.seasons", tz)
    windows: list[Window] = []
    for index, window_name in enumerate(model.windows):
        window_path = f"{path}.windows[{index}]"
        if any(window.name == window_name for window in windows):
            raise _InvalidConfigError(window_path, f"duplicate window {window_name!r}")
        try:
            windows.append(parse_window(window_name, named, rule))
        except WindowError as exc:
            raise _InvalidConfigError(window_path, str(exc)) from None
    if model.seasons is not None and not any(w.kind is WindowKind.SEASON for w in windows):
        raise _InvalidConfigError(f"{path}.seasons", "seasons are declared but 'season' is not in windows")
    retention = _retention(model.retention, windows, path)
    late_grace_ms = _parse_duration(model.late_grace, f"{path}.late_grace")
    if late_grace_ms > MAX_LATE_GRACE_MS:
        raise _InvalidConfigError(f"{path}.late_grace", f"at most 366d, got {model.late_grace!r}")
    ends_at_ms = None
    if model.ends_at is not None:
        try:
            ends_at_ms = parse_instant(model.ends_at, tz)
        except WindowError as exc:
            raise _InvalidConfigError(f"{path}.ends_at", str(exc)) from None
    board_type = BoardType(
        name=name,
        order=Order(model.order),
        tie_break=TieBreak(model.tie_break),
        windows=tuple(windows),
        retention=MappingProxyType(retention),
        max_members=model.max_members,
        late_grace_ms=late_grace_ms,
        score_range=_score_range(model.score_range, f"{path}.score_range"),
        ends_at_ms=ends_at_ms,
        results=_results(model.period_results, windows, retention, late_grace_ms, f"{path}.period_results"),
        shards=model.shards,
        league=_league(model, windows, path),
    )
    if board_type.score_range is not None:
        _check_packing(board_type, f"{path}.score_range")
    _check_instances(board_type, f"{path}.windows")
    return board_type


def _league(model: _TypeModel, windows: list[Window], path: str) -> League | None:
    """`league:` on a type with a season window."""
    lm = model.league
    if lm is None:
        return None
    if not any(w.kind is WindowKind.SEASON for w in windows):
        raise _InvalidConfigError(f"{path}.league", "a league divides a season: add 'season' to windows")
    _league_alone(model, path)
    path = f"{path}.league"
    if not 1 <= len(lm.tiers) <= MAX_TIERS:
        raise _InvalidConfigError(f"{path}.tiers", f"expected 1 to {MAX_TIERS} tiers, lowest first")
    for index, tier in enumerate(lm.tiers):
        if TIER_RE.fullmatch(tier) is None:
            raise _InvalidConfigError(
                f"{path}.tiers[{index}]", f"tier {tier!r} must be 1-32 characters of a-z, 0-9 and _"
            )
        if tier in lm.tiers[:index]:
            raise _InvalidConfigError(f"{path}.tiers[{index}]", f"duplicate tier {tier!r}")
    entry = lm.entry_tier if lm.entry_tier is not None else lm.tiers[0]
    if entry not in lm.tiers:
        raise _InvalidConfigError(f"{path}.entry_tier", f"{entry!r} is not one of the tiers")
    size = lm.division_size
    promote = _movements(lm.promote, lm.tiers, size=size, edge=lm.tiers[-1], path=f"{path}.promote",
                         edge_why="promotes no one: it is the top tier")  # fmt: skip
    demote = _movements(lm.demote, lm.tiers, size=size, edge=lm.tiers[0], path=f"{path}.demote",
                        edge_why="demotes no one: it is the lowest tier")  # fmt: skip
    for tier in lm.tiers:
        up, down = promote.get(tier), demote.get(tier)
        if up is not None and down is not None and up.of(size) + down.of(size) > size:
            raise _InvalidConfigError(
                f"{path}.demote.{tier}",
                f"a full division of tier {tier!r} would promote and demote more members than it holds",
            )
    top = lm.rewards.top if lm.rewards is not None else 0
    if top > size:
        raise _InvalidConfigError(f"{path}.rewards.top", f"at most division_size ({size}), got {top}")
    return League(size, tuple(lm.tiers), entry, MappingProxyType(promote), MappingProxyType(demote), top)


def _league_alone(model: _TypeModel, path: str) -> None:
    """What a league type can't be combined with (declared at all, even as its default)."""
    for key, why in (
        ("tie_break", "ties in a division rank by join order"),
        ("shards", "a league's divisions are counted on one Redis slot"),
        ("max_members", "a division holds division_size members at most"),
    ):
        if key in model.model_fields_set:
            raise _InvalidConfigError(f"{path}.{key}", f"a league type can't set it: {why}")
    if model.period_results is not None and SEASON_WINDOW in model.period_results.windows:
        raise _InvalidConfigError(
            f"{path}.period_results",
            "a league's season has no period result: its divisions' standings end it",
        )


def _movements(
    declared: dict[str, int | float], tiers: list[str], *, size: int, edge: str, edge_why: str, path: str
) -> dict[str, Movement]:
    """`promote:` or `demote:`: tier -> a count (an integer) or a fraction (0 to 1) of a division."""
    out: dict[str, Movement] = {}
    for tier, value in declared.items():
        where = f"{path}.{tier}"
        if tier not in tiers:
            raise _InvalidConfigError(where, f"{tier!r} is not one of the tiers")
        if tier == edge:
            raise _InvalidConfigError(where, f"tier {tier!r} {edge_why}")
        if isinstance(value, int):
            if not 0 <= value <= size:
                raise _InvalidConfigError(where, f"a count from 0 to division_size ({size}), got {value}")
            out[tier] = Movement(count=value)
        else:
            if not 0.0 <= value <= 1.0:
                raise _InvalidConfigError(where, f"a fraction from 0 to 1, got {value}")
            out[tier] = Movement(fraction=value)
    return out


def _retention(declared: dict[str, int], windows: list[Window], path: str) -> dict[str, int]:
    """Periods kept per period window: declared, else the default of its kind."""
    periodic = {window.name: window for window in windows if window.periodic}
    limits = {name: _retention_limit(window) for name, window in periodic.items()}
    for key, periods in declared.items():
        if key not in periodic:
            reason = (
                f"window {key!r} is not in this type's windows"
                if key in DEFAULT_RETENTION
                else f"{key!r} is not a period window (retention applies to calendar, fixed-length, "
                "season and rolling windows)"
            )
            raise _InvalidConfigError(f"{path}.retention.{key}", reason)
        if periods > limits[key]:
            reason = f"at most {limits[key]} periods, got {periods}"
            raise _InvalidConfigError(f"{path}.retention.{key}", reason)
    out = {}
    for name, window in periodic.items():
        if window.kind is WindowKind.FIXED:
            assert window.minutes is not None
            default = DEFAULT_FIXED_RETENTION_DAYS * DAY_MINUTES // window.minutes
        elif window.kind is WindowKind.ROLLING:
            default = DEFAULT_ROLLING_RETENTION
        else:
            default = DEFAULT_RETENTION[window.kind.value]
        out[name] = declared.get(name, default)
    return out


def _results(
    model: _ResultsModel | None, windows: list[Window], retention: Mapping[str, int], grace_ms: int, path: str
) -> PeriodResults | None:
    """A result is read after its period closed and its late grace passed: the period must still
    be kept then (retention counts the periods after it: one more period is one period's time)."""
    if model is None:
        return None
    if not model.windows:
        raise _InvalidConfigError(f"{path}.windows", "at least one window is required (omit the key: none)")
    by_name = {window.name: window for window in windows}
    for index, name in enumerate(model.windows):
        where = f"{path}.windows[{index}]"
        window = by_name.get(name)
        if window is None:
            raise _InvalidConfigError(where, f"window {name!r} is not in this type's windows")
        if not window.periodic:
            raise _InvalidConfigError(where, f"window {name!r} has no periods to close")
        if name in model.windows[:index]:
            raise _InvalidConfigError(where, f"duplicate window {name!r}")
        kept_after_ms = (retention[name] - 1) * _shortest_period_ms(window)
        if kept_after_ms <= grace_ms + RESULT_SETTLE_MS + RESULT_MARGIN_MS:
            raise _InvalidConfigError(
                where,
                f"window {name!r} keeps a closed period for {retention[name] - 1} more period(s), not "
                "a minute past its late_grace: its result could not be read; raise its retention",
            )
    return PeriodResults(frozenset(model.windows), model.top)


def _shortest_period_ms(window: Window) -> int:
    """The shortest any period of the window lasts (DST changes included)."""
    if window.kind is WindowKind.FIXED:
        assert window.minutes is not None
        return window.minutes * 60_000 // 2  # a DST change may cut a fixed period short
    if window.kind is WindowKind.SEASON:
        if window.rule is not None:
            return window.rule.every_days * SHORTEST_BUCKET_MS["d"]
        return min(season.end_ms - season.start_ms for season in window.seasons)
    if window.kind is WindowKind.YEAR:
        return 365 * SHORTEST_BUCKET_MS["d"]
    kind = window.calendar_kind
    unit = {WindowKind.HOUR: "h", WindowKind.DAY: "d", WindowKind.WEEK: "w", WindowKind.MONTH: "m"}
    assert kind is not None
    return SHORTEST_BUCKET_MS[unit[kind]]


def _retention_limit(window: Window) -> int:
    if window.kind is WindowKind.FIXED:
        assert window.minutes is not None
        return MAX_FIXED_RETENTION_DAYS * DAY_MINUTES // window.minutes
    kind = window.calendar_kind or window.kind  # a rolling window: as many as its unit's calendar window
    return MAX_RETENTION[kind.value]


def _seasons(
    model: list[_SeasonModel] | _SeasonRuleModel | None, path: str, tz: ZoneInfo
) -> tuple[tuple[Season, ...], SeasonRule | None]:
    if model is None:
        return (), None
    try:
        if isinstance(model, _SeasonRuleModel):
            return (), SeasonRule(model.every_days, parse_anchor(model.anchor))
        named = []
        for index, season in enumerate(model):
            try:
                start, end = parse_instant(season.start, tz), parse_instant(season.end, tz)
            except WindowError as exc:
                raise WindowError(f"[{index}]: {exc}") from None
            named.append(Season(season.name, start, end))
        return check_seasons(named), None
    except WindowError as exc:
        text = str(exc)
        sub, _, reason = text.partition(": ") if text.startswith("[") else ("", "", text)
        raise _InvalidConfigError(path + sub, reason) from None


def _score_range(values: list[int] | None, path: str) -> tuple[int, int] | None:
    if values is None:
        return None
    if len(values) != 2 or values[0] >= values[1]:
        raise _InvalidConfigError(path, f"expected [min, max] with min < max, got {values}")
    low, high = values
    if max(abs(low), abs(high)) > _EXACT_INTEGER:
        raise _InvalidConfigError(path, f"scores are exact up to +/-(2^53 - 1), got {values}")
    return low, high


def _check_instances(board_type: BoardType, path: str) -> None:
    """One event's instances fit one apply.lua call: a rolling window counts its bucket, the
    current and next periods, what the next one reads (3) and each closed period its late grace
    keeps open (worker/rolling_slots.py)."""
    count = 0
    for window in board_type.windows:
        if window.kind is not WindowKind.ROLLING:
            count += 1
            continue
        assert window.rolling_unit is not None
        closed = -(-board_type.late_grace_ms // SHORTEST_BUCKET_MS[window.rolling_unit]) + 1
        count += 6 + min(closed, board_type.retention[window.name])
    if count > MAX_INSTANCES_PER_CALL:
        raise _InvalidConfigError(
            path,
            f"an event of this type may count in {count} window instances, more than one call holds "
            f"({MAX_INSTANCES_PER_CALL}): fewer rolling windows, or a shorter late_grace or retention",
        )


def _check_packing(board_type: BoardType, path: str) -> None:
    """A declared range must leave room for the tie of every calendar window in 53 bits."""
    assert board_type.score_range is not None
    for window in board_type.windows:
        bits = tie_bits(longest_period_ms(window), board_type.tie_break is not TieBreak.NONE)
        if window.periodic and bits is not None and not packable(board_type.score_range, bits):
            low, high = packable_bounds(bits)
            raise _InvalidConfigError(
                path,
                f"window {window.name!r} keeps {bits} bits of tie time beside the score, which leaves "
                f"[{low}, {high}] for scores within 53 bits; got {list(board_type.score_range)}",
            )


def _parse_duration(text: str, path: str) -> int:
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise _InvalidConfigError(
            path, f"invalid duration {text!r} (expected e.g. 500ms, 30s, 10m, 2h or 1d)"
        )
    return int(match[1]) * _DURATION_MS[match[2]]


def _build_hot(index: int, model: _HotModel, types: Mapping[str, BoardType]) -> HotBoard:
    path = f"hot[{index}]"
    parts = split_board(model.board)
    if parts is None:
        raise _InvalidConfigError(
            f"{path}.board",
            f"invalid board id {model.board!r} (expected <type> or <type>:<scope>, "
            "type [a-z0-9_]{1,32}, scope [A-Za-z0-9_.:-]{1,160})",
        )
    board_type = types.get(parts[0], types.get(DEFAULT_TYPE))
    if board_type is None:
        raise _InvalidConfigError(f"{path}.board", f"board type {parts[0]!r} is not configured")
    if model.windows is None:
        return HotBoard(board=model.board, windows=tuple(window.name for window in board_type.windows))
    if not model.windows:
        raise _InvalidConfigError(f"{path}.windows", "at least one window is required (omit the key for all)")
    known = [window.name for window in board_type.windows]
    for position, window_name in enumerate(model.windows):
        window_path = f"{path}.windows[{position}]"
        if window_name not in known:
            raise _InvalidConfigError(
                window_path,
                f"window {window_name!r} is not a window of board type {board_type.name!r} "
                f"({', '.join(known)})",
            )
        if window_name in model.windows[:position]:
            raise _InvalidConfigError(window_path, f"duplicate window {window_name!r}")
    return HotBoard(board=model.board, windows=tuple(model.windows))
