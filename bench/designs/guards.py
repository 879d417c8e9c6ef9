"""Where the guard of a write the worker decided goes: WATCH + MULTI/EXEC, or a thin script.

The worker decides a batch's writes from its own state of the board; Redis must execute them
only if nobody wrote the board since the worker read it (a zombie, a second worker on the same
board, the rolling preparer). Two guards around the same writes, and two references:
- watch:  WATCH <seq>, GET <seq> and the id window's ZMSCOREs in one round trip; then MULTI, the
          writes, INCR <seq>, EXEC in a second: EXEC refuses if <seq> changed in between.
- script: GET <seq> and the ZMSCOREs in one round trip; then one EVALSHA of a thin script that
          compares <seq> with the value read and, if equal, runs the prepared write list
          (command, key by index, arguments) and INCRs <seq>.
- none:   the same two round trips, the writes in MULTI/EXEC without a guard (the guard's price).
- bare:   3 pipelined ZINCRBY per event (bench/redis_cost.py's reference).
The writes of a batch: its events' id fingerprints ZADDed into their bucket zsets; per window a
ZREM of the members' old tie-prefixed entries and one ZADD of the new ones, the tie index's HSETs;
the fence HSET; INCR <seq>. One write per (member, window) however many of the batch's events
it has (the worker's state starts empty, so a prefilled member's first entry is not removed).

Redis CPU per event from INFO cpu on a private redis-server (no persistence), three streams
(distinct members, 2,000 repeating, Zipf(1.1) over the 100k prefilled), 3 windows, batches of
500, best of ROUNDS; the client's wall time per batch (round trips included); and, per guard, a
check that a write between the read and the write makes it refuse.

    .venv/bin/python -m bench.designs.guards   [RANKSTREAM_BENCH_GUARD_EVENTS=200000]
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from bench.common import REPO, env_int, zipf_cum_weights
from rankstream.stack import LocalRedis, free_port

WINDOWS, BATCH, PREFILL, BUCKETS, ROUNDS = ("total", "day", "week"), 500, 100_000, 64, 2
THIN = """
local seq = redis.call('GET', KEYS[1])
if (seq or '') ~= ARGV[1] then return false end
local j = 3
for _ = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[j + 2])
  redis.call(ARGV[j], KEYS[tonumber(ARGV[j + 1])], unpack(ARGV, j + 3, j + 2 + n))
  j = j + 3 + n
end
return redis.call('INCR', KEYS[1])
"""
Event = tuple[str, str, int, int]  # id, member, score, ts
Command = tuple[Any, ...]
Meddle = Callable[[], object]  # what happens between a batch's read and its write
Guarded = Callable[[Any, "Board", Sequence[Event], Meddle], bool]


def stream(kind: str, n: int) -> list[Event]:
    rng = random.Random(11)
    if kind == "distinct":
        members = [f"user-{rng.randrange(10**9):012d}-abcdefghij" for _ in range(n)]
    elif kind == "repeating":
        pool = [f"user-{i:012d}-abcdefghij" for i in range(2000)]
        members = [rng.choice(pool) for _ in range(n)]
    else:
        pool = [f"user-{i:012d}-abcdefghij" for i in range(PREFILL)]
        members = rng.choices(pool, cum_weights=zipf_cum_weights(PREFILL, 1.1), k=n)
    return [(f"evt-{k:012d}-{rng.randrange(10**12)}", m, rng.randrange(1, 100), 1795811399000 + k)
            for k, m in enumerate(members)]  # fmt: skip


class Board:
    """One board's keys and the worker's state of it."""

    def __init__(self, prefix: str) -> None:
        tag = f"{prefix}{{b}}"
        self.seq, self.fence = f"{tag}:seq", f"{tag}:fence"
        self.ids = [f"{tag}:i:{b}" for b in range(BUCKETS)]
        self.rank = {w: f"{tag}:z:{w}" for w in WINDOWS}
        self.index = {w: f"{tag}:t:{w}" for w in WINDOWS}
        self.state: dict[str, list[list[Any]]] = {}
        self.offset = 0

    def prefill(self, client: redis.Redis) -> None:
        pipe = client.pipeline(transaction=False)
        for key in self.rank.values():
            for i in range(0, PREFILL, 1000):
                pipe.zadd(key, {f"0000017a{j:08x}|pre-{j:09d}-abcdefghijk": j for j in range(i, i + 1000)})
        pipe.execute()

    def reads(self, chunk: Sequence[Event]) -> tuple[list[Command], dict[int, list[bytes]]]:
        """The id window's lookups of a batch: one ZMSCORE per bucket."""
        buckets: dict[int, list[bytes]] = {}
        for event_id, _, _, _ in chunk:
            fp = hashlib.blake2b(event_id.encode(), digest_size=10).digest()
            buckets.setdefault(fp[0] % BUCKETS, []).append(fp)
        return [("ZMSCORE", self.ids[b], *fps) for b, fps in buckets.items()], buckets

    def writes(self, chunk: Sequence[Event], buckets: dict[int, list[bytes]]) -> list[Command]:
        """The batch decided: every write but the seq's INCR."""
        now = int(time.time())
        out: list[Command] = []
        for b, fps in buckets.items():
            out.append(("ZADD", self.ids[b], *(x for fp in fps for x in (now, fp))))
        before: dict[tuple[str, int], Any] = {}
        for _, member, score, ts in chunk:
            state = self.state.setdefault(member, [[0, None] for _ in WINDOWS])
            for w in range(len(WINDOWS)):
                before.setdefault((member, w), state[w][1])
                state[w][0] += score
                state[w][1] = f"{(1 << 44) - ts:011x}"  # earlier first under ZREVRANGE
        for w, window in enumerate(WINDOWS):
            removed, added, index = [], [], []
            for (member, v), old in before.items():
                if v != w:
                    continue
                score, tie = self.state[member][w]
                if old is not None:
                    removed.append(f"{old}|{member}")
                added += [score, f"{tie}|{member}"]
                index += [member, tie]
            if removed:
                out.append(("ZREM", self.rank[window], *removed))
            out.append(("ZADD", self.rank[window], *added))
            out.append(("HSET", self.index[window], *index))
        self.offset += len(chunk)
        out.append(("HSET", self.fence, "update_rank:0", self.offset))
        return out


