"""The hot board under test, its two board configs, and where the hot benchmark's files go."""

from __future__ import annotations

from bench.common import REPO

FOLDER = REPO / ".stack" / "bench" / "hot"
BOARD = "gift:hot"
HOT_YAML = (
    f'timezone: UTC\ntypes:\n  gift: {{windows: [total]}}\nhot:\n  - {{board: "{BOARD}", windows: [total]}}\n'
)
COLD_YAML = "timezone: UTC\ntypes:\n  gift: {windows: [total]}\n"
