"""An independent model of the update stream, the oracle the worker is compared with.

It shares no code with the worker: its own period ids, its own ordering rule, its own
arithmetic (Python floats are the same IEEE doubles Lua uses, so results are bit-equal).
The generator makes realistic and adversarial traffic: every op, arrays, re-produced
duplicate ids, bad events of many kinds, late events, scores walking into the exact limit.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import orjson
import redis

from tests.boundaries import assert_crosses, session_boundary
from tests.redis_layout import read_general, scan_board

ORACLE_BOARDS = (
    f"\ntimezone: {session_boundary().zone}\n"
    + """types:
  gift: {windows: [total, hour, day, week, month], late_grace: 1d}
  score: {order: asc, tie_break: last, windows: [total, day, year], late_grace: 1d}
  plain: {tie_break: none, windows: [total]}
  capped: {windows: [total, day], max_members: 20, late_grace: 1d}
  default: {windows: [total, week], late_grace: 1d}
"""
)
# A type that declares its score range (its day and week windows pack ties into scores), for the
# suites of this release; the upgrade test's previous release doesn't know the key.
RANGED_TYPE = (
    "  ranged: {windows: [total, day, week], score_range: [-50, 20000], max_members: 15, late_grace: 1d}\n"
)
RANGED_BOARDS = [f"ranged:g{i}" for i in range(6)]
# A sharded type: each board's members spread over 3 slots (compare_redis checks each shard)
SHARDED_TYPE = "  split: {windows: [total, day, week], max_members: 12, shards: 3, late_grace: 1d}\n"
SHARDED_BOARDS = [f"split:h{i}" for i in range(4)]
SHARDS = {"split": 3}
ORACLE_BOARDS_RANGED = ORACLE_BOARDS + RANGED_TYPE + SHARDED_TYPE
RANGE = {"ranged": (-50, 20_000)}
PACKED_BITS = {"ranged": {"day": 27, "week": 30}}  # a day's ms fit 27 bits, a week's 30
TZ = session_boundary().tz  # a local midnight lies amid every stream's events (tests/boundaries.py)
WINDOWS = {
    "gift": ["total", "hour", "day", "week", "month"],
    "score": ["total", "day", "year"],
    "plain": ["total"],
    "capped": ["total", "day"],
    "misc": ["total", "week"],  # not configured: falls back to `default`
    "ranged": ["total", "day", "week"],
    "split": ["total", "day", "week"],
}
ASC = {"score"}
TIE = {
    "gift": "first",
    "score": "last",
    "plain": "none",
    "capped": "first",
    "misc": "first",
    "ranged": "first",
    "split": "first",
}
CAP = {"capped": 20, "ranged": 15, "split": 12}  # a sharded board's: each shard's
GRACE_MS = 86_400_000
EXACT = 2**53 - 1
DAY_MS = 86_400_000
AROUND_MS = 45 * 60_000  # events lie this close to the session's local midnight


def period_id(window: str, ts_ms: int) -> str | None:
    """Period of `window` at `ts_ms` (None for total), written independently of common/periods."""
    local = datetime.fromtimestamp(ts_ms / 1000, TZ)
    return {
        "total": None,
        "hour": f"{local:%Y-%m-%d}T{local:%H}",
        "day": f"{local:%Y-%m-%d}",
        "week": "{}-W{:02d}".format(*local.isocalendar()[:2]),
        "month": f"{local:%Y-%m}",
        "year": f"{local:%Y}",
    }[window]


def period_end_ms(window: str, ts_ms: int) -> int:
    local = datetime.fromtimestamp(ts_ms / 1000, TZ).replace(tzinfo=None)
    if window == "hour":  # the zone has a fixed offset: an hour is 3600 s
        start = datetime(local.year, local.month, local.day, local.hour, tzinfo=TZ)
        return int(start.timestamp() * 1000) + 3_600_000
    day0 = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        start, n_days = day0, 1
    elif window == "week":
        start, n_days = day0.fromordinal(day0.toordinal() - day0.weekday()), 7
    elif window == "month":
        nxt = day0.replace(day=28).toordinal() + 4
        first_next = datetime.fromordinal(nxt).replace(day=1)
        return int(first_next.replace(tzinfo=TZ).timestamp() * 1000)
    else:  # year
        return int(datetime(local.year + 1, 1, 1, tzinfo=TZ).timestamp() * 1000)
    end = datetime.fromordinal(start.toordinal() + n_days)
    return int(end.replace(tzinfo=TZ).timestamp() * 1000)


@dataclass
class Model:
    """Boards -> instance -> member -> (score, tie ms); plus meta, seq and the expected DLQ."""

    now_ms: int
    state: dict[str, dict[str, dict[str, tuple[float, int]]]] = field(default_factory=dict)
    meta: dict[str, dict[str, bytes]] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)
    dlq: list[tuple[str, bytes, int | None]] = field(default_factory=list)

    def instances(self, kind: str, ts: int) -> list[str]:
        out = []
        for window in WINDOWS[kind]:
            pid = period_id(window, ts)
            if pid is None:
                out.append("total")
            elif period_end_ms(window, ts) + GRACE_MS > self.now_ms:
                out.append(f"{window}:{pid}")
        return out

    def apply(self, event: dict[str, Any], raw: bytes, index: int | None) -> None:
        board, member, op = event["board"], event["member"], event.get("op", "incr")
        kind = board.split(":")[0]
        score, ts = float(event.get("score", 0)), int(event["ts"])
        board_state = self.state.setdefault(board, {})
        planned: dict[str, tuple[float, int] | None] = {}
        for inst in self.instances(kind, ts):
            members = board_state.setdefault(inst, {})
            old = members.get(member)
            if op == "delete":
                if old is not None:
                    planned[inst] = None
                continue
            if op == "incr":
                new = (old[0] if old else 0.0) + score
            elif op == "set" or old is None or (score < old[0] if kind in ASC else score > old[0]):
                new = score
            else:
                new = old[0]
            if old is not None and new == old[0]:
                continue
            planned[inst] = (new, ts)
        low, high = RANGE.get(kind, (-EXACT, EXACT))
        integral = kind in RANGE
        if any(p is not None and not (low <= p[0] <= high and (p[0].is_integer() or not integral))
               for p in planned.values()):  # fmt: skip
            if (board, event["id"]) not in self.seen:
                self.dlq.append(("score_out_of_range", raw, index))
            return
        if (board, event["id"]) in self.seen:
            return
        self.seen.add((board, event["id"]))
        self.seq[board] = self.seq.get(board, 0) + 1
        for inst, new_state in planned.items():
            if new_state is None:
                del board_state[inst][member]
            else:
                board_state[inst][member] = new_state
        if op == "delete":
            self.meta.get(board, {}).pop(member, None)
        elif event.get("meta") is not None:
            self.meta.setdefault(board, {})[member] = orjson.dumps(event["meta"])

    def ranking(self, board: str, inst: str) -> list[str]:
        """Members in rank order: score by the board's order, then the tie rule, then member bytes."""
        kind = board.split(":", maxsplit=1)[0]
        asc = kind in ASC
        tie = TIE[kind]
        members = self.state.get(board, {}).get(inst, {})

        def key(item: tuple[str, tuple[float, int]]) -> tuple[float, float, bytes]:
            member, (score, t) = item
            # the tie term: 0 for none; earlier-first -> smaller t first
            tie_term = 0.0 if tie == "none" else (t if tie == "first" else -t)
            if asc:
                return (score, tie_term, member.encode())
            return (-score, tie_term, _desc_bytes(member.encode()))

        return [m for m, _ in sorted(members.items(), key=key)]


