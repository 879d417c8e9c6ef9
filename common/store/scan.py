"""What backfill reads from Redis, typed: the instances of a window and, page by page, every
member's state in one instance with its meta (SCAN/HSCAN/ZSCAN: no call blocks Redis for long).
A packed window's states are its zsets' scores (common/store/packing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import redis

from common.store.encoding import MemberState, Packing, parse_state, text
from common.store.keys import TOTAL_INSTANCE, BoardKeys

SCAN_COUNT = 2_000


@dataclass(frozen=True, slots=True)
class StateRow:
    member: str
    state: MemberState
    meta: bytes | None


def instances(client: redis.Redis, keys: BoardKeys, window: str, total: bool, packed: bool) -> list[str]:
    """`total`, or every period of a calendar window that Redis still holds."""
    if total:
        return [TOTAL_INSTANCE]
    prefix_len = len(keys.rank("", packed) if packed else keys.state(""))  # before the instance
    pattern = keys.instance_pattern(window, packed)
    return [text(raw)[prefix_len:] for raw in client.scan_iter(match=pattern, count=SCAN_COUNT)]


def state_pages(
    client: redis.Redis, keys: BoardKeys, instance: str, packing: Packing | None
) -> Iterator[list[StateRow]]:
    """Every member of the instance with its state and meta, one scan page at a time."""
    if packing is not None:
        for key in (keys.rank(instance, True), keys.overflow(instance, True)):
            for page in _zscan_pages(client, key):
                yield _with_metas(client, keys, {m: packing.unpack(v) for m, v in page})
        return
    cursor = 0
    while True:
        cursor, fields = client.hscan(keys.state(instance), cursor, count=SCAN_COUNT)
        rows = cast(dict[bytes, bytes], fields)  # a client without decode_responses
        states = {member: parse_state(raw) for member, raw in rows.items()}
        yield _with_metas(client, keys, {m: s for m, s in states.items() if s is not None})
        if cursor == 0:
            return


def _zscan_pages(client: redis.Redis, key: str) -> Iterator[list[tuple[bytes, float]]]:
    cursor = 0
    while True:
        cursor, page = client.zscan(key, cursor, count=SCAN_COUNT)
        yield cast(list[tuple[bytes, float]], page)
        if cursor == 0:
            return


def _with_metas(client: redis.Redis, keys: BoardKeys, states: dict[bytes, MemberState]) -> list[StateRow]:
    members = list(states)
    metas = client.hmget(keys.meta, members) if members else []
    return [
        StateRow(text(member), states[member], meta.encode() if isinstance(meta, str) else meta)
        for member, meta in zip(members, metas, strict=True)
    ]
