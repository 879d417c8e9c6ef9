"""The hot board backfill flag's encoding (common/store/encoding.py): which windows it covers."""

from __future__ import annotations

from common.store.encoding import hot_flag, hot_flag_covers


def test_a_flag_covers_the_windows_it_names_and_no_other():
    raw = hot_flag(42, ("total", "day")).encode()
    assert raw == b"42|day,total"
    assert hot_flag_covers(raw, ("total",)) and hot_flag_covers(raw, ("day", "total"))
    assert not hot_flag_covers(raw, ("total", "day", "last_7d"))  # a window added: backfill again


def test_no_flag_and_a_flag_without_windows_cover_nothing():
    assert not hot_flag_covers(None, ("total",))
    assert not hot_flag_covers(b"42", ("total",))  # written before the windows were recorded
    assert hot_flag_covers(hot_flag(0, ()), ())  # a board with no hot window needs nothing