def _desc_bytes(raw: bytes) -> bytes:
    # Redis orders equal desc entries by member bytes descending: invert each byte, and let a
    # longer string (which sorts after its prefix ascending) come first descending
    return bytes(255 - b for b in raw) + b"\xff"


# --- the generator ---------------------------------------------------------------------------

BOARDS = (
    [f"gift:r{i}" for i in range(20)]
    + [f"score:s{i}" for i in range(10)]
    + [f"plain:p{i}" for i in range(5)]
    + [f"capped:c{i}" for i in range(10)]
    + [f"misc:x{i}" for i in range(4)]
    + ["gift:big"]
)


@dataclass
class Message:
    key: bytes
    value: bytes
    valid: list[tuple[dict[str, Any], int | None]]  # events it carries and their array index
    bad: list[tuple[str, int | None]]  # reasons of its rejected parts and their index


def _event(rng: random.Random, board: str, now_ms: int, n: int) -> dict[str, Any]:
    kind = board.split(":", maxsplit=1)[0]
    member = f"m{int(rng.paretovariate(0.9)) % 300}"
    op = rng.choices(["incr", "set", "best", "delete"], weights=[74, 10, 12, 4])[0]
    event: dict[str, Any] = {"id": f"e{n}-{rng.getrandbits(32):x}", "board": board, "member": member}
    if op != "incr" or rng.random() < 0.3:
        event["op"] = op
    if op != "delete":
        if rng.random() < 0.15:
            event["score"] = round(rng.uniform(-50, 500), rng.choice([1, 2, 3]))
        else:
            event["score"] = rng.randint(-20, 1000) if kind != "score" else rng.randint(0, 5000)
    if rng.random() < 0.03:  # late: in periods closed long ago (total only)
        event["ts"] = now_ms - 40 * DAY_MS - rng.randrange(DAY_MS)
    else:  # within 45 minutes of the session's local midnight, either side
        event["ts"] = session_boundary().at_ms + rng.randrange(-AROUND_MS, AROUND_MS)
    if rng.random() < 0.05:
        event["meta"] = {"name": f"N{member}", "lvl": rng.randint(1, 99)}
    return event


