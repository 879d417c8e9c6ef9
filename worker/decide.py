"""A board chunk's outcome, decided in the worker: what apply.lua decides, from the worker's own
state of the board (worker/boardstate.py) instead of inside Redis.

For every window kind (total, calendar, fixed-length periods, seasons, rolling), with or without
max_members and period results (not a previous release's layout to adopt), and for events,
not erase or reset: those still go through apply.lua. A period whose result is sealed is final:
events skip it (counted late), as apply.lua's do. A rolling window's bucket keeps the member's
board over its own events and each period adds the bucket's change (apply.lua plan_bucket,
plan_delta); its next period, prepared ahead by worker/rolling.py, is left alone while its
preparation has not begun (BoardState.unstarted, checked again by the transaction that writes:
common/store/native.py), and once it has (BoardState.started), each event writes the member's
state there, R[q] - B[q-N+1] + B[q+1] as apply.lua `plan_derived` computes it. The preparer's
walk writes that period too, outside the seq: it is read afresh for each chunk, never kept, and
the write checks that what it read of it still holds (GuardedWrite `unchanged` and `unsplit`:
the ties of the members written, and the depth its tie index's directory gives their buckets).
With max_members such a chunk is apply.lua's.
`decide` is pure: it reads the board's state and returns the per-event replies apply.lua would
have returned, the writes that make Redis agree (common/store/guarded.py), and the state after
them, which the caller keeps once Redis took the writes. The rules are apply.lua's, in its
order: the offset fence, the failure records, the id window (assumed new unless known applied:
the script checks), a closed board's refusal, then per instance incr/set/best/delete with the
declared score range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from common.events import Op
from common.idwindow import LISTPACK_CAP
from common.store.apply import (
    BOARD_CLOSED_MARK,
    BUCKET,
    CLOSED_OP,
    DELTA,
    DERIVED,
    UNREPORTED,
    ApplyEvent,
    ApplyRequest,
    EventReply,
    Instance,
)
from common.store.encoding import (
    EXACT_MAX,
    MemberState,
    Packing,
    Status,
    TieMode,
    encode_member,
    format_score,
    pack,
    state_text,
)
from common.store.guarded import Command, GuardedWrite, IdBucket, IndexBucket, Rebalance, Write
from common.store.keys import string_slot
from common.store.xhash import bucket, bytes_slot

# a member's state in one instance: (score, tie ms) or None if absent; and the tie of its entry
# in Redis (the tie index's, or the packed score's), None if Redis holds no entry
Cell = tuple[float | None, int, int | None]
ABSENT: Cell = (None, 0, None)
_GONE = frozenset({Op.DELETE.value, Op.ERASE.value})
_ZSET = frozenset({"ZADD", "ZREM"})
_PROBED = _ZSET | {"HSET", "HDEL"}  # what guarded.lua reads first, with the type it writes


class Undecidable(Exception):
    """The chunk needs apply.lua (the caller sends it there); nothing was decided."""


@dataclass
class InstanceState:
    """What the worker knows of one window instance: its layout and its members' cells."""

    packing: Packing | None
    directory: bytes  # its tie index's directory (general layout; b'' = one bucket)
    expire_at_ms: int  # 0 = never
    cells: dict[str, Cell] = field(default_factory=dict)
    # the instance was empty when the worker first read it and every member written since is in
    # `cells`: a member not there is absent, without reading
    complete: bool = False
    # its rank zset expires at expire_at_ms already (as read, or as this worker wrote it): a
    # league division's writes then leave its expiry alone (one command a division saved)
    expiry_set: bool = False


@dataclass
class BoardState:
    """The board as Redis held it at `seq`; the caller keeps it only while no one else writes it."""

    seq: int
    fence: dict[str, str]  # fence field -> value ('' = absent): 'e' and the sources' fields
    id_directory: bytes
    instances: dict[str, InstanceState] = field(default_factory=dict)
    metas: dict[str, str] = field(default_factory=dict)  # hot boards: member -> meta ('' = none)
    # periods whose result is sealed (worker/results.py): final, never written again
    sealed: set[str] = field(default_factory=set)
    # what the board's transactions left in its buckets (common/store/guarded.py GuardedWrite
    # `known`, `cutoffs`, `refreshed`): entries per tie index / id window bucket, id window
    # buckets' cutoffs, when id window keys' expiries were set
    sizes: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, int] = field(default_factory=dict)
    refreshed: dict[str, int] = field(default_factory=dict)
    # next rolling periods whose preparation had not begun when the board was read (their
    # markers absent): events leave them alone; each write checks that it still has not
    unstarted: set[str] = field(default_factory=set)
    # next rolling periods whose preparation had begun when the board was read (their markers
    # present): events write them too, as apply.lua does; read afresh for each chunk
    started: set[str] = field(default_factory=set)

    def size(self) -> int:
        return sum(len(inst.cells) for inst in self.instances.values()) + len(self.metas) + len(self.sizes)


