"""The update_cache record formats (common/cache_records.py): every record of both formats
decodes to what was written, and a record of a format this release cannot read is refused in
one readable error rather than misread."""

from __future__ import annotations

import pytest

from common.cache_records import (
    CHUNK_V3,
    Kind,
    Record,
    RecordWriter,
    UnknownFormatError,
    decode,
    decode_chunk,
    deleted_key,
)

B, DAY = "gift:r1", "day:2026-11-29"
META = b'{"name":"A"}'


@pytest.mark.parametrize("version", [1, 2])
def test_every_record_decodes_to_what_was_written(version):
    w = RecordWriter(version)
    claim = META if version == 1 else None  # format 1: window records carry the meta
    cases = [
        (w.state(B, DAY, "a", score=-2.5, tie_ms=1_790_000_000_123, seq=9, meta=META),
         Record(Kind.STATE, B, DAY, "a", -2.5, 1_790_000_000_123, 9, claim, version)),
        (w.deleted(B, DAY, "a", 10, META), Record(Kind.DELETED, B, DAY, "a", 0.0, 0, 10, claim, version)),
        (w.reset(B, DAY, 11), Record(Kind.RESET, B, DAY, "", 0.0, 0, 11, None, version)),
        (w.marker(B, 12), Record(Kind.MARKER, B, "", "", 0.0, 0, 12, None, version)),
    ]  # fmt: skip
    for (key, value), expected in cases:
        assert decode(key, value) == expected


def test_format_2_carries_meta_in_records_of_its_own():
    w = RecordWriter(2)
    meta, dropped, reset = w.meta(B, "a", 5, META), w.meta(B, "a", 6, None), w.board_reset(B, 7)
    assert meta and dropped and reset
    assert decode(*meta) == Record(Kind.META, B, "", "a", 0.0, 0, 5, META, 2)
    assert decode(*dropped) == Record(Kind.META, B, "", "a", 0.0, 0, 6, None, 2)
    assert decode(*reset) == Record(Kind.RESET, B, "", "", 0.0, 0, 7, None, 2)
    assert len(w.state(B, DAY, "a", score=1.0, tie_ms=2, seq=3, meta=META)[1]) == 25  # no meta inside
    assert RecordWriter(1).meta(B, "a", 5, META) is None and RecordWriter(1).board_reset(B, 7) is None


def test_deleted_keys_void_what_they_held():
    w = RecordWriter(2)
    assert deleted_key(w.marker(B, 1)[0]) == Record(Kind.GONE, B, "", "", 0.0, 0, 0, None, 2)
    assert deleted_key(w.state(B, DAY, "a", score=1, tie_ms=1, seq=1, meta=None)[0]) == Record(
        Kind.GONE, B, DAY, "a", 0.0, 0, 0, None, 2
    )
    meta = w.meta(B, "a", 1, None)
    reset = w.board_reset(B, 1)
    assert meta and reset
    assert deleted_key(meta[0]) == Record(Kind.GONE, B, "", "a", 0.0, 0, 0, None, 2)
    assert deleted_key(reset[0]) is None


@pytest.mark.parametrize("first", [0x00, 0x05, 0x30, 0x2F, 0xFF])
def test_a_newer_format_is_refused_in_one_readable_error(first):
    with pytest.raises(UnknownFormatError, match="upgrade API nodes before workers"):
        decode(b"gift:r1\0total\0a", bytes([first]) + bytes(24))


def test_an_unknown_format_is_refused_at_setup():
    with pytest.raises(ValueError, match="format must be one of"):
        RecordWriter(3)


@pytest.mark.parametrize("version", [1, 2])
def test_a_league_division_is_written_in_format_3_whatever_the_format(version: int) -> None:
    """Its records decode as format 3 (a node before leagues refuses them), everything else as
    the writer's format; a backfill's chunk of a division too."""
    writer, division, period = RecordWriter(version), "season:2026-11-02+4@gold.3", "season:2026-11-02+4"
    key, value = writer.state("arena:x", division, "m", score=5.0, tie_ms=17, seq=9, meta=None)
    assert value[0] == 0x31 and decode(key, value) == Record(
        Kind.STATE, "arena:x", division, "m", 5.0, 17, 9, None, 3
    )
    key, value = writer.deleted("arena:x", division, "m", 10)
    assert value[0] == 0x32 and decode(key, value).kind is Kind.DELETED
    key, value = writer.reset("arena:x", division, 11)
    assert value[0] == 0x34 and decode(key, value).version == 3
    assert writer.state("arena:x", period, "m", score=5.0, tie_ms=17, seq=9, meta=None)[1][0] == (
        Kind.STATE if version == 1 else 0x21
    )
    chunk = RecordWriter(2).chunk("arena:x", division, 0, 12, [("m", 5.0, 17, None)])
    assert chunk is not None and chunk[1][0] == CHUNK_V3
    got = decode_chunk(*chunk)[0]
    assert (got.board, got.instance, got.member, got.score, got.tie_ms, got.seq) == (
        "arena:x",
        division,
        "m",
        5.0,
        17,
        12,
    )