def _bad(rng: random.Random, board: str, now_ms: int, n: int) -> tuple[bytes, str, int | None]:
    good = _event(rng, board, now_ms, n)
    good.setdefault("score", 1)
    good.pop("op", None)
    choice = rng.randrange(12)
    if choice == 0:
        return b'{"id": "x", "board": ', "bad_json", None
    if choice == 1:
        return orjson.dumps({**good, "board": "Bad Board"}), "bad_board", None
    if choice == 2:
        return orjson.dumps({k: v for k, v in good.items() if k != "member"}), "missing_field", None
    if choice == 3:
        return orjson.dumps(good).replace(b'"score":', b'"score":NaN,"x":', 1), "bad_json", None
    if choice == 4:
        return orjson.dumps({**good, "score": str(good["score"])}), "wrong_type", None
    if choice == 5:
        return orjson.dumps({**good, "member": "a\nb"}), "bad_member", None
    if choice == 6:
        return orjson.dumps({**good, "op": "multiply"}), "unknown_op", None
    if choice == 7:
        if rng.random() < 0.5:
            return orjson.dumps({**good, "ts": str(good["ts"])}), "bad_ts", None
        # the accepted range: 2000-01-01 .. now + 1 day of skew
        ts = rng.choice([-5, 946_684_800_000 - 1, now_ms + 2 * DAY_MS, 253_402_300_799_999])
        return orjson.dumps({**good, "ts": ts}), "ts_out_of_range", None
    if choice == 8:
        return orjson.dumps({**good, "meta": {"blob": "x" * 2000}}), "meta_too_large", None
    if choice == 9:
        return orjson.dumps({**good, "score": 1e17}), "score_out_of_range", None
    if choice == 10:
        return orjson.dumps({**good, "id": "i" * 129}), "bad_id", None
    return b"[]", "empty_batch", None


