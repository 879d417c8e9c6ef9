"""A board's decided writes (common/store/guarded.py's `GuardedWrite`) as native commands in a
MULTI/EXEC: the same checks and the same writes as guarded.lua, without a script (Lua costs Redis
a fixed ~18 µs a call before any work, and its splits of the id window's and tie indexes' buckets
cost several times what the same moves cost as commands: docs/internals/write-path.md).

Every board of a round goes at once, each on a connection of its own (a WATCH holds for its
connection only), in two round trips, three when a bucket may split:
1. WATCH the board's seq, fence, slot mark, directories, seal markers and registration by API
   nodes, and read what guarded.lua checks: the registration, the fence, the seq, the
   directories' lengths, each written key with the
   type it is written as (and its size), the seal markers, the id window's fingerprints, TIME.
   A bucket the board's earlier transactions left is not read: their replies (HSET's, HDEL's,
   ZADD's, ZREMRANGEBYSCORE's counts) told the worker its size (GuardedWrite `known`).
2. Only for a bucket that may outgrow its cap: its entries and its directory, to split it here
   (common/store/xhash.py, xhash.lua's rules).
3. If the checks pass: MULTI, the writes, EXEC. Redis runs none of them if a watched key changed.

Why watching those keys guards every key written: each writer of a board's keys changes one of
them with its writes. Appliers (apply.lua, guarded.lua, this) set the seq whenever an event is
applied, which is when they write members, tie indexes, the id window or the overflow, and write
the fence otherwise; a split changes its directory; the results emitter writes the seal markers;
the rolling preparer writes only next periods whose preparation began (derive, rebuild), after it
set their marker: a decided write leaves those periods alone, WATCHes their markers and checks
that none exists (GuardedWrite `unstarted`; else Started: apply.lua writes the chunk). A key's
expiry is the one change without a writer: an instance that expires within EXPIRY_MARGIN_MS goes
through guarded.lua instead, and an id window bucket expires only once every entry in it is older
than the window (its loss changes no decision). In a Redis Cluster, a slot being migrated answers
the transaction's first command (EXISTS on a key never written) with ASK when it is queued, and
Redis then refuses the whole transaction. max_members' rebalance runs as a small script inside
the transaction (rebalance.lua), once per instance and round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.cluster import RedisCluster
from redis.connection import ConnectionPool

from common.idwindow import key_ttl_ms, slack_s
from common.store.apply import SLOT_LOST
from common.store.guarded import (
    Command,
    Conflict,
    Duplicates,
    Foreign,
    GuardedWrite,
    GuardReply,
    IdBucket,
    IndexBucket,
    Promotion,
    Rebalance,
    Sealed,
    Started,
    Written,
)
from common.store.keys import INDEX_EXPIRY_SPREAD_MS, string_slot
from common.store.pipe import pack
from common.store.scripts import ArgT, load_script
from common.store.topology import Store, node_client
from common.store.xhash import Bucket, bytes_slot, entry_slot, split, splits

_log = logging.getLogger(__name__)
R = ("CHANGED", "MAX", "DESC")
EXPIRY_MARGIN_MS = 60_000  # an instance expiring sooner is written by guarded.lua (see above)
# a board's chunk of fewer events goes through guarded.lua: one call on the shared pipelined
# connection costs Redis less than a transaction on a connection of its own (bench/redis_cost.py
# `small_chunks`, transactions that know their buckets: at 1, 2 and 3 events a board the script
# costs 0.5x, 0.59x and 0.69x the transaction's Redis CPU; at 5 events 1.3-2x)
MIN_EVENTS = 5
# at most this many boards of a round go this way, the largest chunks first (each holds a
# connection for the round: a batch over thousands of boards must not open thousands)
MAX_BOARDS = 64
Cmd = tuple[ArgT, ...]
_FAILURES = (redis.ConnectionError, redis.TimeoutError, OSError)


def native(write: GuardedWrite, now_ms: float, min_events: int = MIN_EVENTS) -> bool:
    """Whether `write` may go this way (else guarded.lua takes it)."""
    soon = write.expires_at_ms != 0 and write.expires_at_ms - now_ms <= EXPIRY_MARGIN_MS
    return write.events >= min_events and not soon


class Declined(NamedTuple):
    """Not written this way: an instance it writes expires within EXPIRY_MARGIN_MS by Redis'
    clock (the worker's own is only a first guess); guarded.lua takes it."""


@dataclass
class _Board:
    """One board's transaction: its connection, what it read, how it ended."""

    req: GuardedWrite
    pool: ConnectionPool
    conn: Any = None
    expect: int = 0  # replies to read next
    reply: GuardReply | Exception | Declined | None = None
    sock: Any = None  # the socket the WATCH was sent on
    sizes: dict[str, int] = field(default_factory=dict)  # each written key's entries, as read
    now: int = 0  # Redis' TIME (s)
    risky: list[IdBucket | IndexBucket] = field(default_factory=list)  # buckets that may split
    entries: dict[str, dict[bytes, bytes]] = field(default_factory=dict)  # theirs, as read
    dirs: dict[str, bytes] = field(default_factory=dict)  # their directories, as read, then split
    split: set[str] = field(default_factory=set)  # directories a split changed
    # the written buckets' entries after EXEC: key -> (entries before, [(EXEC reply index, +1 |
    # -1)]: the replies that count entries added or removed); a split's parts, exactly
    tally: dict[str, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)
    parts: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, int] = field(default_factory=dict)  # id window buckets' after EXEC
    refreshed: dict[str, int] = field(default_factory=dict)  # id window keys' after EXEC

    @property
    def id_ttl_ms(self) -> int:
        """An id window key's expiry (IDW.flush sets a window and a second on each insert; this
        adds the slack: see _refresh)."""
        return key_ttl_ms(self.req.id_window_s)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(reply: Any) -> dict[bytes, bytes]:
    """HGETALL's or ZRANGE WITHSCORES' reply as an ordered map (RESP2: a flat list; RESP3: a
    map, or a list of pairs with scores as numbers)."""
    if isinstance(reply, dict):
        return dict(reply)
    if reply and isinstance(reply[0], list):
        return {m: _score(s) for m, s in reply}
    return {reply[j]: reply[j + 1] for j in range(0, len(reply), 2)}


