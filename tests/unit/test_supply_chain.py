"""The supply chain: requirements.lock pins, with hashes, a version of every dependency
pyproject.toml names that its range allows (so an edit of one without `make lock` fails here),
and `make audit` (.ci/audit.py) fails on an advisory, passes on none, and says when nothing
could be audited."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)(?: ;[^\\\n]*)? \\$", re.M)  # name==version [; marker] \\


def pins() -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in PIN.findall((ROOT / "requirements.lock").read_text())}


def test_every_dependency_is_pinned_within_its_range_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = pins()
    for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        wanted = Requirement(line)
        name = canonicalize_name(wanted.name)
        assert name in locked, f"{wanted.name} is not in requirements.lock: run `make lock`"
        assert wanted.specifier.contains(locked[name], prereleases=True), (line, locked[name])
    # each pin carries at least one hash (pip then refuses anything else: --require-hashes)
    blocks = re.split(r"\n(?=[A-Za-z0-9_.\-]+==)", (ROOT / "requirements.lock").read_text())
    pinned = [b for b in blocks if PIN.match(b.split("\n", 1)[0] + "\n")]
    assert len(pinned) == len(locked)
    assert [b.split("\n", 1)[0] for b in pinned if "--hash=sha256:" not in b] == []


def _audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_audit", ROOT / ".ci" / "audit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("report", "code", "says"),
    [
        ({"dependencies": [{"name": "aiohttp", "version": "3.14.5", "vulns": []}]}, 0, "1 locked packages"),
        (
            {"dependencies": [{"name": "aiohttp", "version": "3.9.0",
                               "vulns": [{"id": "GHSA-xxxx", "fix_versions": ["3.9.4"]}]}]},
            1,
            "GHSA-xxxx in aiohttp 3.9.0 (fixed in: 3.9.4)",
        ),
        (
            {"dependencies": [{"name": "aiohttp", "version": "3.14.5", "skip_reason": "not found"}]},
            3,
            "unreachable",
        ),
    ],
    ids=["clean", "an advisory", "nothing audited"],
)  # fmt: skip
def test_the_audit_fails_on_an_advisory_and_says_when_nothing_was_audited(
    report: dict[str, Any], code: int, says: str
) -> None:
    found, lines = _audit().verdict(report)
    assert found == code and says in lines[0]


def test_the_ignore_list_takes_dated_reasons_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    audit = _audit()
    listed = tmp_path / "audit-ignore"
    monkeypatch.setattr(audit, "IGNORE", listed)
    listed.write_text("# a comment\nGHSA-aaaa 2026-11-29 the affected parser is never called\n")
    assert audit.ignored() == ["GHSA-aaaa"]
    listed.write_text("GHSA-bbbb because\n")  # no date
    with pytest.raises(SystemExit, match="is not '<id> <YYYY-MM-DD> <reason>'"):
        audit.ignored()
