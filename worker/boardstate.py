"""The worker's state of the boards it applies, and the guarded path that uses it.

For a chunk `decidable` accepts, the worker decides the outcome itself (worker/decide.py) from
the board's state it keeps here, reading from Redis only what it lacks (natives, pipelined over
every board of the round: the seq, the fence, directories, then members' ties and scores), and
Redis runs the decided writes behind a check that the board is still as the worker read it: as
a transaction of commands (common/store/native.py), or for a small chunk, a period about to
expire or a board beyond a round's connections, one guarded.lua call. A board's state is kept while its seq
is the one the worker last wrote or read: a check that fails (someone else wrote the board: a
second worker, a zombie, apply.lua) drops it, the chunk is read and decided again, at most
MAX_TRIES times, then sent to apply.lua like every other chunk.

The states are bounded (`max_cells`, members x instances plus hot boards' metas, least recently
used boards first out); `Stats` counts what happened for the worker's metrics.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from common.events import Op
from common.store.apply import (
    BUCKET,
    DELTA,
    DERIVED,
    ApplyReply,
    ApplyRequest,
    ForeignEpoch,
    Instance,
    PromotionChanged,
)
from common.store.encoding import TieMode, encode_member, parse_state
from common.store.guarded import (
    Conflict,
    Duplicates,
    Foreign,
    GuardedScript,
    GuardedWrite,
    GuardReply,
    IdBucket,
    IndexBucket,
    Promotion,
    Sealed,
    Started,
    Written,
)
from common.store.keys import string_slot
from common.store.native import MAX_BOARDS, MIN_EVENTS, Declined, NativeWrites, native
from common.store.topology import Store
from common.store.xhash import bucket
from worker.decide import (
    ABSENT,
    BoardState,
    Decision,
    InstanceState,
    Undecidable,
    decide,
)

_log = logging.getLogger(__name__)
MAX_TRIES = 4  # guarded attempts of one chunk before it goes to apply.lua
DEFAULT_MAX_CELLS = 1_000_000
MAX_BEGUN = 100_000  # boards remembered with a next rolling period being prepared
_NOT_DECIDED = frozenset({Op.ERASE.value, Op.RESET.value, "derive", "rebuild"})


@dataclass
class Stats:
    hits: int = 0  # chunks decided from the kept state alone
    misses: int = 0  # chunks that read some of the board first
    conflicts: int = 0  # guarded writes refused: someone else wrote the board
    stale: int = 0  # kept states found changed when the board was read (someone else wrote it)
    fallbacks: int = 0  # chunks sent to apply.lua after all
    natives: int = 0  # board writes sent as native commands (common/store/native.py)
    scripted: int = 0  # board writes sent through guarded.lua
    cells: int = 0  # what the kept states hold now
    boards: int = 0


def decidable(req: ApplyRequest) -> bool:
    """Chunks the worker decides: events, not control ops (nor the rolling preparer's)."""
    return req.legacy_ttl_ms == 0 and req.tie_index and not any(ev.op in _NOT_DECIDED for ev in req.events)


@dataclass
class _Need:
    """What one chunk lacks of its board's state."""

    req: ApplyRequest
    state: BoardState | None
    seq: int = -1
    instances: list[Instance] = field(default_factory=list)  # those it has no state of
    members: dict[str, list[str]] = field(default_factory=dict)  # instance -> members to read
    metas: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)


def _members(req: ApplyRequest) -> dict[str, list[str]]:
    """Per instance, the members of the chunk's events (not failure records) in it; a next
    rolling period's members in what it is derived from too (its source, leaving and entering)."""
    out: dict[str, dict[str, None]] = {inst.name: {} for inst in req.instances}
    names = [inst.name for inst in req.instances]
    for ev in req.events:
        if ev.op == "x":
            continue
        mask, i = ev.mask, 0
        while mask:
            if mask & 1:
                out[names[i]][ev.member] = None
            mask >>= 1
            i += 1
    for inst in req.instances:
        link = inst.rolling
        if link is not None and link.role == DERIVED and out[inst.name]:
            for dep in (link.source, link.leaving, link.entering):
                if dep in out:
                    out[dep].update(out[inst.name])
    return {name: list(members) for name, members in out.items()}


