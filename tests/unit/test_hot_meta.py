"""A hot board's memory of members' meta: the newest record's, in whatever order records arrive.

An independent model of one board (windows total, day:A, day:B; events with and without meta,
delete ops, erases, window and whole-board resets) makes the records the worker publishes
(worker/publisher.py: per batch, the latest record of each (instance, member) in the order the
batch first touched it, then the resets), and the hot board must end as the model whatever
order it meets them in: live (offset order), replayed after compaction (the latest record per
key, in offset order), or shuffled (a backfill interleaving)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from api.hotboards import HotBoard
from common.cache_records import Kind, Record
from common.store.encoding import TieMode

BOARD = "gift:r0"
DAYS = ("day:2026-11-27", "day:2026-11-28")
MEMBERS = ("a", "b", "c")


def record(
    kind: Kind, instance: str, member: str, seq: int, *, score: float = 0.0, meta: bytes | None = None
) -> Record:
    return Record(kind, BOARD, instance, member, score, seq if kind is Kind.STATE else 0, seq, meta)


def hot_board() -> HotBoard:
    return HotBoard(BOARD, ("total", "day"), desc=True, mode=TieMode.INV)


def test_a_batch_publishing_an_older_days_record_last_keeps_the_newest_meta():
    """The CI failure of 2026-11-27 16:04 UTC (midnight in Asia/Shanghai): one batch held a's
    events at seq 5 (today), 10 (yesterday, meta none yet) and 50 (today, meta M); the publisher
    sent total@50, today@50, then yesterday@10, whose absence of meta the node took."""
    hot = hot_board()
    meta = b'{"name":"A"}'
    hot.apply(record(Kind.STATE, "total", "a", 50, score=3.0, meta=meta))
    hot.apply(record(Kind.STATE, DAYS[1], "a", 50, score=2.0, meta=meta))
    hot.apply(record(Kind.STATE, DAYS[0], "a", 10, score=1.0))
    assert hot.meta.get("a") == meta
    # and an older record with meta cannot bring back what a newer delete dropped
    hot.apply(record(Kind.DELETED, "total", "a", 60))
    hot.apply(record(Kind.DELETED, DAYS[1], "a", 60))
    hot.apply(record(Kind.STATE, DAYS[0], "a", 55, score=1.0, meta=meta))  # a record older than the delete
    assert hot.meta.get("a") is None


# --- the model ------------------------------------------------------------------------------------

Op = tuple[str, str, int, bool]  # (kind, member, day index, with meta)


@dataclass
class BoardModel:
    """The board as Redis holds it, and the records each event makes."""

    seq: int = 0
    state: dict[str, dict[str, tuple[float, int]]] = field(
        default_factory=dict
    )  # inst -> member -> (score, seq)
    meta: dict[str, bytes] = field(default_factory=dict)

    def apply(self, op: Op) -> list[Record]:
        kind, member, day, with_meta = op
        self.seq += 1
        seq = self.seq
        if kind == "reset_day":
            self.state[DAYS[day]] = {}
            return [record(Kind.RESET, DAYS[day], "", seq)]
        if kind == "reset_board":
            self.meta.clear()
            out = [record(Kind.RESET, inst, "", seq) for inst in self.state]
            self.state = {inst: {} for inst in self.state}
            return out
        if kind in {"delete", "erase"}:
            self.meta.pop(member, None)
            touched = list(self.state) if kind == "erase" else ["total", DAYS[day]]
            for inst in touched:
                self.state.setdefault(inst, {}).pop(member, None)
            return [record(Kind.DELETED, inst, member, seq) for inst in touched]
        if with_meta:
            self.meta[member] = f'{{"seq":{seq}}}'.encode()
        out = []
        for inst in ("total", DAYS[day]):
            members = self.state.setdefault(inst, {})
            members[member] = ((members.get(member) or (0.0, 0))[0] + 1.0, seq)
            out.append(
                record(Kind.STATE, inst, member, seq, score=members[member][0], meta=self.meta.get(member))
            )
        return out


def published(model: BoardModel, ops: list[Op], cuts: list[int]) -> list[Record]:
    """The records in offset order: per batch, the latest of each (instance, member) in first-touch
    order, then the resets (worker/publisher.py)."""
    out: list[Record] = []
    bounds = [0, *sorted(set(cuts)), len(ops)]
    for lo, hi in pairwise(bounds):
        latest: dict[tuple[str, str], Record] = {}
        resets: dict[str, Record] = {}
        for op in ops[lo:hi]:
            for rec in model.apply(op):
                if rec.kind is Kind.RESET:
                    resets[rec.instance] = rec
                else:
                    latest[(rec.instance, rec.member)] = rec
        out += [*latest.values(), *resets.values()]
    return out


def compacted(records: list[Record]) -> list[Record]:
    last = {(r.instance, r.member): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[(r.instance, r.member)] == i]


ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(["event"] * 6 + ["delete", "erase", "reset_day", "reset_board"]),
        st.sampled_from(MEMBERS),
        st.integers(0, 1),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(
    ops=ops_strategy,
    cuts=st.lists(st.integers(0, 40), max_size=6),
    order=st.sampled_from(["live", "compacted", "shuffled"]),
    seed=st.integers(0, 2**16),
)
def test_memory_ends_as_the_board_whatever_order_records_arrive_in(ops, cuts, order, seed):
    model = BoardModel()
    records = published(model, ops, cuts)
    if order == "compacted":
        records = compacted(records)
    elif order == "shuffled":
        random.Random(seed).shuffle(records)
    hot = hot_board()
    for rec in records:
        hot.apply(rec)
    got = {inst: {m: (s, q) for m, (s, _, q) in w.items().items()} for inst, w in hot.instances.items()}
    assert {i: ms for i, ms in got.items() if ms} == {i: ms for i, ms in model.state.items() if ms}
    present = {m for members in got.values() for m in members}
    assert {m: hot.meta.get(m) for m in present} == {m: model.meta.get(m) for m in present}
