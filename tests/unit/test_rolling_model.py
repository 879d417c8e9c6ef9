"""The rolling-window model (tests/rolling_model.py) against hand-worked cases: bucket ids and
spans across New York's DST changes, ISO weeks at a year's end, month lengths, and small event
sequences whose periods were computed by hand."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.period_model import instant
from tests.rolling_model import HOUR, MINUTE, BoardType, Model

NY = ZoneInfo("America/New_York")
TYPES = {
    "g": BoardType("g", ("total", "last_3h", "last_2d"), order="desc", tie="first"),
    "h": BoardType("h", ("last_2d", "last_1w"), order="asc", tie="last"),
    "n": BoardType("n", ("last_1h",), order="desc", tie="none"),
}


def at(text: str) -> int:
    return instant(text, NY)


@pytest.fixture(scope="module")
def calendar() -> Model:
    return Model(NY, at("2025-12-01T00:00"), at("2028-06-01T00:00"), TYPES)


def span(model: Model, window: str, period: str) -> tuple[int, int]:
    found = model.span(window, period)
    return found.start, found.end


def utc(text: str) -> int:
    return instant(text + "+00:00", NY)


def test_spring_forward_skips_an_hour_and_shortens_the_day(calendar: Model) -> None:
    assert calendar.current("last_3h", utc("2026-03-08T06:59")) == "2026-03-08T01"
    assert calendar.current("last_3h", utc("2026-03-08T07:00")) == "2026-03-08T03"  # 03:00 EDT
    assert "2026-03-08T02" not in calendar.buckets["h"].index
    assert calendar.previous("last_3h", "2026-03-08T03") == "2026-03-08T01"
    assert span(calendar, "last_3h", "2026-03-08T01") == (utc("2026-03-08T06:00"), utc("2026-03-08T07:00"))
    start, end = span(calendar, "last_2d", "2026-03-08")
    assert (start, end) == (utc("2026-03-08T05:00"), utc("2026-03-09T04:00"))
    assert end - start == 23 * HOUR
    assert [b.id for b in calendar.window_buckets("last_3h", "2026-03-08T04")] == [
        "2026-03-08T01",
        "2026-03-08T03",
        "2026-03-08T04",
    ]


def test_fall_back_repeats_an_hour_as_one_bucket_and_lengthens_the_day(calendar: Model) -> None:
    first, second = utc("2026-11-01T05:30"), utc("2026-11-01T06:30")  # 01:30 EDT, 01:30 EST
    assert calendar.current("last_3h", first) == calendar.current("last_3h", second) == "2026-11-01T01"
    assert span(calendar, "last_3h", "2026-11-01T01") == (utc("2026-11-01T05:00"), utc("2026-11-01T07:00"))
    assert calendar.current("last_3h", utc("2026-11-01T07:00")) == "2026-11-01T02"
    assert calendar.previous("last_3h", "2026-11-01T02") == "2026-11-01T01"
    assert calendar.previous("last_3h", "2026-11-01T01") == "2026-11-01T00"
    start, end = span(calendar, "last_2d", "2026-11-01")
    assert (start, end) == (utc("2026-11-01T04:00"), utc("2026-11-02T05:00"))
    assert end - start == 25 * HOUR
    # the month changes at local midnight, before the clocks go back
    assert calendar.current("last_2d", utc("2026-11-01T03:59")) == "2026-10-31"
    assert calendar.buckets["m"].bucket_at(utc("2026-11-01T03:59")).id == "2026-10"
    assert calendar.buckets["m"].bucket_at(utc("2026-11-01T04:00")).id == "2026-11"


def test_iso_weeks_at_the_end_of_a_year(calendar: Model) -> None:
    weeks = calendar.buckets["w"]
    assert weeks.bucket_at(at("2026-12-31T12:00")).id == "2026-W53"  # 2026 starts on a Thursday
    assert weeks.bucket_at(at("2027-01-03T23:59")).id == "2026-W53"
    assert weeks.bucket_at(at("2027-01-04T00:00")).id == "2027-W01"
    assert weeks.bucket_at(at("2026-01-01T00:00")).id == "2026-W01"
    assert weeks.bucket_at(at("2025-12-29T00:00")).id == "2026-W01"
    w53 = weeks[weeks.find("2026-W53")]
    assert (w53.start, w53.end) == (at("2026-12-28T00:00"), at("2027-01-04T00:00"))
    assert calendar.shift("last_1w", "2026-W53", 1) == "2027-W01"
    assert calendar.shift("last_1w", "2026-W52", 1) == "2026-W53"
    # the week of the fall-back change lasts an hour longer
    w44 = weeks[weeks.find("2026-W44")]
    assert w44.end - w44.start == 7 * 24 * HOUR + HOUR


@pytest.mark.parametrize(
    ("month", "hours"),
    [
        ("2026-02", 28 * 24),
        ("2028-02", 29 * 24),
        ("2026-03", 31 * 24 - 1),  # spring forward
        ("2026-04", 30 * 24),
        ("2026-11", 30 * 24 + 1),  # fall back
        ("2026-12", 31 * 24),
    ],
)
def test_month_lengths(calendar: Model, month: str, hours: int) -> None:
    months = calendar.buckets["m"]
    found = months[months.find(month)]
    assert found.end - found.start == hours * HOUR
    assert months[months.find(month) + 1].start == found.end


class Feed:
    """Applies events to a model with the clock at each event's own time unless told."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.ids = 0

    def __call__(self, board: str, op: str, member: str, score: float, ts: str, *, now: str = "") -> None:
        self.ids += 1
        event: dict[str, Any] = {"id": f"e{self.ids}", "board": board, "member": member, "op": op}
        if op != "delete":
            event["score"] = score
        assert self.model.apply(event, at(ts), at(now or ts))