def _score(score: Any) -> bytes:
    if isinstance(score, bytes):
        return score
    return repr(int(score) if float(score).is_integer() else score).encode()


class NativeWrites:
    def __init__(self) -> None:
        self.rebalance = load_script("rebalance", (("R", R),))

    def run_many(
        self, client: Store, reqs: Sequence[GuardedWrite]
    ) -> list[GuardReply | Exception | Declined]:
        """Each request's reply as guarded.lua's would be; a request refused with an error (a
        key of another type, a redirect, a lost connection) comes back as that error, and wrote
        nothing unless the connection was lost while EXEC ran (as a script call's reply can be).
        Declined: an instance expires soon by Redis' clock (nothing written: guarded.lua's)."""
        boards = [_Board(req, _pool(client, req)) for req in reqs]
        try:
            self._run(boards)
        except BaseException:  # a bug, or an interrupt: no connection goes back mid-transaction
            for b in boards:
                _drop(b)
            raise
        return [b.reply if b.reply is not None else Conflict() for b in boards]

    def _run(self, boards: list[_Board]) -> None:
        for b in boards:
            _send(b, self._reads(b.req))
        for b in boards:
            if (got := _receive(b)) is not None:
                b.reply = self._check(b, got)
                if b.reply is not None:
                    _send(b, [("UNWATCH",)])
                elif b.risky:
                    _send(b, self._bucket_reads(b))
                else:
                    _send(b, self._transaction(b))
        for b in boards:
            if b.reply is None and b.risky and (got := _receive(b)) is not None:
                _send(b, self._transaction(b) if self._take_buckets(b, got) else [("UNWATCH",)])
        for b in boards:
            got = _receive(b)
            if b.reply is None and got is not None:
                b.reply = self._written(b, got[-1])
            _release(b)

    # --- 1. the guard's reads -------------------------------------------------------------------
    @staticmethod
    def _reads(req: GuardedWrite) -> list[Cmd]:
        keys = req.keys
        watched = [keys.seq, keys.fence, *(d for d, _ in req.directories), *req.unsealed, *req.unstarted]
        watched += [k for k, _, _ in req.unchanged]
        watched += [req.slot_mark] if req.slot_mark else []
        watched.append(keys.promoted)  # an API node's registration: guarded.lua checks it too
        cmds: list[Cmd] = [("WATCH", *dict.fromkeys(watched))]
        cmds.append(("HMGET", keys.fence, "e", *(f for f, _ in req.fence)))
        cmds.append(("EXISTS", req.slot_mark or keys.fence))
        cmds.append(("GET", keys.seq))
        cmds += [("STRLEN", d) for d, _ in req.directories]
        cmds += [("HGET", k, f) for k, f, _ in req.unchanged]
        cmds += [("GETRANGE", k, at, at) for k, at, _ in req.unsplit]
        cmds += _size_reads(req)
        cmds += [("GET", m) for m in req.unsealed]
        cmds += [("EXISTS", *req.unstarted)] if req.unstarted else []
        cmds += [("ZMSCORE", bucket, *fps) for bucket, fps in req.checks]
        cmds += [("EXISTS", keys.promoted), ("EXISTS", keys.moving), ("TIME",)]
        return cmds

    def _check(self, b: _Board, got: list[Any]) -> GuardReply | Exception | Declined | None:
        """guarded.lua's checks, in its order, on what the reads found; None: write."""
        req = b.req
        refused = _guard(req, got)
        if refused is not None:
            return refused
        b.now = int(got[-1][0]) if not isinstance(got[-1], Exception) else 0
        if req.expires_at_ms and req.expires_at_ms - b.now * 1000 <= EXPIRY_MARGIN_MS:
            return Declined()  # by Redis' own clock, which expires the keys
        failed = next((r for r in got if isinstance(r, Exception)), None)
        if failed is not None:  # a key of another type where the board writes (or a redirect)
            return failed
        rest = iter(got[4 + len(req.directories) + len(req.unchanged) + len(req.unsplit) :])
        b.sizes = dict(req.known)  # the buckets the worker knows are not read again
        b.sizes.update({str(cmd[1]): int(next(rest)) for cmd in _size_reads(req)})
        marked = _marks(req, rest)
        if marked is not None:
            return marked
        scores = [next(rest) for _ in req.checks]
        dups = [
            fp
            for (_, fps), found in zip(req.checks, scores, strict=True)
            for fp, score in zip(fps, found, strict=True)
            if score is not None and b.now - float(score) < req.id_window_s
        ]
        if dups:
            return Duplicates(frozenset(dups))
        cap = req.listpack_cap
        b.risky = [
            w
            for w in req.writes
            if (isinstance(w, IdBucket) and b.sizes[w.key] + len(w.fingerprints) > cap)
            or (isinstance(w, IndexBucket) and b.sizes[w.key] + len(w.put) > cap)
        ]
        return None

    # --- 2. the entries of the buckets that may split -------------------------------------------
    @staticmethod
    def _bucket_reads(b: _Board) -> list[Cmd]:
        cmds: list[Cmd] = [
            ("HGETALL", w.key) if isinstance(w, IndexBucket) else ("ZRANGE", w.key, 0, -1, "WITHSCORES")
            for w in b.risky
        ]
        directories = dict.fromkeys(_directory(b.req, w) for w in b.risky)
        b.dirs = dict.fromkeys(directories, b"")
        # watched from here: a next rolling period's index, whose directory the preparer's walk
        # may change outside the seq (the board's other directories are watched already)
        return [("WATCH", *directories), *cmds, *(("GET", d) for d in directories)]

    @staticmethod
    def _take_buckets(b: _Board, got: list[Any]) -> bool:
        """Whether the entries came (else the reply is the error, and nothing is written)."""
        failed = next((r for r in got if isinstance(r, Exception)), None)
        if failed is not None:
            b.reply = failed
            return False
        got = got[1:]  # the WATCH's
        for w, flat in zip(b.risky, got, strict=False):
            b.entries[w.key] = _pairs(flat)
        for d, value in zip(list(b.dirs), got[len(b.risky) :], strict=True):
            b.dirs[d] = value or b""
        return True

    # --- 3. the transaction ---------------------------------------------------------------------
    def _transaction(self, b: _Board) -> list[Cmd]:
        req = b.req
        keys = req.keys
        cmds: list[Cmd] = [("MULTI",), ("EXISTS", keys.moving)]
        ids = False
        for w in req.writes:
            if isinstance(w, Command):
                cmds.append((w.name, w.key, *w.args))
            elif isinstance(w, Rebalance):
                head = {"CHANGED": w.changed, "MAX": w.max_members, "DESC": "1" if w.desc else "0"}
                # EVAL, not EVALSHA: a script Redis lost (a restart) would fail inside EXEC
                cmds.append(("EVAL", self.rebalance.source, 2, w.rank, w.overflow, *(head[n] for n in R)))
            elif isinstance(w, IdBucket):
                ids = True
                self._ids(b, w, cmds)
            else:
                self._index(b, w, cmds)
        id_dir = b.dirs.get(keys.id_window)
        id_dir_len = len(id_dir) if id_dir is not None else dict(req.directories).get(keys.id_window, 0)
        if ids and id_dir_len > 0:  # the id window's directory lives one window after its last insert
            _refresh(b, keys.id_window, cmds)
        if req.new_seq is not None:
            cmds.append(("SET", keys.seq, req.new_seq))
        if req.notify:  # last, as apply.lua: the API nodes' warm caches drop the board
            cmds.append(("PUBLISH", keys.changes, req.notify))
        cmds.append(("EXEC",))
        return cmds

    @staticmethod
    def _ids(b: _Board, w: IdBucket, cmds: list[Cmd]) -> None:
        """An id window bucket's new fingerprints, stamped with Redis' time: guarded.lua's 'i'.
        Its entries applied a window ago or more go first, unless the worker knows there are none
        older than slack_s beyond the window (each id is then kept that much longer at most)."""
        window = b.req.id_window_s
        stamp = str(b.now).encode()
        live_from = b.now - window + 1
        entries = b.entries.get(w.key)
        if entries is not None:  # it may split
            live = {m: s for m, s in entries.items() if float(s) >= live_from}
            new = sum(1 for fp in w.fingerprints if fp not in live)
            live.update(dict.fromkeys(w.fingerprints, stamp))
            done = _split(b, w, live, new)
            if done is not None:
                cmds += done
                return
        before = b.sizes[w.key]
        cutoff = b.req.cutoffs.get(w.key, b.now if before == 0 else None)
        counts = b.tally[w.key] = (before, [])
        if entries is not None or cutoff is None or cutoff < live_from - slack_s(window):
            counts[1].append((len(cmds) - 1, -1))
            cmds.append(("ZREMRANGEBYSCORE", w.key, "-inf", f"({live_from}"))
            cutoff = live_from
        b.cutoffs[w.key] = cutoff
        counts[1].append((len(cmds) - 1, 1))
        cmds.append(("ZADD", w.key, *(x for fp in w.fingerprints for x in (stamp, fp))))
        _refresh(b, w.key, cmds)

    @staticmethod
    def _index(b: _Board, w: IndexBucket, cmds: list[Cmd]) -> None:
        """A tie index bucket's fields dropped and set: guarded.lua's 't'."""
        entries = b.entries.get(w.key)
        new_bucket = b.sizes[w.key] == len(w.drop)  # empty once its dropped fields went
        if entries is not None:  # it may split
            for m in w.drop:
                entries.pop(m.encode(), None)
            new_bucket = not entries
            new = 0
            for m, tie in w.put:
                new += m.encode() not in entries
                entries[m.encode()] = str(tie).encode()
            if new:
                done = _split(b, w, entries, new)
                if done is not None:
                    cmds += done
                    return
        counts = b.tally[w.key] = (b.sizes[w.key], [])
        if w.drop:
            counts[1].append((len(cmds) - 1, -1))
            cmds.append(("HDEL", w.key, *w.drop))
        if w.put:
            counts[1].append((len(cmds) - 1, 1))
            cmds.append(("HSET", w.key, *(x for m, t in w.put for x in (m, t))))
            if new_bucket:
                cmds += _index_expiry(w.key, w.expire_at_ms)

    def _written(self, b: _Board, reply: Any) -> GuardReply | Exception:
        if reply is None:  # a watched key changed: Redis ran nothing
            return Conflict()
        if isinstance(reply, Exception):
            return reply
        failed = next((r for r in reply if isinstance(r, Exception)), None)
        if failed is not None:  # the checks rule it out: said loudly, and apply.lua takes the chunk
            _log.error("a native write failed inside its transaction", extra={"error": str(failed)})
            return failed
        sizes = dict(b.parts)
        for key, (before, counted) in b.tally.items():
            sizes[key] = before + sum(sign * int(reply[at]) for at, sign in counted)
        return Written({d: b.dirs[d] for d in b.split}, sizes, b.cutoffs, b.refreshed)


