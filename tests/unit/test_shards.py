"""Shard names and placement, and the hot memory of a sharded board (common/store/shards.py)."""

from __future__ import annotations

import zlib

import pytest
from redis.crc import key_slot

from api.hotboards import HotBoard
from api.hotwindow import HotWindow
from common.cache_records import Kind, Record
from common.store.encoding import TieMode
from common.store.shards import board_of, index_of, is_shard, shard_index, shard_names, shard_of


@pytest.mark.parametrize("k", [2, 3, 4, 8, 64])
def test_each_shard_lands_in_the_middle_of_its_share_of_the_slots(k):
    for board in ("gift:global", "a", "x:y.z-1", "t_0:" + "s" * 160):
        names = shard_names(board, k)
        assert len(set(names)) == k and names == shard_names(board, k)
        width = 16_384 / k
        for i, name in enumerate(names):
            assert name.startswith(f"{board}#{k}.{i}.") and board_of(name) == board and index_of(name) == i
            assert i * width + width / 4 <= key_slot(name.encode()) < (i + 1) * width - width / 4


def test_three_shards_sit_on_three_masters_of_an_evenly_split_cluster():
    owners = [(0, 5460), (5461, 10922), (10923, 16383)]  # redis-cli --cluster create's split
    for board in (f"gift:room{i}" for i in range(200)):
        slots = [key_slot(name.encode()) for name in shard_names(board, 3)]
        assert {next(m for m, (lo, hi) in enumerate(owners) if lo <= s <= hi) for s in slots} == {0, 1, 2}


def test_a_members_shard_is_crc32_of_its_id_and_an_unsharded_board_keeps_its_name():
    assert shard_names("gift:r1", 1) == ("gift:r1",) and shard_of("gift:r1", 1, "m") == "gift:r1"
    assert not is_shard("gift:r1") and index_of("gift:r1") == 0
    for member in ("m1", "whale", "ü", "a" * 200):
        assert shard_index(member, 5) == zlib.crc32(member.encode()) % 5
        assert shard_of("b", 5, member) == shard_names("b", 5)[zlib.crc32(member.encode()) % 5]


def _members_of_shard(shard: int, k: int, n: int) -> list[str]:
    return [m for m in (f"m{i}" for i in range(500)) if shard_index(m, k) == shard][:n]


def test_a_reset_of_one_shard_empties_only_that_shards_members_of_a_hot_window():
    window = HotWindow(desc=True, mode=TieMode.INV, shards=3)
    window.finish_loading()
    first, second = _members_of_shard(0, 3, 2), _members_of_shard(1, 3, 2)
    for seq, member in enumerate(first + second, start=1):  # seqs 1-4: each shard counts its own
        assert window.put(member, 10.0 + seq, 1_000, seq)
    assert window.reset(5, shard=0)  # shard 0 emptied at its seq 5
    assert {member for member, _ in window.page(0, 10, False)} == set(second)
    assert not window.put(first[0], 1.0, 1_000, 4)  # shard 0's older state: void
    assert window.put(second[0], 1.0, 1_000, 5)  # shard 1's seq 5 is its own, after no reset
    assert window.put(first[1], 3.0, 1_000, 6)


def test_a_sharded_hot_board_is_caught_up_only_when_every_shard_is():
    names = shard_names("split:h", 3)
    hot = HotBoard("split:h", ("total",), True, TieMode.INV, shards=3)
    hot.targets = dict(zip(names, (5, 7, 2), strict=True))
    for name, seq in zip(names[:2], (5, 9), strict=True):
        hot.apply(Record(Kind.MARKER, name, "", "", 0.0, 0, seq, None))
    assert not hot.caught_up() and hot.marker == -1  # the third shard's marker is missing
    hot.apply(Record(Kind.MARKER, names[2], "", "", 0.0, 0, 1, None))
    assert not hot.caught_up()  # and behind its target
    hot.apply(Record(Kind.MARKER, names[2], "", "", 0.0, 0, 2, None))
    assert hot.caught_up() and hot.marker == 16 and hot.seq == 16 and hot.target == 14
