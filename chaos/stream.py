"""The seeded producer's stream: every op, arrays, re-produced ids, producer retries (the same
bytes again), edge timestamps, and bad events of every kind with the reason they must be
dead-lettered with (carried in a `chaos-bad` header, which the service ignores).

A message is planned by the seed and built when it is produced: event times follow the clock
(a 1-minute period's results close during the run), and the model reads the topic back, so it
sees exactly what the broker holds, producer retries included."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from chaos.config import (
    ALL_BOARDS,
    CUP_EVENTS,
    DAY_MS,
    SOAK_MEMBERS,
    TZ,
    WHALE_BOARD,
    Seasons,
    kind,
    soak_member,
)

EXACT = 2**53 - 1
EARLIEST_MS = 946_684_800_000  # 2000-01-01T00:00Z, the earliest accepted ts
SKEW_MS = DAY_MS  # the default allowed future skew
BAD_HEADER = "chaos-bad"
REUSED_FROM = 200  # a re-produced id is one of its board's last 200 events
RETRIED_FROM = 500  # a producer retry sends one of the last 500 messages again
Build = Callable[[int], bytes]  # the message's value, built at `now` (its Kafka timestamp)


@dataclass
class Planned:
    key: str
    build: Build
    bad: list[tuple[int | None, str]] = field(default_factory=list)  # (array index, reason)

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        if not self.bad:
            return []
        text = ";".join(f"{'-' if i is None else i}:{reason}" for i, reason in self.bad)
        return [(BAD_HEADER, text.encode())]


def parse_bad(raw: bytes | None) -> list[tuple[int | None, str]]:
    if not raw:
        return []
    out: list[tuple[int | None, str]] = []
    for part in raw.decode().split(";"):
        index, reason = part.split(":", 1)
        out.append((None if index == "-" else int(index), reason))
    return out


# --- bad events: (name, reason, value from a good event at `now`) ------------------------------


def _dumps(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def _with(**changes: Any) -> Callable[[dict[str, Any], int], bytes]:
    return lambda good, now: _dumps({**good, **changes})


def _without(name: str) -> Callable[[dict[str, Any], int], bytes]:
    return lambda good, now: _dumps({k: v for k, v in good.items() if k != name})


def _raw_score(text: bytes) -> Callable[[dict[str, Any], int], bytes]:
    return lambda good, now: _dumps({**good, "score": 1}).replace(b'"score":1', b'"score":' + text, 1)


BAD_KINDS: list[tuple[str, str, Callable[[dict[str, Any], int], bytes]]] = [
    ("truncated_json", "bad_json", lambda good, now: _dumps(good)[:-7]),
    ("nan_score", "bad_json", _raw_score(b"NaN")),
    ("infinity_score", "bad_json", _raw_score(b"Infinity")),
    ("not_utf8", "bad_json", lambda good, now: _dumps(good).replace(b'"member":"', b'"member":"\xff\xfe', 1)),
    (
        "huge_number_in_meta",
        "bad_json",
        lambda good, now: _dumps({**good, "meta": {"x": 1}}).replace(b'"x":1', b'"x":1e400'),
    ),
    ("garbage_megabyte", "bad_json", lambda good, now: b"\x00\x01garbage" * 100_000),
    ("empty_value", "empty_value", lambda good, now: b""),
    ("a_number", "bad_shape", lambda good, now: b"42"),
    ("a_string", "bad_shape", lambda good, now: b'"gift:r0"'),
    ("empty_array", "empty_batch", lambda good, now: b"[]"),
    ("array_of_501", "batch_too_large", lambda good, now: orjson.dumps([good] * 501)),
    ("no_id", "missing_field", _without("id")),
    ("no_board", "missing_field", _without("board")),
    ("no_member", "missing_field", _without("member")),
    (
        "no_score",
        "missing_field",
        lambda good, now: _dumps({k: v for k, v in good.items() if k not in ("score", "op")}),
    ),
    ("score_a_string", "wrong_type", lambda good, now: _dumps({**good, "score": "12"})),
    ("id_a_number", "wrong_type", _with(id=12345)),
    ("op_a_number", "wrong_type", _with(op=5)),
    ("meta_a_string", "wrong_type", _with(meta="name")),
    ("unknown_field", "unknown_field", _with(scroe=3)),
    ("empty_id", "bad_id", _with(id="")),
    ("id_129", "bad_id", _with(id="i" * 129)),
    ("board_with_space", "bad_board", _with(board="gift room")),
    ("board_type_33", "bad_board", _with(board="g" * 33 + ":r0")),
    ("scope_with_slash", "bad_board", _with(board="gift:r/0")),
    ("board_hash_tag", "bad_board", _with(board="gift:{r0}")),
    ("board_key_injection", "bad_board", _with(board="gift:r0}:seq{")),
    ("empty_member", "bad_member", _with(member="")),
    ("member_129", "bad_member", _with(member="m" * 129)),
    ("member_newline", "bad_member", _with(member="a\nb")),
    ("member_line_separator", "bad_member", _with(member="a\u2028b")),
    ("member_bidi_override", "bad_member", _with(member="a\u202eb")),
    ("op_multiply", "unknown_op", _with(op="multiply")),
    ("score_1e400", "non_finite_score", _raw_score(b"1e400")),
    ("score_beyond_exact", "score_out_of_range", _with(score=EXACT + 1)),
    ("score_below_exact", "score_out_of_range", _with(score=-EXACT - 1)),
    ("ts_a_string", "bad_ts", lambda good, now: _dumps({**good, "ts": str(now)})),
    ("ts_a_float", "bad_ts", lambda good, now: _dumps({**good, "ts": now + 0.5})),
    ("ts_before_2000", "ts_out_of_range", lambda good, now: _dumps({**good, "ts": EARLIEST_MS - 1})),
    ("ts_negative", "ts_out_of_range", lambda good, now: _dumps({**good, "ts": -5})),
    ("ts_past_skew", "ts_out_of_range", lambda good, now: _dumps({**good, "ts": now + SKEW_MS + 1})),
    ("ts_in_seconds_far_future", "ts_out_of_range", lambda good, now: _dumps({**good, "ts": now * 1000})),
    ("meta_over_1k", "meta_too_large", _with(meta={"blob": "x" * 1100})),
]
# kinds an array element can have (a value-level fault is a whole message's)
ELEMENT_KINDS = [k for k in BAD_KINDS if k[0] not in {"truncated_json", "nan_score", "infinity_score", "not_utf8",
                 "huge_number_in_meta", "garbage_megabyte", "empty_value", "a_number", "empty_array",
                 "array_of_501", "score_1e400"}]  # fmt: skip


class Stream:
    """The planned messages of one run: `messages(n)` yields about n events' worth."""

    def __init__(self, seed: int, start_ms: int, boards: list[str] | None = None) -> None:
        self.rng = random.Random(seed)
        self.start_ms = start_ms
        self.boards = boards or ALL_BOARDS
        # what a re-produced id or a retried message is drawn from: the latest only, so a soak's
        # stream of millions holds no more than a short one's
        self.used: dict[str, deque[Callable[[int], dict[str, Any]]]] = {}  # board -> its last valid events
        self.sent: deque[Planned] = deque(maxlen=RETRIED_FROM)
        self.serial = 0
        self.swept: dict[str, int] = {}  # a big board: members given their first event so far
        self.season_start = Seasons(start_ms).spans()["s1"][0]

    # --- valid events ---------------------------------------------------------------------
    def _ts(self, board: str) -> Callable[[int], int | None]:
        """When the event happened, given `now`: mostly absent (the Kafka timestamp) or up to
        20 minutes ago; sometimes an edge (a boundary, 2000-01-01, the skew's limit)."""
        rng, roll = self.rng, self.rng.random()
        if kind(board) == "cup":  # its 1-minute periods close during the run: now, or nothing
            return (lambda now: now) if roll < 0.5 else (lambda now: None)
        if roll < 0.35:
            return lambda now: None
        if roll < 0.94:
            back = rng.randrange(20 * 60_000)
            return lambda now: now - back
        edges: list[Callable[[int], int | None]] = [
            lambda now: EARLIEST_MS,  # the earliest accepted: late for every period
            lambda now: now + SKEW_MS,  # the latest accepted
            lambda now: self.season_start,  # a season's first ms, and the ms before it (in none)
            lambda now: self.season_start - 1,
            lambda now: (
                _local_floor(now, 30 * 60_000) - 1
            ),  # the last ms of a half hour, of an hour, of a day
            lambda now: _local_floor(now, 60 * 60_000) - 1,
            lambda now: _local_floor(now, DAY_MS) - 1,
            lambda now: _local_floor(now, 60 * 60_000),  # an hour's first ms
        ]
        return rng.choice(edges)

    def event(self, board: str) -> Callable[[int], dict[str, Any]]:
        rng = self.rng
        self.serial += 1
        eid = f"e{self.serial}-{rng.getrandbits(24):x}"
        member = self._member(board)
        op = rng.choices(["incr", "set", "best", "delete"], weights=[72, 10, 12, 6])[0]
        body: dict[str, Any] = {"id": eid, "board": board, "member": member}
        if op != "incr" or rng.random() < 0.3:
            body["op"] = op
        if op != "delete":
            if rng.random() < 0.15 and kind(board) != "gift":  # rolling sums: integers (docs/chaos.md)
                body["score"] = round(rng.uniform(-50, 500), rng.choice([1, 2, 3]))
            else:
                body["score"] = rng.randint(-20, 1000) if kind(board) != "score" else rng.randint(0, 5000)
        if rng.random() < 0.05 and kind(board) not in ("cup", "bulk"):
            body["meta"] = {"name": f"N{member}", "lvl": rng.randint(1, 99)}
        if rng.random() < 0.05:
            body["ts"] = None  # null is the same as absent
        when = self._ts(board)

        def build(now: int) -> dict[str, Any]:
            ts = when(now)
            return body if ts is None else {**body, "ts": ts}

        return build

    def _member(self, board: str) -> str:
        """Most boards: 60 members, a few of them most active. A big board (the soak's): each of
        its SOAK_MEMBERS members in turn first, then any of them."""
        if kind(board) != "bulk":
            return f"m{int(self.rng.paretovariate(0.8)) % 60}"
        swept = self.swept.get(board, 0)
        if swept < SOAK_MEMBERS:
            self.swept[board] = swept + 1
            return soak_member(swept)
        return soak_member(self.rng.randrange(SOAK_MEMBERS))

    def _valid(self, board: str) -> Callable[[int], dict[str, Any]]:
        """A new event, or (10%) one planned before produced again under its id, in another
        message (as an application re-sends what it is unsure was sent)."""
        events = self.used.setdefault(board, deque(maxlen=REUSED_FROM))
        if events and self.rng.random() < 0.10:
            return self.rng.choice(events)
        build = self.event(board)
        events.append(build)
        return build

    # --- messages -------------------------------------------------------------------------
    def whale(self) -> list[Planned]:
        """A member set near the exact limit, then increments: the second one is refused."""
        near = {"id": "whale-set", "board": WHALE_BOARD, "member": "whale", "op": "set", "score": EXACT - 500}
        plan = [Planned(WHALE_BOARD, lambda now: orjson.dumps(near))]
        for i in range(2):
            step = {"id": f"whale-{i}", "board": WHALE_BOARD, "member": "whale", "score": 400}
            plan.append(Planned(WHALE_BOARD, lambda now, step=step: orjson.dumps(step)))  # type: ignore[misc]
        return plan

    def next(self) -> tuple[Planned, int]:
        """The next message and how many events it carries."""
        rng, roll = self.rng, self.rng.random()
        if roll < 0.03 and self.sent:  # a producer retry: the same bytes (and headers) again
            again = rng.choice(self.sent)
            return again, 1
        board = rng.choice(self.boards)
        while kind(board) == "cup" and self.serial > CUP_EVENTS:  # its periods close early in the run
            board = rng.choice(self.boards)
        if roll < 0.07:
            _, reason, bad = rng.choice(BAD_KINDS)
            good = self.event(board)
            planned = Planned(board, lambda now: bad(_scoring(good(now)), now), [(None, reason)])
        elif roll < 0.12:
            size = rng.randint(2, 20)
            parts = [self._valid(board) for _ in range(size)]
            bad_at = rng.randrange(size) if rng.random() < 0.3 else None
            element: Callable[[dict[str, Any], int], bytes] | None = None
            reason = ""
            if bad_at is not None:
                _, reason, element = rng.choice(ELEMENT_KINDS)

            def build(now: int, parts: list[Any] = parts, bad_at: int | None = bad_at,
                      element: Any = element) -> bytes:  # fmt: skip
                items: list[Any] = [part(now) for part in parts]
                if bad_at is not None:
                    items[bad_at] = orjson.loads(element(_scoring(items[bad_at]), now))
                return orjson.dumps(items)

            planned = Planned(board, build, [] if bad_at is None else [(bad_at, reason)])
            self.sent.append(planned)
            return planned, size
        else:
            one = self._valid(board)
            planned = Planned(board, lambda now: orjson.dumps(one(now)))
        self.sent.append(planned)
        return planned, 1

    def messages(self, events: int) -> Iterator[Planned]:
        yield from self.whale()
        n = 0
        while n < events:
            planned, count = self.next()
            n += count
            yield planned


def _scoring(event: dict[str, Any]) -> dict[str, Any]:
    """The event as an incr with a score (a bad kind is made from a scoring event)."""
    out = {k: v for k, v in event.items() if k != "op"}
    out.setdefault("score", 1)
    return out


def _local_floor(now: int, unit_ms: int) -> int:
    """The start of the local `unit_ms` period (half hour, hour, day) holding `now`."""
    local = datetime.fromtimestamp(now / 1000, TZ)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    since = now - int(midnight.timestamp() * 1000)
    return now - since % unit_ms