def _round_trip(conn: Any, commands: Sequence[Command]) -> list[Any]:
    conn.send_packed_command(conn.pack_commands(commands))
    out = []
    for _ in commands:
        try:
            out.append(conn.read_response())
        except redis.ResponseError as exc:
            out.append(exc)
    return out


def watch(conn: Any, board: Board, chunk: Sequence[Event], meddle: Meddle) -> bool:
    reads, buckets = board.reads(chunk)
    got = _round_trip(conn, [("WATCH", board.seq), ("GET", board.seq), *reads])
    assert all(not isinstance(r, Exception) for r in got), got
    meddle()
    writes = board.writes(chunk, buckets)
    replies = _round_trip(conn, [("MULTI",), *writes, ("INCR", board.seq), ("EXEC",)])
    return replies[-1] is not None


def script(conn: Any, board: Board, chunk: Sequence[Event], meddle: Meddle, sha: str) -> bool:
    reads, buckets = board.reads(chunk)
    seq, *_ = _round_trip(conn, [("GET", board.seq), *reads])
    meddle()
    keys: dict[str, int] = {board.seq: 1}
    args: list[Any] = []
    writes = board.writes(chunk, buckets)
    for command, key, *rest in writes:
        args += [command, keys.setdefault(key, len(keys) + 1), len(rest), *rest]
    (done,) = _round_trip(conn, [("EVALSHA", sha, len(keys), *keys, seq or b"", len(writes), *args)])
    return done is not None


def unguarded(conn: Any, board: Board, chunk: Sequence[Event], meddle: Meddle) -> bool:
    reads, buckets = board.reads(chunk)
    _round_trip(conn, [("GET", board.seq), *reads])
    meddle()
    _round_trip(conn, [("MULTI",), *board.writes(chunk, buckets), ("INCR", board.seq), ("EXEC",)])
    return True


def bare(client: redis.Redis, board: Board, events: Sequence[Event]) -> None:
    pipe = client.pipeline(transaction=False)
    for k, (_, member, score, _) in enumerate(events):
        for key in board.rank.values():
            pipe.zincrby(key, score, member)
        if k % 1000 == 999:
            pipe.execute()
    pipe.execute()


def _batches(conn: Any, fn: Guarded) -> Callable[[Board, Sequence[Event]], None]:
    def run(board: Board, events: Sequence[Event]) -> None:
        for start in range(0, len(events), BATCH):
            assert fn(conn, board, events[start : start + BATCH], lambda: None)

    return run


def cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"] + info["used_cpu_sys"])


def main() -> None:
    n = env_int("GUARD_EVENTS", 200_000)
    server = LocalRedis("redis", REPO / ".stack" / "bench-guards" / "redis", port=free_port())
    server.start()
    client = redis.Redis(port=server.port)
    try:
        sha = client.script_load(THIN)
        conn = client.connection_pool.get_connection()
        guarded: dict[str, Guarded] = {
            "watch": watch, "script": lambda c, b, ch, m: script(c, b, ch, m, sha), "none": unguarded,
        }  # fmt: skip
        for name in ("watch", "script"):
            board = Board(f"conflict-{name}:")
            meddle = functools.partial(client.incr, board.seq)
            refused = not guarded[name](conn, board, stream("distinct", BATCH), meddle)
            assert refused, f"{name}: a write between the read and the write was not refused"
            client.flushall()
        designs: dict[str, Callable[[Board, Sequence[Event]], None]] = {
            "bare": lambda board, events: bare(client, board, events),
            **{name: _batches(conn, fn) for name, fn in guarded.items()},
        }
        print(f"a write between the read and the write: refused by both guards ({n} events a stream)")
        for kind in ("distinct", "repeating", "zipf"):
            events = stream(kind, n)
            figures: dict[str, tuple[float, float]] = {}
            for name, run in designs.items():
                best = (float("inf"), float("inf"))
                for _ in range(ROUNDS):
                    board = Board(f"{name}:")
                    board.prefill(client)
                    cpu, wall = cpu_s(client), time.perf_counter()
                    run(board, events)
                    used = ((cpu_s(client) - cpu) / n * 1e6, (time.perf_counter() - wall) / (n / BATCH) * 1e3)
                    best = min(best, used)
                    client.flushall()
                figures[name] = best
            base = figures["bare"][0]
            shown = [
                f"{name} {us:5.2f} us = {us / base:4.2f}x ({ms:5.2f} ms a batch)"
                for name, (us, ms) in figures.items()
            ]
            print(f"{kind:9s} " + " | ".join(shown), flush=True)
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
