"""Applies validated events to Redis: one apply.lua call per board chunk, all chunks of a
batch in one pipelined round trip."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import redis

from common.boards import BoardsConfig, BoardType, WindowKind
from common.events import UpdateEvent
from common.keys import TOTAL_INSTANCE, BoardKeys, window_instance
from common.periods import CALENDAR_KINDS, PeriodCache, expire_at_ms
from common.ranking import format_score, tie_mode
from common.scripts import Call, load_script
from worker.faults import is_infrastructure

MAX_EVENTS_PER_CALL = 500  # bounds the time one script blocks Redis
MAX_INSTANCES_PER_CALL = 48  # the window mask is a Lua double: 53 exact bits


class Status(IntEnum):
    DUPLICATE = 0
    APPLIED = 1
    OUT_OF_RANGE = 2


@dataclass(frozen=True, slots=True)
class MemberState:
    score: float
    tie_ms: int


@dataclass(frozen=True, slots=True)
class Outcome:
    event: UpdateEvent
    status: Status
    seq: int
    # instance -> state after the event (None: absent); only filled for hot boards
    states: dict[str, MemberState | None]
    late_windows: int  # calendar windows skipped because their period closed beyond late_grace
    meta: bytes | None = None  # the member's meta after the event; only filled for hot boards


_FOREVER = 2**62


@dataclass(frozen=True, slots=True)
class _Slots:
    start_ms: int  # valid for event times in [start_ms, end_ms)
    end_ms: int
    slots: list[tuple[str, int, int]]  # (instance, expire-at ms or 0, late after ms)


@dataclass(frozen=True, slots=True)
class Failure:
    """An event whose processing raised something other than an infrastructure fault."""

    event: UpdateEvent
    error: BaseException


@dataclass(frozen=True, slots=True)
class _Entry:
    event: UpdateEvent
    ts: int
    mask: int  # bit i: the event counts in the chunk's i-th instance
    names: list[str]  # the instances it counts in
    late: int  # windows it missed because their period closed beyond late_grace


@dataclass
class _Chunk:
    """The events of one board that go into one apply.lua call."""

    board: str
    board_type: BoardType
    instances: dict[str, tuple[int, int]] = field(default_factory=dict)  # instance -> (bit, expire)
    events: list[_Entry] = field(default_factory=list)

    def fits(self, pairs: list[tuple[str, int]]) -> bool:
        new = sum(1 for name, _ in pairs if name not in self.instances)
        return len(self.events) < MAX_EVENTS_PER_CALL and len(self.instances) + new <= MAX_INSTANCES_PER_CALL

    def add(self, event: UpdateEvent, ts: int, pairs: list[tuple[str, int]], late: int) -> None:
        mask = 0
        for name, expire in pairs:
            bit, _ = self.instances.setdefault(name, (len(self.instances), expire))
            mask |= 1 << bit
        self.events.append(_Entry(event, ts, mask, [name for name, _ in pairs], late))


def parse_state(raw: bytes | str) -> MemberState | None:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if not text:
        return None
    score, tie = text.split("|")
    return MemberState(float(score), int(tie))


class Applier:
    """Turns events into apply.lua calls. `now_ms` decides which periods are closed."""

    def __init__(
        self,
        client: redis.Redis,
        boards: BoardsConfig,
        key_prefix: str,
        dedupe_ttl_ms: int,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._client = client
        self._boards = boards
        self._prefix = key_prefix
        self._ttl = dedupe_ttl_ms
        self._now_ms = now_ms
        self._periods = PeriodCache(boards.timezone)
        self._slot_cache: dict[str, _Slots] = {}
        self._script = load_script("apply")

    def _slots(self, board_type: BoardType, ts: int) -> _Slots:
        """The instances an event of `board_type` at `ts` counts in. Consecutive events share
        them until one of their periods ends, so they are computed once per period change."""
        cached = self._slot_cache.get(board_type.name)
        if cached is not None and cached.start_ms <= ts < cached.end_ms:
            return cached
        start, end = 0, _FOREVER
        slots: list[tuple[str, int, int]] = []
        for window in board_type.windows:
            if window.kind is WindowKind.TOTAL:
                slots.append((TOTAL_INSTANCE, 0, _FOREVER))
            elif window.kind in CALENDAR_KINDS:
                period = self._periods.at(window.kind, ts)
                expire = expire_at_ms(period, board_type.retention[window.name], self._boards.timezone)
                # a period whose keys already expired can't take the event either: PEXPIREAT in
                # the past would delete the whole period (retention 1 with a late grace did)
                late_after = min(period.end_ms + board_type.late_grace_ms, expire)
                slots.append((window_instance(window.name, period.id), expire, late_after))
                start, end = max(start, period.start_ms), min(end, period.end_ms)
            # rolling windows (last_<N>...) are not applied yet: see README "Windows"
        cached = _Slots(start, end, slots)
        self._slot_cache[board_type.name] = cached
        return cached

    def _instances(self, board_type: BoardType, ts: int, now: int) -> tuple[list[tuple[str, int]], int]:
        """(instance, expire-at) pairs the event counts in, and how many closed periods it missed."""
        slots = self._slots(board_type, ts).slots
        out = [(name, expire) for name, expire, late_after in slots if now < late_after]
        return out, len(slots) - len(out)

    def _chunks(self, events: Sequence[tuple[UpdateEvent, int]], failures: list[Failure]) -> list[_Chunk]:
        """Board chunks in stream order; an event whose windows can't even be computed fails alone."""
        now = self._now_ms()
        open_chunks: dict[str, _Chunk] = {}
        chunks: list[_Chunk] = []
        for event, ts in events:
            try:
                board_type = self._boards.type_for(event.board_type)
                assert board_type is not None  # the parser resolved it
                pairs, late = self._instances(board_type, ts, now)
            except Exception as exc:  # noqa: BLE001 - whatever it is, it is this event's alone
                failures.append(Failure(event, exc))
                continue
            chunk = open_chunks.get(event.board)
            if chunk is None or not chunk.fits(pairs):
                chunk = _Chunk(event.board, board_type)
                open_chunks[event.board] = chunk
                chunks.append(chunk)
            chunk.add(event, ts, pairs, late)
        return chunks

    def _call(self, chunk: _Chunk, want_state: bool) -> Call:
        keys = BoardKeys(self._prefix, chunk.board)
        board_type = chunk.board_type
        key_list: list[str] = [keys.seq, keys.meta]
        for name in chunk.instances:
            key_list += [keys.rank(name), keys.overflow(name), keys.state(name)]
        key_list += [keys.dedupe(entry.event.id) for entry in chunk.events]
        args: list[str | int] = [len(chunk.instances), len(chunk.events), tie_mode(board_type).value]
        args += ["1" if board_type.order.value == "desc" else "0", board_type.max_members or 0, self._ttl]
        args += ["1" if want_state else "0", *(expire for _, expire in chunk.instances.values())]
        for entry in chunk.events:
            event = entry.event
            meta = event.meta.decode() if event.meta is not None else ""
            args += [event.op.value, event.member, format_score(event.score), entry.ts, meta, entry.mask]
        return Call(key_list, args)

    def apply(self, events: Sequence[tuple[UpdateEvent, int]]) -> list[Outcome]:
        """Apply and return the outcomes; raise the first failure (for callers that own the data)."""
        outcomes, failures = self.apply_isolated(events)
        if failures:
            raise failures[0].error
        return outcomes

    def apply_isolated(
        self, events: Sequence[tuple[UpdateEvent, int]]
    ) -> tuple[list[Outcome], list[Failure]]:
        """Apply (event, effective ts) pairs. Outcomes come back per board in stream order;
        failures are events that raised something other than an infrastructure fault (those
        propagate: the caller rewinds and retries the batch)."""
        failures: list[Failure] = []
        outcomes: list[Outcome] = []
        for round_ in _rounds(self._chunks(events, failures)):
            wants = [bool(self._boards.hot_windows(chunk.board)) for chunk in round_]
            calls = [self._call(c, w) for c, w in zip(round_, wants, strict=True)]
            results = self._script.run_many(self._client, calls, raise_on_error=False)
            for chunk, want, reply in zip(round_, wants, results, strict=True):
                try:
                    outcomes += _decode(chunk, want, reply)
                except Exception as exc:
                    if is_infrastructure(exc):
                        raise
                    # apply.lua writes nothing before its last decision, so a failed call left
                    # no trace: re-apply its events one by one, in order, to find the bad ones
                    outcomes += self._narrow(chunk, want, failures)
        return outcomes, failures

    def _narrow(self, chunk: _Chunk, want: bool, failures: list[Failure]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for entry in chunk.events:
            single = _Chunk(chunk.board, chunk.board_type)
            single.add(entry.event, entry.ts, [(n, chunk.instances[n][1]) for n in entry.names], entry.late)
            try:
                (reply,) = self._script.run_many(
                    self._client, [self._call(single, want)], raise_on_error=False
                )
                outcomes += _decode(single, want, reply)
            except Exception as exc:
                if is_infrastructure(exc):
                    raise
                failures.append(Failure(entry.event, exc))
        return outcomes


def _rounds(chunks: list[_Chunk]) -> list[list[_Chunk]]:
    """At most one chunk per board per round trip: a board's later chunk never runs before an
    earlier one has been narrowed, so a board's events are applied in stream order."""
    rounds: list[list[_Chunk]] = []
    depth: dict[str, int] = {}
    for chunk in chunks:
        level = depth.get(chunk.board, 0)
        depth[chunk.board] = level + 1
        if level == len(rounds):
            rounds.append([])
        rounds[level].append(chunk)
    return rounds


def _decode(chunk: _Chunk, want: bool, reply: list[Any] | Exception) -> list[Outcome]:
    """The outcomes of one call; the call's error reply, if it failed, is raised here."""
    if isinstance(reply, Exception):
        raise reply
    outcomes: list[Outcome] = []
    pos = 0
    for entry in chunk.events:
        status, seq = Status(int(reply[pos])), int(reply[pos + 1])
        pos += 2
        states: dict[str, MemberState | None] = {}
        meta: bytes | None = None
        if want:
            for name in sorted(entry.names, key=lambda n: chunk.instances[n][0]):
                states[name] = parse_state(reply[pos])
                pos += 1
            meta = reply[pos] or None
            pos += 1
        outcomes.append(Outcome(entry.event, status, seq, states, entry.late, meta))
    return outcomes
