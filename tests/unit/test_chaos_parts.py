"""The chaos suite's own parts that judge a run: the soak's boards and members, the model's
counts the cost model is applied to, the soak's flatness measure, and the fuzzing verdict (each
shown to fail on what it must catch)."""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

from chaos.config import SOAK_BOARDS, SOAK_MEMBERS, soak_member
from chaos.fuzz import STEERED, FuzzReport, judge, steered
from chaos.model import Model
from chaos.scenarios import _flat
from chaos.stream import Stream
from rankstream.topics import UPDATE_PARTITIONS

NOW = 1_796_000_000_000


def test_the_soak_boards_take_one_partition_each():
    partitions = sorted(zlib.crc32(board.encode()) % UPDATE_PARTITIONS for board in SOAK_BOARDS)
    assert partitions == list(range(UPDATE_PARTITIONS))


def test_a_big_board_gives_each_member_its_first_event_in_turn():
    stream = Stream(3, NOW, SOAK_BOARDS[:1])
    members = [stream._member(SOAK_BOARDS[0]) for _ in range(SOAK_MEMBERS + 50)]
    assert members[:SOAK_MEMBERS] == [soak_member(i) for i in range(SOAK_MEMBERS)]
    assert set(members[SOAK_MEMBERS:]) <= set(members[:SOAK_MEMBERS])
    assert {len(m) for m in members} == {24}  # as the cost model's benchmark names them


def test_the_model_counts_members_over_windows_and_the_ids_of_a_window():
    model = Model(NOW)
    for i, member in enumerate(["a", "b", "a"]):
        event = {"id": f"e{i}", "board": SOAK_BOARDS[0], "member": member, "score": 1}
        model.apply(event, NOW + i * 1000, 0, i, None)
    model.apply({"id": "e0", "board": SOAK_BOARDS[0], "member": "c", "score": 1}, NOW + 5000, 0, 3, None)
    assert model.member_windows() == 2 * 3  # two members in total, day and week
    assert model.ids_applied_since(NOW + 1000) == 2  # e1 and e2; e0 was applied before, then repeated
    assert model.ids_applied_since(NOW) == 3


def test_flatness_is_drift_between_the_first_and_last_quarters_after_the_warm_up():
    flat = [100, 101, 100, 130, 100, 101, 102, 101]  # one busy moment: a peak, no drift
    growing = [100, 101, 102, 103, 104, 105, 106, 107]
    warming = [50, 60, *flat]
    expected = {"w": (101.5 / 100.5, 130 / 100.5)}  # quarters of two samples: their medians
    assert _flat([(float(i), {"w": v}, 0) for i, v in enumerate(flat)], 0.0) == expected
    assert _flat([(float(i), {"w": v}, 0) for i, v in enumerate(growing)], 0.0)["w"][0] == 106.5 / 100.5
    assert _flat([(float(i), {"w": v}, 0) for i, v in enumerate(warming)], 2.0) == expected


def _report(label: str, cases: int, **statuses: int) -> FuzzReport:
    return FuzzReport(label, cases, 0, Counter({k.lstrip("s"): v for k, v in statuses.items()}))


def test_the_fuzzing_verdict_fails_on_each_thing_it_holds_a_run_to():
    opened = [_report("open", 120, s200=80, s400=40)]
    token = [_report("token", 60, s200=5, s429=55)]
    none = [_report("none", 60, s401=60)]
    assert judge(opened, token, none, 100) == []
    assert judge([_report("open", 120, s200=80, s500=1)], token, none, 100) == ["1 answers were 5xx"]
    assert judge(opened, [_report("token", 60, s200=60)], none, 100) == [
        "no 429 with a token past the rate limit"
    ]
    assert judge(opened, token, [_report("none", 60, s200=60)], 100) == ["no 401 without a token"]
    assert judge(opened, [_report("token", 60, s429=60)], none, 100) == ["no 200 with a token"]
    assert judge(opened, token, none, 200)[0].startswith("fewer than 200 cases")
    failing = FuzzReport("open", 120, 1, Counter({"200": 120}), "a body off its schema")
    assert judge([failing], token, none, 100) == ["open: a body off its schema"]


def test_steering_draws_the_boards_members_and_windows_from_the_run():
    spec: dict[str, Any] = {
        "components": {
            "parameters": {n: {"schema": {"type": "string"}} for n in ("board", "member", "window")}
        },
        "paths": {"/x/{tier}": {"get": {"parameters": [{"name": "tier", "in": "path", "schema": {}}]}}},
    }
    out = steered(spec)
    assert out["components"]["parameters"]["board"]["schema"]["enum"] == STEERED["board"]
    assert out["paths"]["/x/{tier}"]["get"]["parameters"][0]["schema"]["enum"] == STEERED["tier"]
    assert spec["components"]["parameters"]["board"]["schema"] == {"type": "string"}  # a copy
