"""What backfill, and an API node making a board hot by itself, read from Redis, typed: the
instances of a window and, page by page, every member's state in one instance with its meta
(SCAN and paged scripts: no call blocks Redis for long).
A general window's states are read through its tie index (statepage.lua), or the state hash of
an instance the previous release wrote (HSCAN). A packed window's states are its zsets' scores
(common/store/packing.py), read by value across its rank and overflow zsets (packedpage.lua).
Either way a member max_members moves between the two zsets while it reads is never missed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from common.boards import BoardsConfig, BoardType, Window, WindowKind
from common.league import is_division, season_instance_of
from common.periods import parse_period
from common.store.encoding import (
    MemberState,
    Packing,
    TieMode,
    decode_entry,
    parse_state,
    text,
    tie_mode,
    window_bits,
    window_packing,
)
from common.store.keys import TOTAL_INSTANCE, BoardKeys
from common.store.scripts import load_script
from common.store.topology import Store

SCAN_COUNT = 2_000
PAGE_KEYS, PAGE_ARGS = ("RANK", "OVERFLOW"), ("AFTER", "SIZE")
_PACKED_PAGE = load_script("packedpage", (("K", PAGE_KEYS), ("A", PAGE_ARGS)))
STATE_PAGE_KEYS, STATE_PAGE_ARGS = ("RANK", "OVERFLOW", "INDEX"), ("CURSOR", "SIZE", "MODE")
_STATE_PAGE = load_script("statepage", (("K", STATE_PAGE_KEYS), ("A", STATE_PAGE_ARGS)))


@dataclass(frozen=True, slots=True)
class StateRow:
    member: str
    state: MemberState
    meta: bytes | None


def instances(client: Store, keys: BoardKeys, window: str, total: bool, packed: bool) -> list[str]:
    """`total`, or every period of a calendar window that Redis still holds."""
    if total:
        return [TOTAL_INSTANCE]
    prefix_len = len(keys.rank("", packed))  # before the instance
    pattern = keys.instance_pattern(window, packed)
    return [text(raw)[prefix_len:] for raw in client.scan_iter(match=pattern, count=SCAN_COUNT)]


def state_pages(
    client: Store, keys: BoardKeys, instance: str, packing: Packing | None, mode: TieMode
) -> Iterator[list[StateRow]]:
    """Every member of the instance with its state and meta, one scan page at a time."""
    if packing is not None:
        for page in _packed_pages(client, keys, instance):
            yield _with_metas(client, keys, {m: packing.unpack(v) for m, v in page})
        return
    if is_division(instance):  # a league's division: no tie index, each entry says its tie
        yield _with_metas(client, keys, _division_states(client, keys, instance, mode))
        return
    if not client.exists(keys.state(instance)):
        for page in _indexed_pages(client, keys, instance, mode):
            states = {member: parse_state(raw) for member, raw in page}
            yield _with_metas(client, keys, {m: s for m, s in states.items() if s is not None})
        return
    cursor = 0
    while True:
        cursor, fields = client.hscan(keys.state(instance), cursor, count=SCAN_COUNT)
        rows = cast(dict[bytes, bytes], fields)  # a client without decode_responses
        states = {member: parse_state(raw) for member, raw in rows.items()}
        yield _with_metas(client, keys, {m: s for m, s in states.items() if s is not None})
        if cursor == 0:
            return


def member_pages(
    client: Store, keys: BoardKeys, instance: str, mode: TieMode, size: int
) -> Iterator[list[str]]:
    """Every member of a general instance, about `size` a page (whole tie index buckets, or an
    HSCAN page of a state hash): each call short, and a member max_members moves between the
    rank and overflow zsets meanwhile is never missed (worker/rolling.py walks a period so)."""
    if client.exists(keys.state(instance)):
        yield from hash_field_pages(client, keys.state(instance), size)
        return
    zsets = [keys.rank(instance), keys.overflow(instance), keys.tie_index(instance)]
    cursor = 0
    while cursor >= 0:
        reply = cast(list[bytes], _STATE_PAGE.run(client, zsets, [cursor, size, mode.value]))
        cursor = int(reply[0])
        yield [text(member) for member in reply[1::2]]


def hash_field_pages(client: Store, key: str, size: int) -> Iterator[list[str]]:
    """The field names of a hash, one HSCAN page (about `size`) at a time."""
    cursor = 0
    while True:
        cursor, fields = client.hscan(key, cursor, count=size)
        yield [text(field) for field in cast(dict[bytes, bytes], fields)]
        if cursor == 0:
            return


def _packed_pages(client: Store, keys: BoardKeys, instance: str) -> Iterator[list[tuple[bytes, bytes]]]:
    """A packed window's members, rank and overflow zsets together, page by page in value order
    (packedpage.lua: a member moving between the two while we page is never skipped)."""
    zsets = [keys.rank(instance, True), keys.overflow(instance, True)]
    after: bytes | str = "-inf"
    while True:
        flat = cast(list[bytes], _PACKED_PAGE.run(client, zsets, [after, SCAN_COUNT]))
        if not flat:
            return
        yield list(zip(flat[::2], flat[1::2], strict=True))
        after = flat[-1]


def _indexed_pages(
    client: Store, keys: BoardKeys, instance: str, mode: TieMode
) -> Iterator[list[tuple[bytes, bytes]]]:
    """A general window's members and states through its tie index, whole buckets a page."""
    zsets = [keys.rank(instance), keys.overflow(instance), keys.tie_index(instance)]
    cursor = 0
    while cursor >= 0:
        reply = cast(list[bytes], _STATE_PAGE.run(client, zsets, [cursor, SCAN_COUNT, mode.value]))
        cursor = int(reply[0])
        yield list(zip(reply[1::2], reply[2::2], strict=True))


