"""The chaos suite's short profile (`make chaos` runs the full one): two of its scenarios, each on
servers and processes of its own, must end exactly as the model says: a worker killed with -9
while the stream flows, and an API node restarted under load (503 until it holds every hot
board, then the same answers as the model)."""

from __future__ import annotations

import pytest

from chaos.scenarios import PROFILES, run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("scenario", ["worker-kill", "api-restart"])
def test_short_chaos_scenario_ends_exact(scenario, tmp_path):
    outcome = run_scenario(scenario, PROFILES["short"], seed=11, folder=tmp_path)
    row = outcome.row()
    assert row["passed"] and row["exact"], row["problems"]
    assert (row["lost"], row["doubled"], row["wrong"]) == (0, 0, 0)
    assert row["faults"] >= 1 and row["events"] > 3_000 and row["dead_letters"] > 50
    assert row["answers_compared"] > 200 and row["results"] >= 1