@dataclass
class Decision:
    replies: list[EventReply]
    write: GuardedWrite
    # the state after the writes: per instance the changed cells, the changed metas, fence, seq
    cells: dict[str, dict[str, Cell]]
    metas: dict[str, str]
    fence: dict[str, str]
    seq: int


def packed_tie(p: Packing, tie: int) -> int:
    """encoding.lua ENC.packed_tie: an event time outside the packed period can't be ordered."""
    if p.bits == 0:
        return 0
    off = tie - p.base_ms
    if off < 0 or off >= (1 << p.bits):
        raise Undecidable(f"tie {tie} is outside the packed period from {p.base_ms}")
    return tie


_REJECTED = re.compile(r"(\d+):(\d+):?([A-Za-z0-9_]*)")


@dataclass
class _Source:
    field: str
    topic: str
    offset: int
    where: int
    rejected: dict[str, str]
    had_rejections: bool
    changed: bool = False


def _sources(req: ApplyRequest, fence: dict[str, str]) -> list[_Source]:
    out = []
    for src in req.sources:
        value, rej = fence.get(src.field, ""), fence.get(src.field + "!r", "")
        s = _Source(src.field, src.topic_id, -1, -1, {}, rej != "")
        if value:
            topic, _, rest = value.rpartition("|")
            topic, _, offset = topic.rpartition("|")
            if topic == src.topic_id:  # another topic id: the topic was recreated, start over
                s.offset, s.where = int(offset), int(rest)
                for ro, rw, why in _REJECTED.findall(rej):
                    if int(ro) > src.low_water:
                        s.rejected[f"{int(ro)}:{int(rw)}"] = why
        out.append(s)
    return out


def _better(desc: bool, a: float, b: float) -> bool:
    return a > b if desc else a < b


def decide(req: ApplyRequest, state: BoardState, applied: Iterable[bytes] = ()) -> Decision:
    """The chunk's replies and writes; `applied`: fingerprints known to be in the id window."""
    chunk = _Chunk(req, state, set(applied))
    replies = [chunk.event(ev) for ev in req.events]
    return chunk.decision(replies)