def _next_periods(req: ApplyRequest) -> set[str]:
    """The next rolling periods (prepared ahead) among the chunk's instances."""
    return {i.name for i in req.instances if i.rolling is not None and i.rolling.role == DERIVED}


class BoardStates:
    def __init__(self, max_cells: int = DEFAULT_MAX_CELLS, native: bool = True) -> None:
        self.max_cells = max_cells
        self.native = native  # writes as native commands (common/store/native.py), else guarded.lua
        self.native_min_events = MIN_EVENTS  # a board's chunk of fewer events: guarded.lua
        self.native_max_boards = MAX_BOARDS  # the boards of a round written natively, at most
        self.stats = Stats()
        self._states: OrderedDict[str, BoardState] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._script = GuardedScript()
        self._natives = NativeWrites()
        # board -> markers of its next rolling periods whose preparation began: its chunks that
        # count in one of them go to apply.lua without reading the board (until those periods
        # are current and the chunks name the next ones)
        self._begun: dict[str, set[str]] = {}

    def drop(self, board: str) -> None:
        self._states.pop(board, None)
        self.stats.cells -= self._sizes.pop(board, 0)
        self.stats.boards = len(self._states)

    def drop_all(self) -> None:
        """Forget every board (Redis holds another data set: worker/apply.py's epoch)."""
        self._states.clear()
        self._sizes.clear()
        self.stats.cells = self.stats.boards = 0

    def _keep(self, board: str, state: BoardState) -> None:
        self.drop(board)
        # a period past its expiry takes no more events: its members go (the state grows with
        # the board's live periods, not with its history)
        now = time.time() * 1000
        expired = [n for n, inst in state.instances.items() if 0 < inst.expire_at_ms < now]
        for name in expired:
            del state.instances[name]
        if expired:  # their tie index buckets among them: read again when next written
            state.sizes.clear()
            state.cutoffs.clear()
            state.refreshed.clear()
        size = state.size()
        if size > self.max_cells:
            return
        self._states[board] = state
        self._sizes[board] = size
        self.stats.cells += size
        while self.stats.cells > self.max_cells and self._states:
            self.drop(next(iter(self._states)))
        self.stats.boards = len(self._states)

    def apply(self, client: Store, reqs: Sequence[ApplyRequest]) -> list[ApplyReply | None]:
        """Each chunk's replies, or None for one to send to apply.lua. Raises what the reads raise
        (an infrastructure fault: the caller retries the batch; the states are dropped)."""
        out: list[ApplyReply | None] = [None] * len(reqs)
        todo = [i for i in range(len(reqs)) if not self._begun_in(reqs[i])]
        self.stats.fallbacks += len(reqs) - len(todo)
        applied: dict[int, set[bytes]] = {}
        for _ in range(MAX_TRIES):
            if not todo:
                break
            try:
                self._read(client, [reqs[i] for i in todo])
            except Exception:
                for i in todo:
                    self.drop(reqs[i].keys.board)
                raise
            decisions: dict[int, Decision] = {}
            for i in todo:
                state = self._states.get(reqs[i].keys.board)
                try:
                    if state is None:
                        raise Undecidable("no state")  # noqa: TRY301 - one path for every refusal
                    decisions[i] = decide(reqs[i], state, applied.get(i, ()))
                except Exception as exc:  # noqa: BLE001 - whatever it is, apply.lua's path narrows it down
                    if not isinstance(exc, Undecidable):
                        _log.warning("a chunk could not be decided in the worker", extra={"error": repr(exc)})
                    self.drop(reqs[i].keys.board)
                    self.stats.fallbacks += 1
            order = list(decisions)
            replies = self._write(client, [decisions[i].write for i in order])
            todo = []
            for i, reply in zip(order, replies, strict=True):
                again, out[i] = self._settle(
                    reqs[i].keys.board, decisions[i], reply, applied.setdefault(i, set())
                )
                if again:
                    todo.append(i)
        self.stats.fallbacks += len(todo)
        for i in todo:
            self.drop(reqs[i].keys.board)
        return out

    def _write(self, client: Store, writes: list[GuardedWrite]) -> list[GuardReply | Exception]:
        """Each board's writes, natively where they may go so, else (or if the transaction
        declined them) through guarded.lua."""
        now = time.time() * 1000
        eligible = [i for i, w in enumerate(writes) if self.native and native(w, now, self.native_min_events)]
        natives = sorted(sorted(eligible, key=lambda i: -writes[i].events)[: self.native_max_boards])
        out: dict[int, GuardReply | Exception | Declined] = dict(
            zip(natives, self._natives.run_many(client, [writes[i] for i in natives]), strict=True)
        )
        scripted = [i for i in range(len(writes)) if isinstance(out.get(i, Declined()), Declined)]
        self.stats.natives += len(natives) - sum(isinstance(out[i], Declined) for i in natives)
        self.stats.scripted += len(scripted)
        out.update(zip(scripted, self._script.run_many(client, [writes[i] for i in scripted]), strict=True))
        return [cast("GuardReply | Exception", out[i]) for i in range(len(writes))]

    def _begun_in(self, req: ApplyRequest) -> bool:
        begun = self._begun.get(req.keys.board)
        if not begun:
            return False
        if any(req.keys.prepared(name) in begun for name in _next_periods(req)):
            return True
        del self._begun[req.keys.board]  # the periods it named are current now
        return False

    def _found_begun(self, board: str, markers: Iterable[str]) -> None:
        if len(self._begun) > MAX_BEGUN:
            self._begun.clear()
        self._begun.setdefault(board, set()).update(markers)

    def _settle(
        self, board: str, decision: Decision, reply: GuardReply | Exception, applied: set[bytes]
    ) -> tuple[bool, ApplyReply | None]:
        """(decide it again?, its replies) after guarded.lua's answer."""
        if isinstance(reply, Written):
            self._commit(board, decision, reply)
            return False, decision.replies
        if isinstance(reply, Duplicates | Sealed):
            return self._learn(board, decision, reply, applied), None
        self.drop(board)
        if isinstance(reply, Conflict | Started):  # Started: read again, its period is written as begun
            self.stats.conflicts += 1
            return True, None
        if isinstance(reply, Foreign):
            return False, ForeignEpoch(reply.found)
        if isinstance(reply, Promotion):  # apply.lua's, once the worker knows (worker/apply.py)
            return False, PromotionChanged(reply.promoted)
        self.stats.fallbacks += 1  # an error reply: apply.lua's path finds out which event, or raises
        return False, None

    def _learn(self, board: str, decision: Decision, reply: Duplicates | Sealed, applied: set[bytes]) -> bool:
        """What guarded.lua found that the kept state did not know (it still holds otherwise);
        whether to decide again with it."""
        if isinstance(reply, Duplicates):  # these ids were applied within the id window
            applied.update(reply.fingerprints)
            return True
        state = self._states.get(board)
        if state is None:
            return False
        keys = decision.write.keys  # these periods' results are sealed: final from now on
        state.sealed.update(n for n in state.instances if keys.prepared(n) in reply.markers)
        return True

    def _commit(self, board: str, d: Decision, reply: Written) -> None:
        state = self._states.get(board)
        if state is None:
            return
        state.seq = d.seq
        state.fence.update(d.fence)
        for name, cells in d.cells.items():
            written = state.instances[name]
            written.cells.update(cells)
            # every write sets it, or found it set; one that removed a member may have emptied
            # the zset (Redis deletes it, expiry and all): set again when next written
            removed = any(c[0] is None for c in cells.values())
            written.expiry_set = written.expire_at_ms > 0 and not removed
        state.metas.update(d.metas)
        req = d.write
        buckets = [w.key for w in req.writes if isinstance(w, IdBucket | IndexBucket)]
        for key in buckets:  # what a transaction left in them, else unknown until read again
            state.sizes.pop(key, None)
            state.cutoffs.pop(key, None)
            state.refreshed.pop(key, None)
        if buckets:  # the id window's directory: its expiry may have been set too
            state.refreshed.pop(req.keys.id_window, None)
        state.sizes.update(reply.sizes)
        state.cutoffs.update(reply.cutoffs)
        state.refreshed.update(reply.refreshed)
        # the next rolling periods still ahead are those this write checked (one per window)
        state.unstarted = {n for n in state.unstarted if req.keys.prepared(n) in req.unstarted}
        for key, value in reply.directories.items():
            if key == req.keys.id_window:
                state.id_directory = value
            else:
                for name, inst in state.instances.items():
                    if req.keys.tie_index(name) == key:
                        inst.directory = value
        self._keep(board, state)

    # -- reads ---------------------------------------------------------------------------------

    def _read(self, client: Store, reqs: Sequence[ApplyRequest]) -> None:
        """Make each chunk's board state hold what the chunk needs (dropping a state whose seq
        moved, then reading the board afresh); a chunk that can't be decided has none after."""
        needs = [self._need(r) for r in reqs]
        needs = [
            n
            for n in needs
            if n.state is None or n.instances or n.fields or n.metas or any(n.members.values())
        ]
        self.stats.hits += len(reqs) - len(needs)
        self.stats.misses += len(needs)
        for _ in range(2):
            if not needs:
                return
            self._read_boards(client, needs)
            stale = [n for n in needs if n.state is not None and n.seq != n.state.seq]
            self.stats.stale += len(stale)
            for n in stale:
                self.drop(n.req.keys.board)
            fresh = [n for n in needs if n not in stale]
            self._read_members(client, fresh)
            needs = [self._need(n.req) for n in stale]
        for n in needs:
            self.drop(n.req.keys.board)

    def _need(self, req: ApplyRequest) -> _Need:
        state = self._states.get(req.keys.board)
        members = _members(req)
        if state is not None:
            self._states.move_to_end(req.keys.board)
            # the preparer writes a next period too, outside the seq: what was read of it is
            # stale at once, so it is read afresh for each chunk that names it as next, and once
            # more when a chunk names it as current (kept as any period from then on)
            for name in state.started:
                state.instances.pop(name, None)
            state.started.intersection_update(_next_periods(req))
        need = _Need(req, state)
        for src in req.sources:
            for f in (src.field, src.field + "!r"):
                if state is None or f not in state.fence:
                    need.fields.append(f)
        for instance in req.instances:
            name, wanted = instance.name, members[instance.name]
            if state is not None and name in state.unstarted:
                continue  # a next rolling period left to the preparer's walk
            inst = state.instances.get(name) if state is not None else None
            if inst is None:
                need.instances.append(instance)
                need.members[name] = wanted
            else:
                missing = [m for m in wanted if m not in inst.cells]
                if inst.complete:
                    inst.cells.update(dict.fromkeys(missing, ABSENT))
                elif missing:
                    need.members[name] = missing
        if req.want_state:
            have = state.metas if state is not None else {}
            need.metas = list(
                {ev.member: None for ev in req.events if ev.op != "x" and ev.member not in have}
            )
        return need

    def _read_boards(self, client: Store, needs: Sequence[_Need]) -> None:
        """One round trip: each board's seq, the fence fields and directories it lacks, whether
        its new instances are in the layout this path writes, the metas it lacks."""
        pipe = client.pipeline(transaction=False)
        for n in needs:
            keys = n.req.keys
            pipe.get(keys.seq)
            pipe.hmget(keys.fence, ["e", *n.fields])
            pipe.get(keys.id_window)
            for instance in n.instances:
                name, packed = instance.name, instance.packing is not None
                role = instance.rolling.role if instance.rolling is not None else ""
                if role == DERIVED:  # whether its preparation began; then as any period
                    pipe.exists(keys.prepared(name))
                if role == BUCKET:
                    pipe.exists(keys.bucket(name))
                    pipe.pexpiretime(keys.bucket(name))
                    continue
                index = keys.tie_index(name)
                pipe.get(index)
                overflow = keys.overflow(name, packed)
                # a state hash, or (without max_members) an overflow zset: apply.lua's to handle
                pipe.exists(keys.state(name), *([] if n.req.max_members else [overflow]))
                pipe.pexpiretime(keys.rank(name, packed))
                first = bucket(b"", index, 0)[0]  # an index that never split has this bucket alone
                pipe.exists(keys.rank(name, packed), overflow, index, first)  # none: an empty instance
                if role == DELTA:
                    pipe.get(keys.prepared(name))
            if n.metas:
                pipe.hmget(keys.meta, n.metas)
        got = iter(pipe.execute())
        for n in needs:
            self._take_board(n, got)

    def _take_board(self, n: _Need, got: Iterator[Any]) -> None:
        n.seq = int(next(got) or 0)
        fence: list[Any] = next(got)
        id_dir = next(got) or b""
        layouts: dict[str, InstanceState | None] = {}
        unstarted: list[str] = []
        started: list[str] = []
        for inst in n.instances:
            role = inst.rolling.role if inst.rolling is not None else ""
            begun = role == DERIVED and int(next(got)) > 0
            if role == BUCKET:
                held, expires = int(next(got)), int(next(got))
                moved = inst.expire_at_ms and expires > 0 and expires != inst.expire_at_ms
                layouts[inst.name] = (
                    None if moved else InstanceState(None, b"", inst.expire_at_ms, complete=held == 0)
                )
                continue
            directory, foreign, expires, held = (
                next(got) or b"",
                int(next(got)),
                int(next(got)),
                int(next(got)),
            )
            # a state hash (an earlier release's layout), an overflow zset (max_members removed),
            # an expiry that moved (retention changed): apply.lua's to handle
            moved = inst.expire_at_ms and expires > 0 and expires != inst.expire_at_ms
            empty = held == 0
            # a rolling period the preparer has not made whole (no marker, or "busy:..."): it may
            # still write it (rebuilds, outside the seq): apply.lua's until it is done
            unprepared = role == DELTA and _unprepared(next(got))
            layout = (
                None
                if foreign or moved or unprepared
                else InstanceState(
                    inst.packing,
                    directory,
                    inst.expire_at_ms,
                    complete=empty,
                    expiry_set=inst.expire_at_ms > 0 and expires == inst.expire_at_ms,
                )
            )
            if role == DERIVED:
                if not begun:  # left to the preparer's walk: nothing of it is needed
                    unstarted.append(inst.name)
                    continue
                if n.req.max_members:  # being prepared, with max_members: apply.lua's to write
                    layout = None
                    self._found_begun(n.req.keys.board, [n.req.keys.prepared(inst.name)])
                elif layout is not None:  # being prepared: read afresh for each chunk
                    started.append(inst.name)
            layouts[inst.name] = layout
        metas = [m.decode() if m else "" for m in next(got)] if n.metas else []
        if n.state is not None and n.seq != n.state.seq:
            return  # stale: dropped and read afresh by the caller
        if any(layout is None for layout in layouts.values()):
            self.drop(n.req.keys.board)
            n.state = None
            return
        state = n.state
        if state is None:
            state = BoardState(n.seq, {"e": fence[0].decode() if fence[0] else ""}, id_dir)
            self._states[n.req.keys.board] = state
        for f, value in zip(n.fields, fence[1:], strict=True):
            state.fence[f] = value.decode() if value else ""
        state.instances.update({name: layout for name, layout in layouts.items() if layout is not None})
        state.unstarted.update(unstarted)
        state.unstarted.difference_update(started)
        state.started.update(started)
        state.metas.update(zip(n.metas, metas, strict=True))
        n.state = state

    def _read_members(self, client: Store, needs: Sequence[_Need]) -> None:
        """Two round trips: the ties of the members the tie indexes know (packed instances: their
        scores), then the scores of those entries. With max_members a member's entry is in the
        rank zset or the overflow: both are read."""
        reads = client.pipeline(transaction=False)
        plan: list[_Read] = []
        for n in needs:
            if n.state is None:
                continue
            for name, members in n.members.items():
                inst = n.state.instances.get(name)
                if inst is None:  # a next rolling period whose preparation has not begun
                    continue
                if inst.complete:
                    inst.cells.update(dict.fromkeys(members, ABSENT))
                else:
                    plan += _queue_reads(reads, n.req, name, inst, members)
        if not plan:
            return
        _read_scores(client, plan, reads.execute())