def generate(seed: int, total: int, now_ms: int, boards: Sequence[str] = BOARDS) -> Iterator[Message]:
    """About `total` events: 10% re-produced duplicates, 2% bad, some arrays, one board walking
    into the exact limit. Events of one board always share a key (one partition, one order)."""
    rng = random.Random(seed)
    produced: list[Message] = []
    n = 0
    # gift:big: a score close to the limit, then increments that must be refused
    near = {"id": "big-set", "board": "gift:big", "member": "whale", "op": "set", "score": EXACT - 500,
            "ts": now_ms - 60_000}  # fmt: skip
    yield Message(b"gift:big", orjson.dumps(near), [(near, None)], [])
    while n < total:
        roll = rng.random()
        if roll < 0.10 and produced:
            yield rng.choice(produced)  # the same bytes again: a producer retry
            n += 1
            continue
        board = rng.choice(boards)
        if roll < 0.12:
            value, reason, index = _bad(rng, board, now_ms, n)
            yield Message(board.encode(), value, [], [(reason, index)])
            n += 1
            continue
        if roll < 0.17:
            size = rng.randint(2, 30)
            events = [_event(rng, board, now_ms, n + i) for i in range(size)]
            bad_at = rng.randrange(size) if rng.random() < 0.3 else None
            items: list[Any] = list(events)
            if bad_at is not None:
                items[bad_at] = {"id": "broken", "board": board}  # no member
            msg = Message(
                board.encode(),
                orjson.dumps(items),
                [(e, i) for i, e in enumerate(events) if i != bad_at],
                [] if bad_at is None else [("missing_field", bad_at)],
            )
            n += size
        else:
            event = _event(rng, board, now_ms, n)
            if board == "gift:big" and rng.random() < 0.5:
                event.update(member="whale", op="incr", score=400)
            msg = Message(board.encode(), orjson.dumps(event), [(event, None)], [])
            n += 1
        produced.append(msg)
        yield msg
    assert_crosses_midnight("the oracle's stream", produced, now_ms)


def assert_crosses_midnight(what: str, messages: Sequence[Message], now_ms: int) -> None:
    """Fails unless the valid events younger than a day (the others are late for every period)
    lie on both sides of a local midnight."""
    recent = [int(e["ts"]) for m in messages for e, _ in m.valid if int(e["ts"]) > now_ms - DAY_MS]
    assert_crosses(what, TZ, recent, ("day",))


def run_model(messages: list[Message], now_ms: int) -> Model:
    model = Model(now_ms=now_ms)
    for msg in messages:
        for reason, index in msg.bad:
            model.dlq.append((reason, msg.value, index))
        for event, index in msg.valid:
            model.apply(event, msg.value, index)
    return model


def now_ms() -> int:
    return int(time.time() * 1000)


# --- comparing Redis with the model ----------------------------------------------------------


def compare_redis(client: redis.Redis, prefix: str, model: Model) -> int:
    """Assert every board, window instance, member, rank, meta and seq equal the model.
    Returns the number of (board, instance, member) entries compared."""
    compared = 0
    for board in [*BOARDS, *sorted(set(model.seq) - set(BOARDS))]:
        tag = f"{prefix}{{{board}}}"
        kind = board.split(":")[0]
        if kind in SHARDS:
            compared += _compare_sharded(client, prefix, board, model)
            continue
        assert int(client.get(f"{tag}:seq") or 0) == model.seq.get(board, 0), f"seq of {board}"
        general = {k.split(":z:", 1)[1] for k in scan_board(client, f"{tag}:z:*")}
        packed = {k.split(":p:", 1)[1] for k in scan_board(client, f"{tag}:p:*")}
        assert not general & packed, f"{board}: an instance in both layouts"
        model_instances = {i for i, members in model.state.get(board, {}).items() if members}
        assert general | packed == model_instances, f"window instances of {board}"
        for inst in model_instances:
            expected = model.state[board][inst]
            bits = PACKED_BITS.get(kind, {}).get(inst.split(":")[0])
            assert (inst in packed) == (bits is not None), f"layout of {board} {inst}"
            asc = kind in ASC
            got = (
                read_general(client, tag, inst, asc, TIE[kind])
                if bits is None
                else read_packed(client, tag, inst, bits)
            )
            assert got == expected, f"states of {board} {inst}"
            order = model.ranking(board, inst)
            cap = CAP.get(kind)
            z, o, tie = ("z", "o", TIE[kind]) if bits is None else ("p", "q", "none")
            ranked = _read_zset(client, f"{tag}:{z}:{inst}", asc, tie)
            overflow = _read_zset(client, f"{tag}:{o}:{inst}", asc, tie)
            if cap is None:
                assert ranked == order and overflow == [], f"ranking of {board} {inst}"
            else:
                assert ranked == order[:cap], f"top {cap} of {board} {inst}"
                assert overflow == order[cap:], f"overflow of {board} {inst}"
            compared += len(expected)
        meta = {_text(m): v for m, v in client.hgetall(f"{tag}:meta").items()}
        assert meta == model.meta.get(board, {}), f"meta of {board}"
    return compared