class _Chunk:
    """One chunk being decided: the changes so far, over the board's kept state."""

    def __init__(self, req: ApplyRequest, state: BoardState, applied: set[bytes]) -> None:
        self.req, self.state, self.applied = req, state, applied
        self.names = [inst.name for inst in req.instances]
        # None: an instance the state keeps nothing of (a derived rolling period, a bucket only
        # derived periods read): no event of the chunk writes it
        self.insts = [state.instances.get(n) for n in self.names]
        self.roles = [inst.rolling.role if inst.rolling else "" for inst in req.instances]
        self.groups = [inst.rolling.group if inst.rolling else "" for inst in req.instances]
        self.rolling = any(self.roles)
        # a next period being prepared: written absolute, from its source, leaving and entering
        self.started = [
            r == DERIVED and n in state.started for r, n in zip(self.roles, self.names, strict=True)
        ]
        if any(self.started) and req.max_members:
            raise Undecidable("a next rolling period being prepared, with max_members")
        at = {n: i for i, n in enumerate(self.names)}
        self.links = [
            (
                at.get(inst.rolling.source, -1),
                at.get(inst.rolling.leaving, -1),
                at.get(inst.rolling.entering, -1),
            )
            if inst.rolling is not None and inst.rolling.role == DERIVED
            else (-1, -1, -1)
            for inst in req.instances
        ]
        self.low, self.high = (-EXACT_MAX, EXACT_MAX) if req.score_range is None else req.score_range
        self.sources = _sources(req, state.fence)
        self.post: list[dict[str, Cell]] = [{} for _ in self.names]  # changed cells per instance
        self.metas: dict[str, str] = {}
        self.pending: set[bytes] = set()  # applied in this chunk (their order: `added`)
        self.added: list[bytes] = []
        self.checks: list[bytes] = []  # assumed new: guarded.lua checks them
        self.seq = state.seq
        self.masks: dict[int, list[int]] = {}
        self.sealed = {i for i, n in enumerate(self.names) if n in state.sealed}
        self.open: dict[int, list[int]] = {}  # mask -> its instances that are not sealed

    def cell(self, i: int, member: str) -> Cell:
        got = self.post[i].get(member)
        if got is None:
            inst = self.insts[i]
            got = inst.cells.get(member) if inst is not None else None
            if got is None:
                raise Undecidable(f"member {member!r} of {self.names[i]} was not read")
        return got

    def event(self, ev: ApplyEvent) -> EventReply:
        inst = self.masks.get(ev.mask)
        if inst is None:  # consecutive events share their instances: computed once per mask
            inst = self.masks[ev.mask] = [i for i in range(len(self.names)) if ev.mask >> i & 1]
            for i in inst:
                if (
                    self.roles[i] == DERIVED
                    and not self.started[i]
                    and self.names[i] not in self.state.unstarted
                ):
                    raise Undecidable(f"{self.names[i]} was not read")
        src = self.sources[ev.where // 1000 - 1] if ev.where > 0 else None
        sub = ev.where % 1000
        pos = f"{ev.offset}:{sub}"
        fenced = src is not None and (
            ev.offset < src.offset or (ev.offset == src.offset and sub <= src.where)
        )
        if fenced:
            assert src is not None
            status, failed_as = _redelivered(src.rejected.get(pos))
        else:
            status, failed_as = self._new(ev, inst)
            if src is not None:
                if status is Status.OUT_OF_RANGE:
                    src.rejected[pos] = ""
                elif status is Status.FAILED:
                    assert failed_as is not None
                    src.rejected[pos] = failed_as
                src.offset, src.where, src.changed = ev.offset, sub, True
        # an applied event skipped its sealed periods: late, to the worker (apply.lua's count)
        skipped = 0
        if status is Status.APPLIED:
            self.seq += 1
            skipped = len(inst) - len(self._open(ev.mask, inst))
        if not self.req.want_state:
            return EventReply(status, self.seq, failed_as, (), None, (), skipped)
        if status is not Status.APPLIED and any(self.started[i] for i in inst):
            # apply.lua reports the period's state as Redis holds it: the walk's, unknown here
            raise Undecidable("a state to report in a next rolling period being prepared")
        # (a sealed period reports its final state: a hot node re-publishes it)
        states = (
            tuple(
                UNREPORTED  # a next period this event did not write: the preparer's walk publishes it
                if self.roles[i] == DERIVED and not self.started[i]
                else _state(self.cell(i, ev.member))
                for i in inst
            )
            if ev.op != "x"
            else ()
        )
        meta = self.metas.get(ev.member, self.state.metas.get(ev.member, ""))
        return EventReply(status, self.seq, failed_as, states, meta.encode() or None, (), skipped)

    def _open(self, mask: int, inst: list[int]) -> list[int]:
        """The instances the event writes, in apply.lua's order: rolling buckets first (an
        event's delta in its window is its bucket's change), the rest, then the next rolling
        periods being prepared (which read both); no sealed period, and no next period whose
        preparation has not begun (unstarted: events leave it to the preparer's walk)."""
        got = self.open.get(mask)
        if got is None:
            open_ = [
                i for i in inst if i not in self.sealed and (self.roles[i] != DERIVED or self.started[i])
            ]
            if self.rolling:
                open_ = (
                    [i for i in open_ if self.roles[i] == BUCKET]
                    + [i for i in open_ if self.roles[i] not in (BUCKET, DERIVED)]
                    + [i for i in open_ if self.roles[i] == DERIVED]
                )
            got = self.open[mask] = open_
        return got

    def _new(self, ev: ApplyEvent, inst: list[int]) -> tuple[Status, str | None]:
        """An event the fence lets through, in apply.lua's order."""
        if ev.op == "x":  # the record of an event whose processing raised
            return Status.FAILED, ev.member
        if ev.fingerprint in self.pending or ev.fingerprint in self.applied:
            return Status.DUPLICATE, None
        self.checks.append(ev.fingerprint)
        if ev.op == CLOSED_OP:
            return Status.FAILED, BOARD_CLOSED_MARK
        if self.rolling:
            plans = self._rolling_plans(ev, self._open(ev.mask, inst))
        else:
            plans = [
                (i, new)
                for i in self._open(ev.mask, inst)
                if (new := _plan(self.req, self.cell(i, ev.member), ev, i)) is not None
            ]
        integral = self.req.score_range is not None
        for i, (v, _, _) in plans:
            if v is None or self.roles[i] in (DELTA, DERIVED):  # a rolling period's is a sum of buckets
                continue
            if v < self.low or v > self.high or (integral and v != math.floor(v)):
                return Status.OUT_OF_RANGE, None
        for i, new in plans:
            self.post[i][ev.member] = new
        self.pending.add(ev.fingerprint)
        self.added.append(ev.fingerprint)
        if ev.op in _GONE or ev.meta != "":
            self.metas[ev.member] = "" if ev.op in _GONE else ev.meta
        return Status.APPLIED, None

    def _rolling_plans(self, ev: ApplyEvent, order: list[int]) -> list[tuple[int, Cell]]:
        """apply.lua `decide` on a board with rolling windows: a bucket keeps the member's board
        over its own events (plan_bucket), a period adds the bucket's change (plan_delta), any
        other window as `_plan`."""
        if ev.op in _GONE:  # sent as an erase (every instance of its call): apply.lua's
            raise Undecidable("a delete on a board with rolling windows")
        plans: list[tuple[int, Cell]] = []
        delta: dict[str, float] = {}
        for i in order:
            c, role = self.cell(i, ev.member), self.roles[i]
            new: Cell | None
            if role == BUCKET:
                new, delta[self.groups[i]] = _plan_bucket(self.req.desc, c, ev)
            elif role == DELTA:
                change = delta.get(self.groups[i])
                if change is None:
                    raise Undecidable(f"{self.names[i]} without its bucket")
                new = _plan_delta(c, change, ev.tie_ms)
            elif role == DERIVED:
                new = self._plan_derived(i, ev.member, c, dict(plans))
            else:
                new = _plan(self.req, c, ev, i)
            if new is not None:
                plans.append((i, new))
        return plans

    def _plan_derived(self, i: int, member: str, c: Cell, planned: dict[int, Cell]) -> Cell | None:
        """apply.lua `plan_derived`: the member's state in a next period being prepared (`c`, as
        read for this chunk), R[q] - B[q-N+1] + B[q+1] after this event, kept from R[q] only if
        its latest event there is at or after the window's keep mark; None if unchanged."""
        rolling = self.req.instances[i].rolling
        assert rolling is not None

        def view(j: int) -> Cell:
            if j < 0:
                return ABSENT
            got = planned.get(j)
            return got if got is not None else self.cell(j, member)

        source, leaving, entering = self.links[i]
        r, n = view(source), view(entering)
        keep = r[0] is not None and r[1] >= rolling.keep_from_ms
        if not (keep or n[0] is not None):
            return None if c[0] is None else (None, 0, c[2])
        v, t = 0.0, -1
        if keep:
            o = view(leaving)
            v, t = r[0] - (o[0] if o[0] is not None else 0.0), r[1]  # type: ignore[operator]
        if n[0] is not None:
            v, t = v + n[0], max(t, n[1])
        if c[0] is not None and v == c[0] and t == c[1]:
            return None
        return (v, t, c[2])

    def decision(self, replies: list[EventReply]) -> Decision:
        keys, state = self.req.keys, self.state
        fence_writes, new_fence = self._fence()
        writes: list[Write] = [*fence_writes, *self._metas(), *self._ids()]
        committed: dict[str, dict[str, Cell]] = {}
        for i, changed in enumerate(self.post):
            inst = self.insts[i]
            if not changed or inst is None:
                continue
            if self.roles[i] == BUCKET:
                writes += _bucket_writes(self.req, self.req.instances[i], changed)
            else:
                writes += _instance_writes(self.req, self.req.instances[i], inst, changed)
            committed[self.names[i]] = {
                m: (c[0], c[1], None if c[0] is None else c[1]) for m, c in changed.items()
            }
        checks: dict[str, list[bytes]] = {}
        for fp in self.checks:
            checks.setdefault(bucket(state.id_directory, keys.id_window, bytes_slot(fp))[0], []).append(fp)
        directories = [(keys.id_window, len(state.id_directory))]
        directories += [  # (a next period being prepared: the walk splits it, `unsplit` checks it)
            (keys.tie_index(n), len(inst.directory))
            for n, inst, changed, role, started, instance in zip(
                self.names, self.insts, self.post, self.roles, self.started, self.req.instances, strict=True
            )
            if changed
            and inst is not None
            and inst.packing is None
            and role != BUCKET
            and not started
            and not instance.joined  # a league division keeps no tie index
        ]
        changed_seq = self.seq != state.seq
        probes = [
            (w.key, "z" if w.name in _ZSET else "h")
            for w in writes
            if isinstance(w, Command) and w.name in _PROBED
        ]
        probes += [(w.key, "h") for w in writes if isinstance(w, IndexBucket)]
        # what the board's transactions left in its buckets (not in a next period being
        # prepared: the preparer's walk adds to its tie index too)
        walked = {keys.tie_index(n) for n, started in zip(self.names, self.started, strict=True) if started}
        buckets = [
            w.key
            for w in writes
            if isinstance(w, IdBucket) or (isinstance(w, IndexBucket) and w.directory not in walked)
        ]
        probes += [(k, "z") for w in writes if isinstance(w, Rebalance) for k in (w.rank, w.overflow)]
        write = GuardedWrite(
            keys=keys,
            expect_seq=state.seq,
            epoch=self.req.epoch,
            slot_mark=self.req.slot_mark,
            fence=[(f, state.fence.get(f, "")) for s in self.req.sources for f in (s.field, s.field + "!r")],
            directories=directories,
            probes=list(dict.fromkeys(probes)),
            unsealed=list(  # (a league's divisions share their season's marker: once)
                dict.fromkeys(
                    keys.prepared(inst.name)
                    for inst in self.req.instances
                    if inst.sealable and inst.name not in state.sealed
                )
            ),
            unstarted=[
                keys.prepared(n)
                for n, role, started in zip(self.names, self.roles, self.started, strict=True)
                if role == DERIVED and not started
            ],
            checks=list(checks.items()),
            unchanged=self._unchanged(),
            unsplit=self._unsplit(),
            writes=writes,
            new_seq=self.seq if changed_seq else None,
            notify=f"{state.seq} {self.seq} {keys.board}" if changed_seq else "",
            id_window_s=self.req.id_window_s,
            listpack_cap=self.req.listpack_cap or LISTPACK_CAP,
            promoted=self.req.promoted,
            expires_at_ms=min(
                (
                    inst.expire_at_ms
                    for inst, changed in zip(self.req.instances, self.post, strict=True)
                    if changed and inst.expire_at_ms
                ),
                default=0,
            ),
            events=len(self.req.events),
            known={k: state.sizes[k] for k in buckets if k in state.sizes},
            cutoffs={k: state.cutoffs[k] for k in buckets if k in state.cutoffs},
            refreshed={k: state.refreshed[k] for k in (*buckets, keys.id_window) if k in state.refreshed},
        )
        return Decision(replies, write, committed, self.metas, new_fence, self.seq)

    def _walked(self) -> list[tuple[str, InstanceState, dict[str, Cell]]]:
        """Each next period being prepared that the chunk writes: its tie index, state, changes."""
        return [
            (self.req.keys.tie_index(self.names[i]), inst, changed)
            for i, (inst, changed) in enumerate(zip(self.insts, self.post, strict=True))
            if changed and self.started[i] and inst is not None
        ]

    def _unchanged(self) -> list[tuple[str, str, bytes]]:
        """What the writes assume of each next period being prepared, as read for this chunk
        (the preparer's walk writes it too, outside the seq): the ties of the members written."""
        return [
            (bucket(inst.directory, index, string_slot(m))[0], m, b"" if rtie is None else str(rtie).encode())
            for index, inst, changed in self._walked()
            for m, (_, _, rtie) in changed.items()
        ]

    def _unsplit(self) -> list[tuple[str, int, bytes]]:
        """... and the depth its directory gave those members' buckets: the byte at each one's
        slot (b'' with no directory: one bucket). The walk's splits of other buckets may change
        the rest of the directory, and double it (its first half then is what it was)."""
        out: dict[tuple[str, int], bytes] = {}
        for index, inst, changed in self._walked():
            n = len(inst.directory)
            for m in changed:
                at = string_slot(m) % n if n else 0
                out[(index, at)] = inst.directory[at : at + 1]
        return [(index, at, byte) for (index, at), byte in out.items()]

    def _fence(self) -> tuple[list[Write], dict[str, str]]:
        """The fence's new positions and rejections (apply.lua's format), and its epoch if new."""
        fence = self.req.keys.fence
        writes: list[Write] = []
        args: list[str] = []
        new: dict[str, str] = {}
        for s in self.sources:
            if not s.changed:
                continue
            new[s.field] = f"{s.topic}|{s.offset}|{s.where}"
            args += [s.field, new[s.field]]
            rejected = sorted(pos if why == "" else f"{pos}:{why}" for pos, why in s.rejected.items())
            new[s.field + "!r"] = " ".join(rejected)
            if rejected:
                args += [s.field + "!r", new[s.field + "!r"]]
            elif s.had_rejections:
                writes.append(Command("HDEL", fence, (s.field + "!r",)))
        if args:
            if not self.state.fence.get("e"):
                new["e"] = self.req.epoch
                args += ["e", self.req.epoch]
            writes.append(Command("HSET", fence, tuple(args)))
        return writes, new

    def _metas(self) -> list[Write]:
        meta = self.req.keys.meta
        put = [x for member, m in self.metas.items() if m for x in (member, m)]
        drop = tuple(member for member, m in self.metas.items() if not m)
        out: list[Write] = []
        if put:
            out.append(Command("HSET", meta, tuple(put)))
        if drop:
            out.append(Command("HDEL", meta, drop))
        return out

    def _ids(self) -> list[Write]:
        keys = self.req.keys
        groups: dict[str, tuple[int, int, list[bytes]]] = {}
        for fp in self.added:
            key, d, p = bucket(self.state.id_directory, keys.id_window, bytes_slot(fp))
            groups.setdefault(key, (d, p, []))[2].append(fp)
        return [IdBucket(k, d, p, tuple(fps)) for k, (d, p, fps) in groups.items()]


def _state(c: Cell) -> MemberState | None:
    return None if c[0] is None else MemberState(c[0], c[1])


def _plan_bucket(desc: bool, c: Cell, ev: ApplyEvent) -> tuple[Cell | None, float]:
    """apply.lua `plan_bucket`: the member's new state in a rolling bucket (None: unchanged; its
    tie is its latest event), and the event's delta in the window: the value after minus before."""
    score = c[0]
    old = score if score is not None else 0.0
    if ev.op == "incr":
        v = old + ev.score
    elif ev.op == "set" or score is None or _better(desc, ev.score, score):
        v = ev.score
    else:
        v = score
    t = max(c[1], ev.tie_ms) if score is not None else ev.tie_ms
    if score is not None and v == score and t == c[1]:
        return None, 0.0
    return (v, t, c[2]), v - old


def _plan_delta(c: Cell, delta: float, tie: int) -> Cell | None:
    """apply.lua `plan_delta`: a rolling period's new state when the event adds `delta`."""
    score = c[0]
    v = (score if score is not None else 0.0) + delta
    t = max(c[1], tie) if score is not None else tie
    if score is not None and v == score and t == c[1]:
        return None
    return (v, t, c[2])


def _bucket_writes(req: ApplyRequest, instance: Instance, changed: dict[str, Cell]) -> list[Write]:
    """apply.lua `flush_bucket` and its expiry: a rolling bucket is a hash member ->
    "<value>|<latest event ms>"."""
    key = req.keys.bucket(instance.name)
    put = [x for m, (v, t, _) in changed.items() if v is not None for x in (m, state_text(v, t))]
    drop = tuple(m for m, (v, _, _) in changed.items() if v is None)
    out: list[Write] = []
    if put:
        out.append(Command("HSET", key, tuple(put)))
    if drop:
        out.append(Command("HDEL", key, drop))
    if instance.expire_at_ms:
        out.append(Command("PEXPIREAT", key, (instance.expire_at_ms,)))
    return out


def _redelivered(why: str | None) -> tuple[Status, str | None]:
    """What a redelivered event's first delivery reported, as the fence remembers it."""
    if why is None:
        return Status.REDELIVERED, None
    if why == "":
        return Status.OUT_OF_RANGE, None
    return Status.FAILED, why


def _plan(req: ApplyRequest, c: Cell, ev: ApplyEvent, i: int) -> Cell | None:
    """apply.lua `plan`: the member's new cell in instance i, None if unchanged (keeps its time)."""
    score, present = c[0], c[0] is not None
    if ev.op in _GONE:
        return (None, 0, c[2]) if present else None
    packing = req.instances[i].packing
    if ev.op == "incr":
        new = (score if score is not None else 0.0) + ev.score
    elif ev.op == "set" or score is None or _better(req.desc, ev.score, score):  # set, or best
        new = ev.score
    else:
        new = score
    if present and new == score:
        return None
    if packing is not None:
        tie = packed_tie(packing, ev.tie_ms)
    else:
        tie = ev.join if req.instances[i].joined else ev.tie_ms  # a league division: join order
    return (new, tie, c[2])


def _instance_writes(
    req: ApplyRequest, instance: Instance, inst: InstanceState, changed: dict[str, Cell]
) -> list[Write]:
    """apply.lua `flush` for one instance's changed members: the tie index, ZREM (from the rank
    zset, and with max_members from the overflow), ZADD, the max_members split, expiry."""
    name, keys, packed = instance.name, req.keys, inst.packing is not None
    rank, overflow = keys.rank(name, packed), keys.overflow(name, packed)
    if inst.packing is not None:
        packing = inst.packing
        add = [
            x
            for m, (s, t, _) in changed.items()
            if s is not None
            for x in (format_score(pack(packing, s, t)), m)
        ]
        rem = [m for m, (s, _, _) in changed.items() if s is None]
        gone = [m for m, (_, _, rtie) in changed.items() if rtie is not None]  # the overflow may hold it
        out: list[Write] = []
    else:
        rem, add, gone, out = _general_writes(req, name, inst, changed, instance.expire_at_ms)
        if instance.joined:  # a league division: its entries are all it keeps (no tie index)
            out = []
    capped = req.max_members > 0
    if rem:
        out.append(Command("ZREM", rank, tuple(rem)))
    if capped and gone:
        out.append(Command("ZREM", overflow, tuple(gone)))
    if add:
        out.append(Command("ZADD", rank, tuple(add)))
    if capped:
        out.append(Rebalance(rank, overflow, len(changed), req.max_members, req.desc))
    if instance.expire_at_ms and not (instance.joined and inst.expiry_set):
        out.append(Command("PEXPIREAT", rank, (instance.expire_at_ms,)))
        if capped:
            out.append(Command("PEXPIREAT", overflow, (instance.expire_at_ms,)))
    return out


def _general_writes(
    req: ApplyRequest, name: str, inst: InstanceState, changed: dict[str, Cell], expire_at_ms: int
) -> tuple[list[str], list[str], list[str], list[Write]]:
    """A general instance: entries to remove from the rank zset, to add (tie-prefixed), the old
    entries the overflow may hold, and its tie index's writes."""
    mode, index_key = req.mode, req.keys.tie_index(name)
    rem: list[str] = []
    add: list[str] = []
    gone: list[str] = []
    prefixes: dict[int, str] = {}

    def encode(tie: int, member: str) -> str:  # encode_member, each tie's prefix formatted once
        prefix = prefixes.get(tie)
        if prefix is None:
            prefix = prefixes[tie] = encode_member(mode, tie, "")
        return prefix + member

    buckets: dict[str, tuple[int, int, list[str], list[tuple[str, int]]]] = {}
    for member, (score, tie, rtie) in changed.items():
        if rtie is not None:
            gone.append(encode(rtie, member))
            if not (score is not None and (mode is TieMode.NONE or tie == rtie)):
                rem.append(gone[-1])
        if score is not None:
            add += [format_score(score), encode(tie, member)]
        if (score is not None and tie != rtie) or (score is None and rtie is not None):
            key, d, p = bucket(inst.directory, index_key, string_slot(member))
            drop, put = buckets.setdefault(key, (d, p, [], []))[2:]
            if score is None:
                drop.append(member)
            else:
                put.append((member, tie))
    index: list[Write] = [
        IndexBucket(k, index_key, d, p, expire_at_ms, tuple(dr), tuple(pu))
        for k, (d, p, dr, pu) in buckets.items()
    ]
    return rem, add, gone, index
