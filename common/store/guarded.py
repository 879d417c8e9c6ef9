"""guarded.lua's typed wrapper: a board's decided writes (`GuardedWrite`) in, `GuardReply` out.

The worker decides a chunk's outcome from what it knows of the board (worker/decide.py); Redis
runs the writes only if the board is still as the worker read it: the same seq, the same fence
fields, the same directory lengths (a split comes with a seq change), every key it writes of the
type it writes (probed first), and none of the chunk's id fingerprints applied within the id
window. The script's layout (KEYS and ARGV positions) is this module's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from common.store.apply import SLOT_LOST
from common.store.keys import BoardKeys
from common.store.scripts import ArgT, Call, load_script
from common.store.topology import Store

K = ("SEQ", "FENCE", "SLOT", "MOVING", "PROMOTED")  # then the keys the checks and writes name by position
G = (
    "EXPECT",
    "EPOCH",
    "MARKED",
    "NEW_SEQ",
    "NOTIFY",
    "MESSAGE",
    "WINDOW",
    "CAP",
    "NF",
    "ND",
    "NX",
    "NR",
    "NP",
    "NS",
    "NU",
    "NG",
    "NO",
    "PROMOTED",
)
LAYOUTS = (("K", K), ("G", G))


class Command(NamedTuple):
    """One command on one key of the board."""

    name: str
    key: str
    args: tuple[ArgT, ...]


class IdBucket(NamedTuple):
    """Fingerprints added to one id window bucket (depth and prefix: where it sits in its directory)."""

    key: str
    depth: int
    prefix: int
    fingerprints: tuple[bytes, ...]


class IndexBucket(NamedTuple):
    """A tie index bucket's changes: fields dropped, (field, tie) pairs set."""

    key: str
    directory: str
    depth: int
    prefix: int
    expire_at_ms: int  # 0 = never
    drop: tuple[str, ...]
    put: tuple[tuple[str, int], ...]


class Rebalance(NamedTuple):
    """max_members: the instance's rank zset keeps exactly its best members (overflow.lua)."""

    rank: str
    overflow: str
    changed: int  # members just written: the most that can move up
    max_members: int
    desc: bool


Write = Command | IdBucket | IndexBucket | Rebalance


@dataclass
class GuardedWrite:
    keys: BoardKeys
    expect_seq: int  # the seq the worker read
    epoch: str
    slot_mark: str  # "" = one server: not checked
    fence: Sequence[tuple[str, str]]  # (field, value read; '' = absent)
    directories: Sequence[tuple[str, int]]  # (directory key, length read)
    probes: Sequence[tuple[str, str]]  # (key, 'z' | 'h'): read before any write (a foreign type fails)
    unsealed: Sequence[str]  # period markers whose result must not be sealed (keys.prepared)
    checks: Sequence[tuple[str, Sequence[bytes]]]  # (id bucket key, fingerprints that must be new)
    writes: Sequence[Write]
    new_seq: int | None  # None: the seq stays
    notify: str  # a message for the board's change channel; '' = nothing changed
    id_window_s: int
    listpack_cap: int
    expires_at_ms: int = 0  # the earliest expiry of an instance it writes (0: none expires)
    events: int = 0  # the chunk's events
    # what the worker knows of the buckets it writes, from its earlier transactions (Written's
    # `sizes`, `cutoffs` and `refreshed`, while no one else wrote the board): their entries (a tie
    # index bucket's exactly, an id window bucket's at most); per id window bucket, the Redis
    # second every entry in it was applied at or after; per id window key, the Redis second its
    # expiry was last set at or after. A transaction reads none of them again, and sets a known
    # expiry again only once it is that old (native.py _refresh); guarded.lua ignores them.
    known: Mapping[str, int] = field(default_factory=dict)
    cutoffs: Mapping[str, int] = field(default_factory=dict)
    refreshed: Mapping[str, int] = field(default_factory=dict)
    # the markers of next rolling periods the writes leave alone because their preparation has
    # not begun (keys.prepared): none may exist (else Started)
    unstarted: Sequence[str] = ()
    # what the worker read of a next rolling period being prepared, which the preparer writes
    # outside the seq, and the writes assume: the ties of the members written, in their tie index
    # buckets (bucket key, member, tie or b'' for none; watched: a split of one changes it), and
    # the depth the index's directory gave each of those buckets (directory key, position, the
    # byte or b'' for no directory: the walk's splits of other buckets may change the rest)
    unchanged: Sequence[tuple[str, str, bytes]] = ()
    unsplit: Sequence[tuple[str, int, bytes]] = ()
    # whether the worker believes an API node registered the board (BoardKeys.promoted; else
    # Promotion: nothing written)
    promoted: bool = False
    _keys: list[str] = field(default_factory=list)
    _positions: dict[str, int] = field(default_factory=dict)

    def position(self, key: str) -> int:
        at = self._positions.get(key)
        if at is None:
            self._keys.append(key)
            at = self._positions[key] = len(K) + len(self._keys)
        return at

    def key_at(self, position: int | bytes) -> str:
        """The key a reply names by its position (as `call` numbered them)."""
        return self._keys[int(position) - len(K) - 1]

    def call(self) -> Call:
        """The script call (once per request: it numbers the keys as it names them)."""
        keys = self.keys
        head: dict[str, ArgT] = {
            "EXPECT": self.expect_seq,
            "EPOCH": self.epoch,
            "MARKED": "1" if self.slot_mark else "0",
            "NEW_SEQ": "" if self.new_seq is None else self.new_seq,
            "NOTIFY": keys.changes if self.notify else "",
            "MESSAGE": self.notify,
            "WINDOW": self.id_window_s,
            "CAP": self.listpack_cap,
            "NF": len(self.fence),
            "ND": len(self.directories),
            "NX": len(self.unchanged),
            "NR": len(self.unsplit),
            "NP": len(self.probes),
            "NS": len(self.unsealed),
            "NU": len(self.unstarted),
            "NG": len(self.checks),
            "NO": len(self.writes),
            "PROMOTED": "1" if self.promoted else "0",
        }
        args: list[ArgT] = [head[name] for name in G]
        for name, value in self.fence:
            args += [name, value]
        for directory, length in self.directories:
            args += [self.position(directory), length]
        for k, f, held in self.unchanged:
            args += [self.position(k), f, held]
        for k, at, byte in self.unsplit:
            args += [self.position(k), at, byte]
        for probed, kind in self.probes:
            args += [self.position(probed), kind]
        args += [self.position(marker) for marker in self.unsealed]
        args += [self.position(marker) for marker in self.unstarted]
        for bucket, fps in self.checks:
            args += [self.position(bucket), len(fps), *fps]
        for w in self.writes:
            args += op_args(w, self.position, keys.id_window)
        board = [keys.seq, keys.fence, self.slot_mark or keys.fence, keys.moving, keys.promoted]
        return Call([*board, *self._keys], args)