def _guard(req: GuardedWrite, got: list[Any]) -> GuardReply | Exception | None:
    """The board is the one the worker read: its registration by API nodes, epoch, slot mark,
    seq, fence, directories and the values it read of a next rolling period being prepared."""
    promoted = got[-3]  # EXISTS of the board's registration by API nodes
    if not isinstance(promoted, Exception) and int(promoted) != int(req.promoted):
        return Promotion(int(promoted) == 1)
    stored, marked, seq = got[1], got[2], got[3]
    lengths = got[4 : 4 + len(req.directories)]
    held = [*req.unchanged, *req.unsplit]
    values = got[4 + len(req.directories) : 4 + len(req.directories) + len(held)]
    failed = next((r for r in (stored, marked, seq, *lengths, *values) if isinstance(r, Exception)), None)
    if failed is not None:
        return failed
    epoch = stored[0]
    if epoch is not None and _s(epoch) != req.epoch:
        return Foreign(_s(epoch))
    if req.slot_mark and epoch is None and int(marked) == 0:
        return Foreign(SLOT_LOST)
    changed = (
        _s(seq or b"0") != str(req.expect_seq)
        or any(_s(found or b"") != value for (_, value), found in zip(req.fence, stored[1:], strict=True))
        or any(int(found) != length for (_, length), found in zip(req.directories, lengths, strict=True))
        or any((found or b"") != value for (_, _, value), found in zip(held, values, strict=True))
    )
    return Conflict() if changed else None


