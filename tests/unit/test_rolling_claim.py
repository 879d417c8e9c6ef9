"""When the rolling preparer claims a board's next period (worker/rolling.py claim_lead_ms)."""

from __future__ import annotations

import pytest

from worker.rolling import claim_lead_ms

HOUR, DAY = 3_600_000, 86_400_000


@pytest.mark.parametrize(
    ("bucket_ms", "members", "lead_ms"),
    [
        (HOUR, 0, 180_000),  # a twentieth of the bucket at least
        (HOUR, 20_000, 180_000),  # a walk of 1.4 s, four times over: still the twentieth
        (HOUR, 1_000_000, 280_000),  # 70 s of walk, four times over
        (HOUR, 10_000_000, 900_000),  # never earlier than the bucket's last quarter
        (DAY, 1_000_000, 4_320_000),
    ],
)
def test_the_claim_comes_late_in_the_bucket_earlier_for_a_longer_walk(
    bucket_ms: int, members: int, lead_ms: int
) -> None:
    assert claim_lead_ms(bucket_ms, members) == lead_ms
