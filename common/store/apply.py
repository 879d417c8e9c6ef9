"""apply.lua's typed wrapper: `ApplyRequest` in, `ApplyReply` (or the call's error) out.

One request applies a chunk of events of ONE board atomically (common/store/lua/apply.lua says
how: the offset fence, the id window, the two phases). The positions of the KEYS and ARGV
fields are this module's alone: the script reads its header through the generated `H` table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from common.events import Op
from common.store.encoding import (
    EXACT_MAX,
    MemberState,
    Packing,
    Status,
    TieMode,
    format_score,
    parse_state,
    text,
)
from common.store.keys import BoardKeys
from common.store.scripts import ArgT, Call, load_script
from common.store.topology import Store

# where each field goes (apply.lua reads the positions from the tables of the same names)
KEY = (
    "SEQ",
    "META",
    "FENCE",
    "IDW",
    "SLOT",
    "MOVING",
    "PROMOTED",
)  # the board's keys, then INST per instance
INST = ("RANK", "OVERFLOW", "STATE", "INDEX", "RESET", "PREP")
H = ("W", "E", "MODE", "DESC", "MAXM", "STATE", "EPOCH", "WINDOW", "CAP", "LEGACY_TTL", "S",
     "LOW", "HIGH", "INTEGRAL", "INDEX", "NOTIFY", "BOARD", "MARKED", "PROMOTED")  # ARGV header  # fmt: skip
SRC = ("FIELD", "TOPIC", "LOW")  # ARGV per source, after the header; then IA per instance
# ARGV per instance, after the sources: BITS -1 = general layout; ROLE and the rest: Rolling below
IA = ("EXPIRE", "BITS", "BASE", "ROLE", "GROUP", "FROM", "OLD", "NEW", "KEEP", "SEAL", "JOIN")

# apply.lua refuses an event sent as op `closed` (its board's activity ended) and records it in
# the fence under this name, so a redelivery is dead-lettered board_closed again, whatever the
# clock says then; one applied before the end stays a redelivery (or a duplicate)
BOARD_CLOSED_MARK = "board_closed"
CLOSED_OP = "closed"
FOREIGN_EPOCH = -1  # the reply's first field when the board's fence belongs to another epoch
PROMOTION = -2  # the reply's first field when the board's registration is not what the worker believed
SLOT_LOST = ""  # ForeignEpoch.found when the board has no fence and its slot has lost its mark
UNREPORTED = MemberState(math.nan, -1)  # apply.lua's '~': no state to publish for this instance


@dataclass(frozen=True, slots=True)
class FenceSource:
    """A source partition as the board's fence knows it (worker/apply.py Source)."""

    field: str  # "<topic>:<partition>"
    topic_id: str  # a recreated topic has a new id: its fences start over
    low_water: int  # the last committed offset (-1: none): rejections at or below it are forgotten


class ApplyEvent(NamedTuple):
    """One event's ARGV: its fields in this order are apply.lua's EV layout (a tuple, not an
    object per event: the worker builds one per event)."""

    # incr | set | best | delete, erase | reset (common/control.py: alone in their call, in every
    # instance of it), `x`: a record that the event's processing raised, or `derive`: no event,
    # a member of a rolling period being prepared ahead (worker/rolling.py)
    op: str
    member: str  # for `x`: the error class; for reset: its selector
    score: float
    tie_ms: int  # the event time: orders ties
    meta: str  # '' = none
    mask: int  # bit i: the event counts in the request's i-th instance
    offset: int  # its message's offset (0 without a source)
    where: int  # source number (1-based) * 1000 + array index + 1; 0 = no source
    fingerprint: bytes  # of its id (common/idwindow.py)
    # its member's join order in the league division among its instances (common/league.py):
    # its tie there, so that equal scores in a division rank by join order
    join: int = 0
    legacy_key: str = ""  # while adopting the previous release: its record of the id (else unsent)


class Rolling(NamedTuple):
    """What an instance is to a rolling window (worker/rolling_slots.py; apply.lua says how each
    role is written). `group` names the window: an event's delta in it comes from its bucket."""

    role: str  # BUCKET | DELTA | DERIVED
    group: str  # the window's name
    # DERIVED (period q+1 of the window, prepared ahead): q's instance, the bucket that leaves
    # (q-N+1) and the one that enters (q+1), by name ('' = none in the call)
    source: str = ""
    leaving: str = ""
    entering: str = ""
    keep_from_ms: int = 0  # a member of q stays in q+1 if its latest event is at or after this


BUCKET, DELTA, DERIVED = "b", "d", "f"