def _compare_sharded(client: redis.Redis, prefix: str, board: str, model: Model) -> int:
    """A sharded board (general layout): its shards, found by their keys, hold between them
    exactly the model's board; each member in the shard CRC-32 of its id picks (docs/boards.md),
    each shard ranking its own members with its own max_members cut; the seqs sum to the board's."""
    kind = board.split(":", maxsplit=1)[0]
    k = SHARDS[kind]
    keys = client.scan_iter(match=f"{prefix}{{{board}#*:seq", count=10_000)  # every master's
    tags = sorted({_text(key).split("}", 1)[0] + "}" for key in keys})
    index = {tag: int(tag[len(prefix) + 1 :].split("#", 1)[1].split(".")[1]) for tag in tags}
    assert all(tag.startswith(f"{prefix}{{{board}#{k}.") for tag in tags), tags
    assert len(set(index.values())) == len(tags) <= k, f"shards of {board}: {tags}"
    seqs = sum(int(client.get(f"{tag}:seq") or 0) for tag in tags)
    assert seqs == model.seq.get(board, 0), f"seq of {board}"
    model_instances = {i for i, members in model.state.get(board, {}).items() if members}
    held = {tag: {k.split(":z:", 1)[1] for k in scan_board(client, f"{tag}:z:*")} for tag in tags}
    assert set().union(*held.values()) == model_instances, f"window instances of {board}"
    compared = 0
    for inst in model_instances:
        expected = model.state[board][inst]
        order = model.ranking(board, inst)
        got: dict[str, tuple[float, int]] = {}
        for tag in tags:
            states = read_general(client, tag, inst, kind in ASC, TIE[kind]) if inst in held[tag] else {}
            assert all(zlib.crc32(m.encode()) % k == index[tag] for m in states), f"{board} {inst} {tag}"
            got.update(states)
            mine = [m for m in order if m in states]
            ranked = _read_zset(client, f"{tag}:z:{inst}", kind in ASC, TIE[kind])
            overflow = _read_zset(client, f"{tag}:o:{inst}", kind in ASC, TIE[kind])
            cap = CAP[kind]
            assert (ranked, overflow) == (mine[:cap], mine[cap:]), f"ranking of {board} {inst} in {tag}"
        assert got == expected, f"states of {board} {inst}"
        compared += len(expected)
    meta = {_text(m): v for tag in tags for m, v in client.hgetall(f"{tag}:meta").items()}
    assert meta == model.meta.get(board, {}), f"meta of {board}"
    return compared


def read_packed(client: redis.Redis, tag: str, inst: str, bits: int) -> dict[str, tuple[float, int]]:
    """A packed instance (desc, tie first: a later time packs smaller; ties counted from 2 h
    before the period's start), decoded independently."""
    window, pid = inst.split(":", 1)
    if window == "day":
        start = datetime.strptime(pid, "%Y-%m-%d")
    else:
        year, week = pid.split("-W")
        start = datetime.fromisocalendar(int(year), int(week), 1)
    base = int(start.replace(tzinfo=TZ).timestamp() * 1000) - 2 * 3_600_000  # ties count from 2 h before
    mask = (1 << bits) - 1
    got = {}
    for key in (f"{tag}:p:{inst}", f"{tag}:q:{inst}"):
        for m, v in cast(list[tuple[bytes, float]], client.zrange(key, 0, -1, withscores=True)):
            value = int(v)
            assert value == v, f"a packed value is an exact integer: {v!r}"
            got[_text(m)] = (float(value >> bits), base + mask - (value & mask))
    return got


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _read_zset(client: redis.Redis, key: str, asc: bool, tie: str) -> list[str]:
    rows = cast(list[bytes], client.zrange(key, 0, -1) if asc else client.zrevrange(key, 0, -1))
    strip = 0 if tie == "none" else 12
    return [_text(r)[strip:] for r in rows]