def _unprepared(mark: bytes | None) -> bool:
    """A rolling period's marker (keys.prepared): absent, or claimed and not yet done. Once done
    (then sealed, sending, sent: worker/results.py) the preparer never writes the period again."""
    return mark is None or mark.startswith(b"busy")


def _read_scores(client: Store, plan: list[_Read], replies: list[Any]) -> None:
    """The second round trip: the scores of the entries whose ties the tie indexes gave."""
    got = iter(replies)
    pipe = client.pipeline(transaction=False)
    ties: list[tuple[_Read, list[tuple[str, int]]]] = []
    for read in plan:
        if not read.zsets:
            for m, raw in zip(read.members, next(got), strict=True):
                st = parse_state(raw) if raw else None
                read.inst.cells[m] = ABSENT if st is None else (st.score, st.tie_ms, st.tie_ms)
            continue
        if read.inst.packing is not None:
            _take_packed(read, [next(got) for _ in read.zsets])
            continue
        if read.joins is not None:  # a league division: one ZMSCORE of the entries themselves
            for m, join, score in zip(read.members, read.joins, next(got), strict=True):
                read.inst.cells[m] = ABSENT if score is None else (float(score), join, join)
            continue
        present = _take_ties(read, next(got))
        if present:
            encoded = [encode_member(read.mode, t, m) for m, t in present]
            for zset in read.zsets:
                pipe.zmscore(zset, encoded)
            ties.append((read, present))
    if not ties:
        return
    got = iter(pipe.execute())
    for read, present in ties:
        scores = _first_found([next(got) for _ in read.zsets])
        for (m, t), score in zip(present, scores, strict=True):
            # an entry the index names but neither zset holds is absent (its index field goes
            # when the member is written: apply.lua's prefetch_indexed)
            read.inst.cells[m] = (None, 0, t) if score is None else (float(score), t, t)


