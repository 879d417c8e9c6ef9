"""docs/configuration.md is what the settings model renders, and every setting is explained."""

from __future__ import annotations

import pytest

from common.settings import Settings, env_name
from common.settings_doc import DOC_PATH, REGENERATE, render, table_fields


def test_configuration_doc_is_rendered_from_the_model() -> None:
    written = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert written == render(), f"docs/configuration.md is stale: regenerate with `{REGENERATE}`"


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_has_a_description(name: str) -> None:
    description = Settings.model_fields[name].description
    assert description, f"Settings.{name} has no description (Field(description=...))"
    assert description.strip() == description


def test_every_setting_has_a_row_in_model_order() -> None:
    rendered = render()
    positions = [rendered.index(f"| `{env_name(name)}` |") for name, _ in table_fields()]
    assert positions == sorted(positions)
    assert len(table_fields()) == len(Settings.model_fields) - 1  # all but the pass-through mapping


def test_render_is_stable_and_ascii() -> None:
    first = render()
    assert first == render()
    assert first.isascii()  # `> docs/configuration.md` writes it in whatever encoding stdout has