class Instance(NamedTuple):
    """One window instance a request writes (the events' masks count in request order)."""

    name: str  # `total`, `<window>:<period id>`, or a rolling bucket's (common/store/keys.py)
    expire_at_ms: int  # 0 = never
    packing: Packing | None = None  # a packed window (common/store/packing.py)
    rolling: Rolling | None = None  # an instance of a rolling window
    # a period whose result is emitted (worker/results.py): the script reads its INST.PREP
    # marker (one GET per call) and leaves it alone once its result is sealed
    sealable: bool = False
    # a league division (common/league.py): its ties are each event's `join`, not its time
    joined: bool = False


@dataclass(frozen=True, slots=True)
class ApplyRequest:
    keys: BoardKeys
    instances: Sequence[Instance]
    mode: TieMode
    desc: bool
    max_members: int  # 0 = unlimited
    want_state: bool  # hot boards: the reply carries each event's resulting states and meta
    epoch: str  # the Redis data set's epoch, written into and checked against the fence
    id_window_s: int
    listpack_cap: int  # id window and tie index buckets split beyond this many entries
    legacy_ttl_ms: int  # > 0 while adopting the previous release's boards
    sources: Sequence[FenceSource]
    events: Sequence[ApplyEvent]
    ids: Sequence[str] = ()  # the events' ids, for logs and tests; not sent
    score_range: tuple[int, int] | None = None  # declared: integer scores within it, else refused
    # a new general window instance gets a tie index (else a state hash, which releases before
    # the tie index also read and write: while one may still be running)
    tie_index: bool = True
    # on a cluster, the mark of the board's slot (common/store/slotmarks.py): a board without a
    # fence is new only if its slot's mark exists; "" = not checked (one server)
    slot_mark: str = ""
    # whether the worker believes an API node registered the board (BoardKeys.promoted): the
    # script refuses the call when it is not so (PromotionChanged), so that every write made
    # while the board is registered reports its states (`want_state` is then true)
    promoted: bool = False


class EventReply(NamedTuple):  # one per event
    status: Status
    seq: int  # the board's seq after the event
    failed_as: str | None  # FAILED: the error class its first delivery raised
    # want_state: per instance of its mask, in bit order; UNREPORTED: a derived rolling period
    # the event did not write (its preparation has not begun): nothing to publish
    states: tuple[MemberState | None, ...]
    meta: bytes | None  # want_state: the member's meta after the event
    # want_state, a reset: per instance the seq of its latest reset (0: none it remembers)
    resets: tuple[int, ...] = ()
    sealed: int = 0  # instances of its mask it skipped, their period's result sealed (late)


@dataclass(frozen=True, slots=True)
class ForeignEpoch:
    """The board's fence was written in another epoch: the call changed nothing."""

    found: str


@dataclass(frozen=True, slots=True)
class PromotionChanged:
    """The board's registration (BoardKeys.promoted) is not what the call believed: the call
    changed nothing; `promoted` is what it found."""

    promoted: bool


ApplyReply = list[EventReply] | ForeignEpoch | PromotionChanged


EV = tuple(name.upper() for name in ApplyEvent._fields)  # ARGV per event (LEGACY_KEY last)
_SCORE = EV.index("SCORE")
LAYOUTS = (("KEY", KEY), ("INST", INST), ("H", H), ("SRC", SRC), ("IA", IA), ("EV", EV))


def _event_args(ev: ApplyEvent) -> tuple[ArgT, ...]:
    """One event's ARGV, in EV's order, the score as its one text form."""
    return (*ev[:_SCORE], format_score(ev.score), *ev[_SCORE + 1 :])


_CONTROL = frozenset({Op.ERASE.value, Op.RESET.value})


def _count_bits(mask: int) -> int:
    return bin(mask).count("1")