def _refresh(b: _Board, key: str, cmds: list[Cmd]) -> None:
    """Id window key `key` lives at least a window and a second past this transaction: its
    expiry is set (id_ttl_ms) unless the worker knows it was set slack_s ago or less (by its own
    transactions: any other write of the board, a guarded.lua call of its own included, makes
    it forget), which leaves it a window, a second and what remains of the slack."""
    known = b.refreshed.get(key, b.req.refreshed.get(key))
    if known is not None and known + slack_s(b.req.id_window_s) >= b.now:
        b.refreshed[key] = known
        return
    _expire(b, key, cmds)


def _expire(b: _Board, key: str, cmds: list[Cmd]) -> None:
    """Id window key `key`'s expiry set (id_ttl_ms), and when (the record _refresh reads)."""
    cmds.append(("PEXPIRE", key, b.id_ttl_ms))
    b.refreshed[key] = b.now


def _size_reads(req: GuardedWrite) -> list[Cmd]:
    """The sizes round trip 1 reads, in _check's order (each read as the type it is written as):
    the probed keys and the id window buckets written, but for the buckets the worker knows."""
    cmds: list[Cmd] = [
        ("ZCARD" if kind == "z" else "HLEN", k) for k, kind in req.probes if k not in req.known
    ]
    cmds += [("ZCARD", w.key) for w in req.writes if isinstance(w, IdBucket) and w.key not in req.known]
    return cmds