class _Read(NamedTuple):
    inst: InstanceState
    zsets: list[str]  # the rank zset, and with max_members the overflow (a rolling bucket: none)
    members: list[str]
    mode: TieMode
    joins: list[int] | None = None  # a league division: each member's join order (its tie)


def _queue_reads(
    reads: Any, req: ApplyRequest, name: str, inst: InstanceState, members: list[str]
) -> list[_Read]:
    """A packed instance's members' scores; a general one's ties, one HMGET per index bucket."""
    keys, packed = req.keys, inst.packing is not None
    if any(i.name == name and i.rolling is not None and i.rolling.role == BUCKET for i in req.instances):
        # a rolling bucket: its hash holds each member's state
        if not members:
            return []
        reads.hmget(keys.bucket(name), members)
        return [_Read(inst, [], members, req.mode)]
    zsets = [keys.rank(name, packed)] + ([keys.overflow(name, packed)] if req.max_members else [])
    if any(i.name == name and i.joined for i in req.instances):
        # a league division: a member's entry is their id under their join order, no tie index
        joins = _joins(req, name)
        reads.zmscore(zsets[0], [encode_member(req.mode, joins[m], m) for m in members])
        return [_Read(inst, zsets, members, req.mode, [joins[m] for m in members])]
    if packed:
        for zset in zsets:
            reads.zmscore(zset, members)
        return [_Read(inst, zsets, members, req.mode)]
    groups: dict[str, list[str]] = {}
    for m in members:
        groups.setdefault(bucket(inst.directory, keys.tie_index(name), string_slot(m))[0], []).append(m)
    for key, group in groups.items():
        reads.hmget(key, group)
    return [_Read(inst, zsets, group, req.mode) for group in groups.values()]