def scores(model: Model, board: str, window: str, period: str) -> list[tuple[str, float, str]]:
    """(member, score, tie as local HH:MM) best first."""
    out = []
    for item in model.ranking(board, window, period):
        local = model.buckets["h"].bucket_at(item.tie)
        minutes = (item.tie - local.start) // MINUTE
        out.append((item.member, item.score, f"{local.id[-2:]}:{minutes:02d}"))
    return out


def test_incr_set_best_late_and_delete_in_hour_buckets() -> None:
    model = Model(NY, at("2026-05-01T00:00"), at("2026-08-01T00:00"), TYPES)
    feed, board = Feed(model), "g:x"
    feed(board, "incr", "a", 5, "2026-06-10T10:05")
    feed(board, "incr", "b", 3, "2026-06-10T10:20")
    feed(board, "incr", "a", 2, "2026-06-10T11:00")
    feed(board, "set", "b", 10, "2026-06-10T11:30")  # b's 11:00 bucket: 10
    feed(board, "best", "a", 4, "2026-06-10T11:40")  # a's 11:00 bucket: max(2, 4)
    feed(board, "best", "c", 7, "2026-06-10T12:10")
    feed(board, "incr", "b", 1, "2026-06-10T12:15")
    feed(board, "best", "c", 6, "2026-06-10T12:20")  # no better, but the latest event
    t12, t13 = "2026-06-10T12", "2026-06-10T13"
    assert model.current("last_3h", at("2026-06-10T12:30")) == t12
    assert scores(model, board, "last_3h", t12) == [("b", 14, "12:15"), ("a", 9, "11:40"), ("c", 7, "12:20")]
    # the next period (prepared ahead) drops the 10:00 bucket
    assert scores(model, board, "last_3h", t13) == [("b", 11, "12:15"), ("c", 7, "12:20"), ("a", 4, "11:40")]
    # the previous one closed at 12:00 and took events until 12:10
    assert scores(model, board, "last_3h", "2026-06-10T11") == [("b", 13, "11:30"), ("a", 9, "11:40")]
    now = at("2026-06-10T12:30")
    assert model.trend(board, "last_3h", t12, now) == {"b": 1, "a": 2}
    assert model.top(board, "last_3h", t12, now, trend=True) == [
        {"rank": 1, "member": "b", "score": 14, "prev_rank": 1},
        {"rank": 2, "member": "a", "score": 9, "prev_rank": 2},
        {"rank": 3, "member": "c", "score": 7, "prev_rank": None},
    ]
    # equal scores, tie_break first: the earlier latest event ranks higher
    feed(board, "incr", "c", 2, "2026-06-10T12:40")
    assert scores(model, board, "last_3h", t12) == [("b", 14, "12:15"), ("a", 9, "11:40"), ("c", 9, "12:40")]
    # late by 15 min, within late_grace: counts in the closed 12:00 period too
    feed(board, "incr", "a", 1, "2026-06-10T12:50", now="2026-06-10T13:05")
    # late, processed at the end of the grace: not in 12:00, but in 13:00
    feed(board, "incr", "c", 5, "2026-06-10T12:55", now="2026-06-10T13:10")
    assert scores(model, board, "last_3h", t12) == [("b", 14, "12:15"), ("a", 10, "12:50"), ("c", 9, "12:40")]
    assert scores(model, board, "last_3h", t13) == [("c", 14, "12:55"), ("b", 11, "12:15"), ("a", 5, "12:50")]
    # a delete leaves the current and later periods; a closed period out of grace keeps b
    feed(board, "delete", "b", 0, "2026-06-10T13:20")
    feed(board, "incr", "b", 2, "2026-06-10T13:25")  # from zero
    assert scores(model, board, "last_3h", t12)[0] == ("b", 14, "12:15")
    assert scores(model, board, "last_3h", t13) == [("c", 14, "12:55"), ("a", 5, "12:50"), ("b", 2, "13:25")]
    t14 = "2026-06-10T14"
    assert scores(model, board, "last_3h", t14) == [("c", 14, "12:55"), ("b", 2, "13:25"), ("a", 1, "12:50")]
    # a late delete within the grace of 13:00: gone from both
    feed(board, "delete", "a", 0, "2026-06-10T13:50", now="2026-06-10T14:05")
    assert scores(model, board, "last_3h", t13) == [("c", 14, "12:55"), ("b", 2, "13:25")]
    # a delete in the 14:00 bucket, applied within the grace of 13:00: whatever its ts, out of
    # every period still taking events (the closed 12:00 one, beyond its grace, keeps c)
    feed(board, "delete", "c", 0, "2026-06-10T14:06")
    assert scores(model, board, "last_3h", t13) == [("b", 2, "13:25")]
    assert scores(model, board, "last_3h", t14) == [("b", 2, "13:25")]
    assert [item.member for item in model.ranking(board, "last_3h", t12)] == ["b", "a", "c"]
    # after the grace of 13:00 a delete leaves it alone
    feed(board, "delete", "b", 0, "2026-06-10T14:10")
    assert scores(model, board, "last_3h", t13) == [("b", 2, "13:25")]
    assert scores(model, board, "last_3h", t14) == []
    assert model.seq(board) == 16
    # retention 2: the 12:00 period expires when 14:00 begins
    assert model.expiry(board, "last_3h", t12) == at("2026-06-10T14:00")
    assert model.trend(board, "last_3h", t13, at("2026-06-10T14:05")) == {}
    assert model.trend(board, "last_3h", t13, at("2026-06-10T13:59")) == {"b": 1, "a": 2, "c": 3}
    assert model.trend(board, "last_3h", t14, at("2026-06-10T14:30")) == {"b": 1}