def _marks(req: GuardedWrite, rest: Iterator[Any]) -> Sealed | Started | None:
    """The periods' markers: a result sealed, a next rolling period's preparation begun."""
    marks = [next(rest) for _ in req.unsealed]
    sealed = [m for m, mark in zip(req.unsealed, marks, strict=True) if mark and _s(mark)[:1] == "s"]
    if sealed:
        return Sealed(frozenset(sealed))
    if req.unstarted and int(next(rest)) > 0:
        return Started()
    return None


def _directory(req: GuardedWrite, w: IdBucket | IndexBucket) -> str:
    return req.keys.id_window if isinstance(w, IdBucket) else w.directory


def _index_expiry(key: str, expire_at_ms: int) -> list[Cmd]:
    """A tie index key's expiry (tieindex.lua's): its instance's, spread by the key's name."""
    if not expire_at_ms:
        return []
    return [("PEXPIREAT", key, expire_at_ms + string_slot(key) % INDEX_EXPIRY_SPREAD_MS)]


def _split(b: _Board, w: IdBucket | IndexBucket, entries: dict[bytes, bytes], new: int) -> list[Cmd] | None:
    """The commands of bucket `w.key`'s split, if it splits (xhash.lua XH.settle_at), holding
    `entries` after the batch's writes, `new` of them just added; None if it doesn't."""
    req, index = b.req, isinstance(w, IndexBucket)
    directory = _directory(req, w)
    if not splits(w.depth, req.listpack_cap, len(entries), new):
        return None
    slot = entry_slot if index else bytes_slot
    at = Bucket(w.key, w.depth, w.prefix)
    done = split(directory, b.dirs[directory], at, entries, cap=req.listpack_cap, slot=slot)
    if done is None:
        return None
    b.split.add(directory)
    expire_at = w.expire_at_ms if isinstance(w, IndexBucket) else 0
    cmds: list[Cmd] = [("DEL", w.key)]
    b.parts.update(dict.fromkeys(done.empty, 0))
    for part_key, part in done.buckets.items():
        b.parts[part_key] = len(part)
        if not index:
            b.cutoffs[part_key] = b.now - req.id_window_s + 1
        if index:
            cmds.append(("HSET", part_key, *(x for e, v in part.items() for x in (e, v))))
            cmds += _index_expiry(part_key, expire_at)
        else:
            cmds.append(("ZADD", part_key, *(x for e, v in part.items() for x in (v, e))))
            _expire(b, part_key, cmds)
    before = b.dirs[directory]
    cmds += directory_writes(directory, before, done.directory, at)
    b.dirs[directory] = done.directory
    if index:
        cmds += _index_expiry(directory, expire_at)
    elif not before:  # a directory just made: no expiry yet
        _expire(b, directory, cmds)
    else:
        _refresh(b, directory, cmds)
    return cmds