def _joins(req: ApplyRequest, name: str) -> dict[str, int]:
    """Each member's join order in the league division `name`, from the chunk's events there."""
    at = next(k for k, i in enumerate(req.instances) if i.name == name)
    return {ev.member: ev.join for ev in req.events if ev.op != "x" and ev.mask >> at & 1}


def _first_found(replies: list[list[Any]]) -> list[Any]:
    """Per member, its score in the first zset that holds it (None: none does)."""
    out = list(replies[0])
    for more in replies[1:]:
        out = [a if a is not None else b for a, b in zip(out, more, strict=True)]
    return out


def _take_packed(read: _Read, replies: list[list[Any]]) -> None:
    """A packed instance holds its members under their own ids: their packed scores are the state."""
    assert read.inst.packing is not None
    for m, value in zip(read.members, _first_found(replies), strict=True):
        st = None if value is None else read.inst.packing.unpack(value)
        read.inst.cells[m] = ABSENT if st is None else (st.score, st.tie_ms, st.tie_ms)


def _take_ties(read: _Read, got: list[Any]) -> list[tuple[str, int]]:
    """A general instance's absent members; returns those the tie index knows, with their tie."""
    present = []
    for m, t in zip(read.members, got, strict=True):
        if t is None:
            read.inst.cells[m] = ABSENT
        else:
            present.append((m, int(t)))
    return present
