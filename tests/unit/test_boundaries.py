"""The tests' calendar boundaries (tests/boundaries.py): the session's zone puts a local midnight
on the chosen instant, for every UTC hour; spans report the boundaries they cross."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tests.boundaries import HOUR_MS, assert_crosses, crossed, zone_with_midnight_at


@pytest.mark.parametrize("hour", range(24))
def test_the_zone_chosen_for_an_hour_has_its_midnight_there(hour: int) -> None:
    at = int(datetime(2026, 11, 27, hour, tzinfo=UTC).timestamp() * 1000)
    local = datetime.fromtimestamp(at / 1000, ZoneInfo(zone_with_midnight_at(at)))
    assert (local.hour, local.minute) == (0, 0)
    before = datetime.fromtimestamp((at - 1) / 1000, ZoneInfo(zone_with_midnight_at(at)))
    assert before.date() < local.date()


def test_a_span_reports_the_boundaries_it_crosses() -> None:
    tz = ZoneInfo("America/New_York")

    def ms(text: str) -> int:
        return int(datetime.fromisoformat(text).replace(tzinfo=tz).timestamp() * 1000)

    assert crossed(tz, ms("2027-11-03T10:00"), ms("2027-11-03T23:59")) == set()
    assert crossed(tz, ms("2027-11-03T23:00"), ms("2027-11-04T00:00")) == {"day"}  # (low, high]
    assert crossed(tz, ms("2027-11-04T00:00"), ms("2027-11-04T05:00")) == set()
    assert crossed(tz, ms("2027-10-31T20:00"), ms("2027-11-01T01:00")) == {"day", "week", "month"}
    assert_crosses("a day", tz, [ms("2027-11-03T23:00"), ms("2027-11-04T01:00")], ("day",))
    with pytest.raises(AssertionError, match=r"cross no \['week'\] boundary"):
        assert_crosses("a day", tz, [ms("2027-11-03T23:00"), ms("2027-11-04T01:00")], ("day", "week"))


def test_the_choice_must_be_an_exact_hour() -> None:
    with pytest.raises(AssertionError, match="not an exact UTC hour"):
        zone_with_midnight_at(HOUR_MS + 1)