def directory_writes(key: str, before: bytes, after: bytes, at: Bucket) -> list[Cmd]:
    """A split's change of the directory (a byte per slot) from `before` to `after`, as written:
    the slots it deepened (one BITFIELD: only those of bucket `at`, the slots s = at.prefix
    mod 2^at.depth, can change), and the half a doubling added (APPEND); not the whole directory
    again (4 KB at 4,096 buckets, on every split). One it makes is SET (xhash.lua's split sets
    the whole value: the bytes are the same)."""
    if not before:
        return [("SET", key, after, "KEEPTTL")]
    changed = [s for s in range(at.prefix, len(before), 1 << at.depth) if before[s] != after[s]]
    cmds: list[Cmd] = []
    if changed:
        cmds.append(("BITFIELD", key, *(x for s in changed for x in ("SET", "u8", f"#{s}", after[s]))))
    if len(after) > len(before):
        cmds.append(("APPEND", key, after[len(before) :]))
    return cmds


# --- connections ----------------------------------------------------------------------------------
def _send(b: _Board, cmds: list[Cmd]) -> None:
    """The first round trip takes a connection; the next ones must go on the very socket that
    sent the WATCH: redis-py reconnects silently (a health check, or a socket it closed), and a
    new connection has no WATCH."""
    packed = [b"".join(pack(cmd) for cmd in cmds)]  # hiredis packs (C)
    try:
        if b.conn is None:
            b.conn = b.pool.get_connection()
            b.conn.send_packed_command(packed)
            b.sock = b.conn._sock
        elif b.conn._sock is None or b.conn._sock is not b.sock:
            raise redis.ConnectionError("the connection was reset between round trips")
        else:
            b.conn.send_packed_command(packed, check_health=False)
        b.expect = len(cmds)
    except _FAILURES as exc:
        _lost(b, exc)


def _receive(b: _Board) -> list[Any] | None:
    """The replies to what was sent last (an error reply in its place); None if the connection
    was lost."""
    if b.conn is None:
        return None
    try:
        return _replies(b.conn, b.expect)
    except _FAILURES as exc:
        _lost(b, exc)
        return None


def _replies(conn: Any, n: int) -> list[Any]:
    """n replies, an error reply as its exception. Straight from the connection's hiredis reader
    (redis-py's read_response costs ~4 µs of Python a reply, and a transaction has ~2 an event),
    else one by one."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    out: list[Any] = []
    if reader is None or not hasattr(parser, "read_from_socket"):  # no hiredis: redis-py's way
        for _ in range(n):
            try:
                out.append(conn.read_response())
            except redis.ResponseError as exc:
                out.append(exc)
        return out
    while len(out) < n:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            parser.read_from_socket()  # the socket's timeout; raises ConnectionError, TimeoutError
        elif isinstance(reply, redis.ConnectionError):
            raise reply
        else:
            out.append(reply)
    return out


def _lost(b: _Board, exc: Exception) -> None:
    b.reply = exc if isinstance(exc, redis.RedisError) else redis.ConnectionError(str(exc))
    _drop(b)


def _drop(b: _Board) -> None:
    """Close the board's connection (its WATCH, its unread replies) and give it back."""
    if b.conn is not None:
        b.conn.disconnect()
        b.pool.release(b.conn)
        b.conn = None


def _release(b: _Board) -> None:
    if b.conn is not None:
        b.pool.release(b.conn)
        b.conn = None


def _pool(client: Store, req: GuardedWrite) -> ConnectionPool:
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(req.keys.seq)  # type: ignore[no-untyped-call]
        pool: ConnectionPool = node_client(client, node).connection_pool
        return pool
    return client.connection_pool
