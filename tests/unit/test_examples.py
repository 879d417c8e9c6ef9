"""The producer examples (examples/) and what the docs say of them agree: every code excerpt in
docs/producing.md's "Producer examples" is in its program as shown, the versions named are the
ones the build files pin, and the Java client is the broker's version. (They run against a real
broker in tests/integration/test_producers.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankstream.stack import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROGRAMS = {
    "python": EXAMPLES / "python" / "produce.py",
    "go": EXAMPLES / "go" / "main.go",
    "java": EXAMPLES / "java" / "src" / "main" / "java" / "example" / "Produce.java",
}
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _contains(whole: list[str], part: list[str]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_every_excerpt_in_the_docs_is_in_its_program() -> None:
    blocks = BLOCK.findall(_section(ROOT / "docs" / "producing.md", "Producer examples"))
    assert {language for language, _ in blocks} == set(PROGRAMS)
    for language, code in blocks:
        program = PROGRAMS[language]
        # line by line, indentation aside: an excerpt leaves out what surrounds it
        assert _contains(_lines(program.read_text()), _lines(code)), (program.name, code)


def test_the_docs_name_the_versions_the_build_files_pin() -> None:
    go_mod = (EXAMPLES / "go" / "go.mod").read_text()
    franz = re.search(r"^require github.com/twmb/franz-go (v[\d.]+)$", go_mod, re.M)
    go = re.search(r"^go (\d+\.\d+)", go_mod, re.M)
    pom = (EXAMPLES / "java" / "pom.xml").read_text()
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert franz and go and kafka
    # the client of the broker the local stack and the tests run
    assert kafka[1] == KAFKA_VERSION
    for page in (ROOT / "docs" / "producing.md", EXAMPLES / "README.md"):
        text = page.read_text()
        assert f"franz-go {franz[1]}" in text and f"Go ≥ {go[1]}" in text, page
        assert f"kafka-clients {kafka[1]}" in text, page


@pytest.mark.parametrize("name", ["go.mod", "go.sum"])
def test_the_go_example_pins_its_modules(name: str) -> None:
    """go.sum is committed: a fresh clone builds with the module checksums it was tested with."""
    text = (EXAMPLES / "go" / name).read_text()
    assert "github.com/twmb/franz-go" in text
