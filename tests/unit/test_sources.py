"""worker/sources.py's verdict: may a partition be applied onto what Redis holds?"""

from __future__ import annotations

import pytest

from worker.apply import Source
from worker.sources import _Partition, judge, stored_position


def part(committed: int, metadata: str | None) -> _Partition:
    return _Partition(Source("update_rank", 3, "tid", committed), metadata)


@pytest.mark.parametrize(
    ("committed", "metadata", "stored", "verdict"),
    [
        (-1, None, None, None),  # nothing committed yet: a fresh partition
        (41, "E1", 41, None),  # Redis holds everything committed
        (41, "E1", 45, None),  # and more (a batch applied, its commit lost: fences skip it)
        (41, None, None, None),  # the previous release's commits: adopted
        (41, "E1", 40, "redis_behind"),  # a restored backup, or writes lost
        (41, "E1", None, "redis_behind"),  # the group applied into this epoch, Redis never saw it
        (41, "E9", 41, "epoch_mismatch"),  # another data set than the group applied into
    ],
)
def test_judge(committed: int, metadata: str | None, stored: int | None, verdict: str | None) -> None:
    got = judge(3, part(committed, metadata), "E1", stored)
    assert (got.reason if got else None) == verdict
    if got is not None:
        assert got.partition == 3 and got.detail


def test_a_record_of_another_topic_id_is_no_record() -> None:
    assert stored_position(b"tid|17", "tid") == 17
    assert stored_position(b"old|17", "tid") is None
    assert stored_position(None, "tid") is None