def op_args(w: Write, position: Callable[[str], int], id_directory: str) -> list[ArgT]:
    """One write in guarded.lua's format, its keys named by `position`."""
    if isinstance(w, Command):
        return ["c", w.name, position(w.key), len(w.args), *w.args]
    if isinstance(w, Rebalance):
        return ["r", position(w.rank), position(w.overflow), w.changed, w.max_members, "1" if w.desc else "0"]
    if isinstance(w, IdBucket):
        return [
            "i",
            position(w.key),
            position(id_directory),
            w.depth,
            w.prefix,
            len(w.fingerprints),
            *w.fingerprints,
        ]
    args: list[ArgT] = ["t", position(w.key), position(w.directory), w.depth, w.prefix, w.expire_at_ms]
    args += [len(w.drop), *w.drop, len(w.put)]
    for member, tie in w.put:
        args += [member, tie]
    return args


class Written(NamedTuple):
    directories: dict[str, bytes]  # directory key -> its value, for each a split changed
    # after a transaction (guarded.lua's reply has none): each written bucket's entries, each
    # id window bucket's cutoff and each id window key's refresh, as GuardedWrite's `known`,
    # `cutoffs` and `refreshed` take them
    sizes: Mapping[str, int] = MappingProxyType({})
    cutoffs: Mapping[str, int] = MappingProxyType({})
    refreshed: Mapping[str, int] = MappingProxyType({})


class Conflict(NamedTuple):
    """Someone else wrote the board since the worker read it: nothing was written."""


class Duplicates(NamedTuple):
    """These fingerprints were applied less than the id window ago: nothing was written."""

    fingerprints: frozenset[bytes]


class Sealed(NamedTuple):
    """These periods' results are sealed (final): nothing was written."""

    markers: frozenset[str]


class Foreign(NamedTuple):
    """The board's fence belongs to another epoch (or, SLOT_LOST, its slot lost its data)."""

    found: str


class Started(NamedTuple):
    """A next rolling period's preparation began (or the write could not check it): nothing was
    written; apply.lua writes the chunk."""


class Promotion(NamedTuple):
    """The board's registration by an API node (BoardKeys.promoted) is not what the write
    believed: nothing was written; `promoted` is what it found."""

    promoted: bool


GuardReply = Written | Conflict | Duplicates | Sealed | Foreign | Started | Promotion


class GuardedScript:
    def __init__(self) -> None:
        self.lua = load_script("guarded", LAYOUTS)

    @staticmethod
    def decode(req: GuardedWrite, reply: list[Any]) -> GuardReply:
        kind = int(reply[0])
        if kind == 1:
            return Written({req.key_at(reply[j]): bytes(reply[j + 1]) for j in range(1, len(reply), 2)})
        if kind in (0, 4):  # 4: a next rolling period's preparation began
            return Conflict() if kind == 0 else Started()
        if kind == 2:
            return Duplicates(frozenset(bytes(fp) for fp in reply[1:]))
        if kind == 3:
            return Sealed(frozenset(req.key_at(at) for at in reply[1:]))
        if kind == 5:
            return Promotion(int(reply[1]) == 1)
        found = reply[1]
        return Foreign(found.decode() if isinstance(found, bytes) and found else SLOT_LOST)

    def run_many(self, client: Store, reqs: Sequence[GuardedWrite]) -> list[GuardReply | Exception]:
        """Every request in one round trip; a refused call comes back as its error (it wrote
        nothing: the script checks before its first write)."""
        raw = self.lua.run_many(client, [r.call() for r in reqs], raise_on_error=False)
        return [r if isinstance(r, Exception) else self.decode(q, r) for q, r in zip(reqs, raw, strict=True)]
