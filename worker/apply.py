"""Applies validated events to Redis: one apply.lua call per board chunk, all chunks of a
batch in one pipelined round trip."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import redis

from common.boards import BoardsConfig, BoardType, WindowKind
from common.events import UpdateEvent
from common.keys import TOTAL_INSTANCE, BoardKeys, window_instance
from common.periods import CALENDAR_KINDS, PeriodCache, expire_at_ms
from common.ranking import format_score, tie_mode
from common.scripts import Call, load_script

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


@dataclass
class _Chunk:
    board: str
    board_type: BoardType
    instances: dict[str, tuple[int, int]] = field(default_factory=dict)  # instance -> (bit, expire)
    events: list[tuple[UpdateEvent, int, int, list[str], int]] = field(default_factory=list)


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
                late_after = period.end_ms + board_type.late_grace_ms
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

    def _chunks(self, events: Sequence[tuple[UpdateEvent, int]]) -> list[_Chunk]:
        now = self._now_ms()
        open_chunks: dict[str, _Chunk] = {}
        chunks: list[_Chunk] = []
        for event, ts in events:
            board_type = self._boards.type_for(event.board_type)
            assert board_type is not None  # the parser resolved it
            pairs, late = self._instances(board_type, ts, now)
            chunk = open_chunks.get(event.board)
            new = [name for name, _ in pairs if chunk is None or name not in chunk.instances]
            if (
                chunk is None
                or len(chunk.events) >= MAX_EVENTS_PER_CALL
                or len(chunk.instances) + len(new) > MAX_INSTANCES_PER_CALL
            ):
                chunk = _Chunk(event.board, board_type)
                open_chunks[event.board] = chunk
                chunks.append(chunk)
            mask = 0
            for name, expire in pairs:
                bit, _ = chunk.instances.setdefault(name, (len(chunk.instances), expire))
                mask |= 1 << bit
            chunk.events.append((event, ts, mask, [name for name, _ in pairs], late))
        return chunks

    def _call(self, chunk: _Chunk, want_state: bool) -> Call:
        keys = BoardKeys(self._prefix, chunk.board)
        board_type = chunk.board_type
        key_list: list[str] = [keys.seq, keys.meta]
        for name in chunk.instances:
            key_list += [keys.rank(name), keys.overflow(name), keys.state(name)]
        key_list += [keys.dedupe(event.id) for event, *_ in chunk.events]
        args: list[str | int] = [len(chunk.instances), len(chunk.events), tie_mode(board_type).value]
        args += ["1" if board_type.order.value == "desc" else "0", board_type.max_members or 0, self._ttl]
        args += ["1" if want_state else "0", *(expire for _, expire in chunk.instances.values())]
        for event, ts, mask, _, _ in chunk.events:
            meta = event.meta.decode() if event.meta is not None else ""
            args += [event.op.value, event.member, format_score(event.score), ts, meta, mask]
        return Call(key_list, args)

    def apply(self, events: Sequence[tuple[UpdateEvent, int]]) -> list[Outcome]:
        """Apply (event, effective ts) pairs; outcomes come back in board-chunk order."""
        chunks = self._chunks(events)
        wants = [bool(self._boards.hot_windows(chunk.board)) for chunk in chunks]
        results = self._script.run_many(
            self._client, [self._call(c, w) for c, w in zip(chunks, wants, strict=True)]
        )
        outcomes: list[Outcome] = []
        for chunk, want, reply in zip(chunks, wants, results, strict=True):
            pos = 0
            for event, _, _, names, late in chunk.events:
                status, seq = Status(int(reply[pos])), int(reply[pos + 1])
                pos += 2
                states: dict[str, MemberState | None] = {}
                meta: bytes | None = None
                if want:
                    ordered = sorted(names, key=lambda n: chunk.instances[n][0])
                    for name in ordered:
                        states[name] = parse_state(reply[pos])
                        pos += 1
                    meta = reply[pos] or None
                    pos += 1
                outcomes.append(Outcome(event, status, seq, states, late, meta))
        return outcomes