def test_delete_reaches_future_buckets_and_counts_from_zero() -> None:
    model = Model(NY, at("2026-05-01T00:00"), at("2026-08-01T00:00"), TYPES)
    feed, board = Feed(model), "g:y"
    feed(board, "incr", "a", 4, "2026-06-10T15:00", now="2026-06-10T10:00")  # 5 hours ahead
    feed(board, "incr", "a", 1, "2026-06-10T10:01")
    feed(board, "delete", "a", 0, "2026-06-10T10:02")
    feed(board, "incr", "b", 1, "2026-06-10T10:04")
    feed(board, "delete", "b", 0, "2026-06-10T18:00", now="2026-06-10T10:05")  # ahead: clears now
    feed(board, "incr", "a", 3, "2026-06-10T14:30", now="2026-06-10T10:03")
    assert model.members(board, "last_3h", "2026-06-10T10") == {}
    assert model.members(board, "last_3h", "2026-06-10T15") == {"a": (3, at("2026-06-10T14:30"))}
    # a board of none: equal scores by member id, read from the top on desc boards
    for member in ("x", "z", "y"):
        feed("n:z", "incr", member, 1, "2026-06-10T10:10")
    assert [i.member for i in model.ranking("n:z", "last_1h", "2026-06-10T10")] == ["z", "y", "x"]


def test_asc_board_with_tie_break_last_in_day_buckets() -> None:
    model = Model(NY, at("2026-05-01T00:00"), at("2026-08-01T00:00"), TYPES)
    feed, board = Feed(model), "h:y"
    feed(board, "incr", "m", 5, "2026-06-10T10:00")
    feed(board, "incr", "n", 5, "2026-06-10T11:00")
    feed(board, "best", "m", 3, "2026-06-11T09:00")  # an empty bucket takes it
    feed(board, "best", "m", 4, "2026-06-11T09:30")  # asc: 3 stays better
    feed(board, "best", "n", 2, "2026-06-11T10:00")
    d0, d1, d2 = "2026-06-10", "2026-06-11", "2026-06-12"
    assert scores(model, board, "last_2d", d1) == [("n", 7, "10:00"), ("m", 8, "09:30")]
    feed(board, "incr", "m", -1, "2026-06-11T11:00")
    # 7 each: tie_break last puts the later latest event first
    assert scores(model, board, "last_2d", d1) == [("m", 7, "11:00"), ("n", 7, "10:00")]
    feed(board, "incr", "n", 1, "2026-06-12T01:00", now="2026-06-11T12:00")  # ahead: the next day
    assert scores(model, board, "last_2d", d1) == [("m", 7, "11:00"), ("n", 7, "10:00")]
    assert scores(model, board, "last_2d", d2) == [("m", 2, "11:00"), ("n", 3, "01:00")]
    now = at("2026-06-11T12:00")
    assert scores(model, board, "last_2d", d0) == [("n", 5, "11:00"), ("m", 5, "10:00")]
    assert model.trend(board, "last_2d", d1, now) == {"n": 1, "m": 2}
    # one bucket for the whole week of 06-08: best and incr meet in it (m: 5, then 3, then 2)
    assert model.current("last_1w", now) == "2026-W24"
    assert scores(model, board, "last_1w", "2026-W24") == [("m", 2, "11:00"), ("n", 3, "01:00")]