class ApplyScript:
    def __init__(self) -> None:
        self.lua = load_script("apply", LAYOUTS)

    @staticmethod
    def call(req: ApplyRequest) -> Call:
        keys = req.keys
        board: dict[str, str] = {
            "SEQ": keys.seq,
            "META": keys.meta,
            "FENCE": keys.fence,
            "IDW": keys.id_window,
            "SLOT": req.slot_mark or keys.fence,  # unread unless MARKED
            # never written: while the board's slot moves (a Redis Cluster migration), a call
            # always declares a key one side lacks, so Redis refuses it (TRYAGAIN) on both sides
            # instead of running it with undeclared keys (id window and tie index buckets) split
            "MOVING": keys.moving,
            "PROMOTED": keys.promoted,  # read: its existence must be what PROMOTED says
        }
        key_list = [board[name] for name in KEY]
        for name, _, packing, rolling, _, _ in req.instances:
            packed = packing is not None
            bucket = rolling is not None and rolling.role == BUCKET
            per: dict[str, str] = {
                "RANK": keys.rank(name, packed),
                "OVERFLOW": keys.overflow(name, packed),
                # the previous release's; unused by a packed window; a rolling bucket's hash
                "STATE": keys.bucket(name) if bucket else keys.state(name),
                "INDEX": keys.tie_index(name),  # unused by a packed window
                "RESET": keys.reset_mark(name),  # read and written by a reset only
                # read for a derived rolling period, and a sealable period (its result's state)
                "PREP": keys.prepared(name),
            }
            key_list += [per[field] for field in INST]
        header: dict[str, str | int] = {
            "W": len(req.instances),
            "E": len(req.events),
            "MODE": req.mode.value,
            "DESC": "1" if req.desc else "0",
            "MAXM": req.max_members,
            "STATE": "1" if req.want_state else "0",
            "EPOCH": req.epoch,
            "WINDOW": req.id_window_s,
            "CAP": req.listpack_cap,
            "LEGACY_TTL": req.legacy_ttl_ms,
            "S": len(req.sources),
            "LOW": -EXACT_MAX if req.score_range is None else req.score_range[0],
            "HIGH": EXACT_MAX if req.score_range is None else req.score_range[1],
            "INTEGRAL": "0" if req.score_range is None else "1",
            "INDEX": "1" if req.tie_index else "0",
            # a call that changed the board tells the API nodes (api/warm.py): PUBLISH on this
            "NOTIFY": keys.changes,
            "BOARD": keys.board,
            "MARKED": "1" if req.slot_mark else "0",
            "PROMOTED": "1" if req.promoted else "0",
        }
        args: list[ArgT] = [header[name] for name in H]
        for source in req.sources:
            fields: dict[str, str | int] = {
                "FIELD": source.field,
                "TOPIC": source.topic_id,
                "LOW": source.low_water,
            }
            args += [fields[name] for name in SRC]
        position = {inst.name: n for n, inst in enumerate(req.instances, 1)}
        groups: dict[str, int] = {}
        for _, expire, packing, rolling, sealable, joined in req.instances:
            per_arg: dict[str, int | str] = {
                "EXPIRE": expire,
                "BITS": -1 if packing is None else packing.bits,
                "BASE": 0 if packing is None else packing.base_ms,
                "ROLE": "z" if rolling is None else rolling.role,
                "GROUP": 0 if rolling is None else groups.setdefault(rolling.group, len(groups) + 1),
                "FROM": 0 if rolling is None else position.get(rolling.source, 0),
                "OLD": 0 if rolling is None else position.get(rolling.leaving, 0),
                "NEW": 0 if rolling is None else position.get(rolling.entering, 0),
                "KEEP": 0 if rolling is None else rolling.keep_from_ms,
                "SEAL": "1" if sealable else "0",
                "JOIN": "1" if joined else "0",
            }
            args += [per_arg[name] for name in IA]
        legacy = req.legacy_ttl_ms > 0  # EV's last field, LEGACY_KEY, is sent only while adopting
        for ev in req.events:
            args += _event_args(ev) if legacy else _event_args(ev)[:-1]
        return Call(key_list, args, req.ids)

    @staticmethod
    def decode(req: ApplyRequest, reply: list[Any]) -> ApplyReply:
        if reply and int(reply[0]) == FOREIGN_EPOCH:
            return ForeignEpoch(text(reply[1]))
        if reply and int(reply[0]) == PROMOTION:
            return PromotionChanged(int(reply[1]) == 1)
        out: list[EventReply] = []
        pos = 0
        sealable = any(inst.sealable for inst in req.instances)
        for ev in req.events:
            status, seq = Status(int(reply[pos])), int(reply[pos + 1])
            pos += 2
            failed_as = None
            if status is Status.FAILED:
                failed_as = text(reply[pos])
                pos += 1
            sealed = 0
            if sealable:
                sealed = int(reply[pos])
                pos += 1
            states: tuple[MemberState | None, ...] = ()
            resets: tuple[int, ...] = ()
            meta: bytes | None = None
            if req.want_state:
                # a control op counts in every instance of its call, whatever its mask (0)
                n = len(req.instances) if ev.op in _CONTROL else _count_bits(ev.mask)
                if ev.op == Op.RESET:  # no member: per instance its latest reset's seq ('': none)
                    states = (None,) * n
                    resets = tuple(int(raw or 0) for raw in reply[pos : pos + n])
                else:
                    states = tuple(
                        UNREPORTED if raw == b"~" else parse_state(raw) for raw in reply[pos : pos + n]
                    )
                meta = reply[pos + n] or None
                pos += n + 1
            out.append(EventReply(status, seq, failed_as, states, meta, resets, sealed))
        return out

    def run_many(self, client: Store, reqs: Sequence[ApplyRequest]) -> list[ApplyReply | Exception]:
        """Every request in one round trip; a call the script refused comes back as its error
        (it changed nothing); a connection failure raises on one server, and comes back in its
        calls' places from a cluster pipeline."""
        raw = self.lua.run_many(client, [self.call(r) for r in reqs], raise_on_error=False)
        return [r if isinstance(r, Exception) else self.decode(q, r) for q, r in zip(reqs, raw, strict=True)]
