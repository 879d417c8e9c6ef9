"""The native transactions' pure parts: which writes go that way (common/store/native.py) and the
bucket split in Python (common/store/xhash.py). Their Redis results are compared with the
scripts' byte for byte in tests/integration/test_decided_writes.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, cast

import redis
from hypothesis import given
from hypothesis import strategies as st

from common.store.guarded import GuardedWrite
from common.store.keys import BoardKeys
from common.store.native import EXPIRY_MARGIN_MS, MIN_EVENTS, _replies, directory_writes, native
from common.store.xhash import Bucket, bucket, split, splits

NOW = 1_800_000_000_000


def write(events: int, expires_at_ms: int = 0) -> GuardedWrite:
    return GuardedWrite(
        keys=BoardKeys("p:", "g:a"), expect_seq=0, epoch="E", slot_mark="", fence=[], directories=[],
        probes=[], unsealed=[], checks=[], writes=[], new_seq=None, notify="", id_window_s=60,
        listpack_cap=128, expires_at_ms=expires_at_ms, events=events,
    )  # fmt: skip


def test_small_chunks_and_periods_about_to_expire_go_through_the_script():
    assert native(write(MIN_EVENTS), NOW)
    assert not native(write(MIN_EVENTS - 1), NOW)
    assert native(write(1), NOW, min_events=1)
    assert native(write(50, NOW + EXPIRY_MARGIN_MS + 1), NOW)
    assert not native(write(50, NOW + EXPIRY_MARGIN_MS), NOW)
    assert not native(write(50, NOW - 1), NOW)


def test_a_bucket_splits_when_it_grows_past_a_multiple_of_the_cap():
    assert not splits(0, 4, 4, 1)  # at the cap
    assert splits(0, 4, 5, 1)  # past it
    assert not splits(0, 4, 6, 1)  # one it could not separate stays until the next multiple
    assert splits(0, 4, 9, 1)
    assert not splits(20, 4, 9, 1)  # the directory's deepest level


def test_a_split_doubles_the_directory_at_the_global_depth_and_deepens_the_split_slots():
    def slot(e: bytes) -> int:
        return int(e)

    entries = {str(v).encode(): b"x" for v in (0, 1, 2, 3, 5)}
    done = split("d", b"", Bucket("d:0:0", 0, 0), entries, cap=4, slot=slot)
    assert done is not None
    assert done.directory == b"\x01\x01"
    assert done.buckets == {"d:1:0": {b"0": b"x", b"2": b"x"}, "d:1:1": {b"1": b"x", b"3": b"x", b"5": b"x"}}
    assert bucket(done.directory, "d", 5) == ("d:1:1", 1, 1)
    # a half still over the cap splits again, deeper
    entries = {str(v).encode(): b"x" for v in (1, 3, 5, 7, 9, 11)}
    done = split("d", b"\x01\x01", Bucket("d:1:1", 1, 1), entries, cap=2, slot=slot)
    assert done is not None
    assert done.buckets == {
        "d:3:1": {b"1": b"x", b"9": b"x"},
        "d:3:5": {b"5": b"x"},
        "d:3:3": {b"3": b"x", b"11": b"x"},
        "d:3:7": {b"7": b"x"},
    }
    assert done.directory == b"\x01\x03\x01\x03\x01\x03\x01\x03"
    assert done.empty == ()  # every half holds entries
    # a half left without entries holds no key: the split names it (its size is 0)
    entries = {str(v).encode(): b"x" for v in (0, 2, 4, 1)}
    done = split("d", b"", Bucket("d:0:0", 0, 0), entries, cap=2, slot=slot)
    assert done is not None
    assert done.buckets == {"d:2:0": {b"0": b"x", b"4": b"x"}, "d:2:2": {b"2": b"x"}, "d:1:1": {b"1": b"x"}}
    assert done.empty == ()
    entries = {str(v).encode(): b"x" for v in (0, 4, 8)}
    done = split("d", b"", Bucket("d:0:0", 0, 0), entries, cap=2, slot=slot)
    assert done is not None
    assert done.buckets == {"d:3:0": {b"0": b"x", b"8": b"x"}, "d:3:4": {b"4": b"x"}}
    assert set(done.empty) == {"d:1:1", "d:2:2"}


def test_entries_that_share_one_slot_value_are_left_unsplit():
    entries = {b"a": b"1", b"b": b"2", b"c": b"3"}
    assert split("d", b"", Bucket("d:0:0", 0, 0), entries, cap=2, slot=lambda e: 7) is None


def test_replies_are_read_one_by_one_without_hiredis():
    class Parser:  # redis-py's pure-Python parser has no hiredis reader
        pass

    class Conn:
        _parser = Parser()
        replies: ClassVar[list[object]] = [b"OK", redis.ResponseError("WRONGTYPE"), 3]

        def read_response(self) -> object:
            reply = self.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            return reply

    got = _replies(Conn(), 3)
    assert got[0] == b"OK" and isinstance(got[1], redis.ResponseError) and got[2] == 3


def _written(before: bytes, cmds: Sequence[tuple[object, ...]]) -> bytes:
    """What Redis holds after `cmds` (SET, BITFIELD SET u8, APPEND) on a string holding `before`."""
    value = bytearray(before)
    for cmd in cmds:
        if cmd[0] == "SET":
            value = bytearray(cast(bytes, cmd[2]))
        elif cmd[0] == "APPEND":
            value += cast(bytes, cmd[2])
        else:
            assert cmd[0] == "BITFIELD"
            ops = cmd[2:]
            for j in range(0, len(ops), 4):
                assert ops[j : j + 2] == ("SET", "u8")
                value[int(str(ops[j + 2]).removeprefix("#"))] = cast(int, ops[j + 3])
    return bytes(value)


@given(st.data())
def test_a_splits_directory_change_is_written_as_the_bytes_it_changes(data: st.DataObject):
    """Splits of random buckets of random directories: the directory writes turn the directory
    before into the one after, and send a byte for each slot deepened (and the half a doubling
    added), never the whole directory again."""
    directory = b""
    rng_values = data.draw(st.lists(st.integers(0, 2**24 - 1), min_size=40, max_size=400, unique=True))
    entries_at: dict[str, dict[bytes, bytes]] = {"d:0:0": {}}
    for value in rng_values:
        key, depth, prefix = bucket(directory, "d", value)
        entries_at.setdefault(key, {})[str(value).encode()] = b"x"
        if len(entries_at[key]) <= 4:
            continue
        done = split("d", directory, Bucket(key, depth, prefix), entries_at.pop(key), cap=4, slot=int)
        assert done is not None
        cmds = directory_writes("d", directory, done.directory, Bucket(key, depth, prefix))
        assert _written(directory, cmds) == done.directory
        if directory:
            sent = sum(len(cast(bytes, c[2])) if c[0] == "APPEND" else (len(c) - 2) // 4 for c in cmds)
            assert sent <= len(done.directory) - len(directory) + len(
                range(prefix, len(directory), 1 << depth)
            )
        directory = done.directory
        entries_at.update(done.buckets)
    assert len(directory) >= 16  # it grew through doublings and deepenings
