"""The documentation holds together: every relative link and anchor in README, CONTRIBUTING,
CHANGELOG and docs/ resolves, every `rankstream <command>` they name exists, and every
`RANKSTREAM_*` variable they name is a setting, a librdkafka pass-through, or a knob the tests
or benchmarks read."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from common.settings import KAFKA_PASSTHROUGH_PREFIX, Settings, env_name
from common.store.scripts import load_script
from rankstream.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md")]
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
ENV_NAME = re.compile(r"\bRANKSTREAM_[A-Z0-9_]+")
# variables that are not settings, each with the file that reads it (checked, so this cannot rot)
KNOBS = {
    "RANKSTREAM_TEST_KAFKA": "tests/conftest.py",
    "RANKSTREAM_TEST_REDIS": "tests/conftest.py",
    "RANKSTREAM_TEST_REDIS_CLUSTER": "tests/conftest.py",
    "RANKSTREAM_TEST_BOUNDARY_MS": "tests/boundaries.py",
    "RANKSTREAM_TEST_BOARD_MEMBERS": "tests/integration/test_rolling_boundary.py",
    "RANKSTREAM_REDIS_ULR": "tests/unit/test_settings.py",  # the docs' example of a refused typo
    "RANKSTREAM_BENCH_SCALE_CASES": "bench/scale/__init__.py",
    "RANKSTREAM_BENCH_SCALE_PARTS": "bench/scale/__init__.py",
}


def _text(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces `-`."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _text(page).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def test_the_pages_exist() -> None:
    assert (ROOT / "docs" / "contract.md").is_file()
    assert len(PAGES) > 15


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


def test_every_command_named_exists() -> None:
    action = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert isinstance(action, argparse._SubParsersAction)
    choices = set(action.choices)
    named = {
        (page.name, m.group(1))
        for page in PAGES
        for code in CODE.findall(page.read_text())
        for m in re.finditer(r"^rankstream ([a-z][a-z-]*)", code)
    }
    assert named, "no command found: the pattern is wrong"
    assert {n for n in named if n[1] not in choices} == set()


def test_every_variable_named_exists() -> None:
    settings = {env_name(name) for name in Settings.model_fields}
    for name, reader in KNOBS.items():
        assert name in (ROOT / reader).read_text(), (name, reader)
    named = {(page.name, v) for page in PAGES for v in ENV_NAME.findall(page.read_text())}
    unknown = {
        (page, v)
        for page, v in named
        if v not in settings
        and v not in KNOBS
        and not v.startswith(KAFKA_PASSTHROUGH_PREFIX)
        and not (v.endswith("_") and any(s.startswith(v) for s in settings | set(KNOBS)))  # a prefix
    }
    assert {v for _, v in named} >= {"RANKSTREAM_REDIS_URL", "RANKSTREAM_ID_WINDOW_S"}
    assert unknown == set()


def test_slug_follows_github() -> None:
    assert slug(" 2. The update event (topic `update_rank`)") == "2-the-update-event-topic-update_rank"
    assert slug(" Period results (`rank_period_closed`)") == "period-results-rank_period_closed"


METRIC = re.compile(r"\brankstream_(?:worker|api)_[a-z_]+")


def test_the_metrics_page_names_every_metric_and_no_other() -> None:
    """Every metric the worker and the API expose is on docs/operations/metrics.md by the name
    Prometheus shows (a counter with its `_total`, a gauge or histogram without), and every one
    the docs name exists."""
    defined = re.compile(
        r'(Counter|Gauge|Histogram)(?:MetricFamily)?\(\s*"(rankstream_(?:worker|api)_[a-z_]+)"'
    )
    exposed = {
        name + "_total" * (kind == "Counter")
        for folder in ("worker", "api")
        for source in (ROOT / folder).glob("*.py")
        for kind, name in defined.findall(source.read_text())
    }
    assert {"rankstream_worker_events_total", "rankstream_worker_state_cells"} <= exposed
    listed = set(METRIC.findall((ROOT / "docs" / "operations" / "metrics.md").read_text()))
    assert listed == exposed
    named = {m for page in PAGES for m in METRIC.findall(page.read_text())}
    assert named - exposed == set()


def _documented_rights() -> dict[str, set[str]]:
    """Each documented Redis user's allowed commands (docs/operations/requirements.md)."""
    page = (ROOT / "docs" / "operations" / "requirements.md").read_text()
    lines = [line.split() for line in page.splitlines() if line.startswith("ACL SETUSER ")]
    return {words[2]: {w[1:].lower() for w in words if w.startswith("+")} for words in lines}


def _called(source: str) -> set[str]:
    return {
        name.lower()
        for first in re.findall(r"redis\.p?call\(([^,)]+)", source)  # the command argument
        for name in re.findall(r"['\"]([A-Z]+)['\"]", first)  # `x and 'HLEN' or 'ZCARD'` too
    }


def test_the_documented_redis_users_may_run_every_command_of_their_scripts() -> None:
    """docs/operations/requirements.md's ACL lines allow every command a Lua script calls: the
    worker's and the commands' users every script's, the API's those of the scripts it runs
    (the read-only ones and promote.lua). The Python side's commands are checked against a real
    Redis: tests/integration/test_redis_acl.py."""
    rights = _documented_rights()
    scripts = {
        path.stem: load_script(path.stem) for path in (ROOT / "common" / "store" / "lua").glob("*.lua")
    }
    called = set().union(*(_called(script.source) for script in scripts.values()))
    # named by a variable: only guarded.lua's, which runs the commands of the worker's decided
    # writes (those the integration test above meets, as the worker sends them)
    unnamed = [
        (path.name, first)
        for path in (ROOT / "common" / "store" / "lua").glob("*.lua")
        for first in re.findall(r"redis\.p?call\(([^,)]+)", path.read_text())
        if not re.search(r"['\"]", first)
    ]
    assert unnamed == [("guarded.lua", "ARGV[at + 2]")]
    assert {"zadd", "hset", "publish"} <= called
    for user in ("rankstream-worker", "rankstream-admin"):
        assert called - rights[user] == set(), user
    read_only = {name for name, script in scripts.items() if script.command == "EVALSHA_RO"}
    assert {"top", "locate", "statepage", "packedpage", "ahead"} <= read_only
    # their own files' commands (the libraries they include also hold writes they never call:
    # EVALSHA_RO would refuse one, and the integration test runs them as the API's user)
    lua = ROOT / "common" / "store" / "lua"
    api_runs = set().union(*(_called((lua / f"{name}.lua").read_text()) for name in (*read_only, "promote")))
    assert api_runs - rights["rankstream-api"] == set()
    assert {"evalsha_ro", "evalsha"} <= rights["rankstream-api"]