def _division_states(
    client: Store, keys: BoardKeys, instance: str, mode: TieMode
) -> dict[bytes, MemberState]:
    """A league division's members and states, read at once: a division holds at most its
    division_size (10,000), so one ZRANGE is short and sees one state of it."""
    rows = cast(list[tuple[bytes, float]], client.zrange(keys.rank(instance), 0, -1, withscores=True))
    out: dict[bytes, MemberState] = {}
    for raw, score in rows:
        member, tie = decode_entry(mode, text(raw))
        out[member.encode()] = MemberState(float(score), tie)
    return out


def _with_metas(client: Store, keys: BoardKeys, states: dict[bytes, MemberState]) -> list[StateRow]:
    members = list(states)
    metas = client.hmget(keys.meta, members) if members else []
    return [
        StateRow(text(member), states[member], meta.encode() if isinstance(meta, str) else meta)
        for member, meta in zip(members, metas, strict=True)
    ]


def window_instances(client: Store, keys: BoardKeys, windows: tuple[str, ...], boards: BoardsConfig,
               board_type_name: str) -> list[tuple[str, Packing | None, TieMode]]:  # fmt: skip
    """Every instance of the hot windows Redis holds, how each packs and orders its ties."""
    board_type = boards.type_for(board_type_name)
    assert board_type is not None
    out: list[tuple[str, Packing | None, TieMode]] = []
    for name in windows:
        window = board_type.window(name)
        total = window.kind is WindowKind.TOTAL
        packed = window_bits(board_type, window) is not None
        for instance in instances(client, keys, name, total, packed):
            try:
                packing = instance_packing(boards, board_type, window, instance)
            except ValueError:  # a period id the window no longer has (a season taken out of the config)
                continue
            out.append((instance, packing, tie_mode(board_type)))
    return out


def instance_packing(
    boards: BoardsConfig, board_type: BoardType, window: Window, instance: str
) -> Packing | None:
    """How an instance (`total`, `<window>:<period id>`) of the window packs; raises ValueError
    for a period id the window does not have."""
    if window.kind is WindowKind.TOTAL:
        return window_packing(board_type, window, 0)
    period_id = season_instance_of(instance).split(":", 1)[1]  # a league's division: its season's
    start = parse_period(window, period_id, boards.timezone).start_ms
    return window_packing(board_type, window, start)
