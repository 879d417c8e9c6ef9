"""What backfill reads from Redis, typed: the instances of a window and, page by page, every
member's state in one instance with its meta (SCAN/HSCAN: no call blocks Redis for long)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import redis

from common.store.encoding import MemberState, parse_state, text
from common.store.keys import TOTAL_INSTANCE, BoardKeys

SCAN_COUNT = 2_000


@dataclass(frozen=True, slots=True)
class StateRow:
    member: str
    state: MemberState
    meta: bytes | None


def instances(client: redis.Redis, keys: BoardKeys, window: str, total: bool) -> list[str]:
    """`total`, or every period of a calendar window that Redis still holds."""
    if total:
        return [TOTAL_INSTANCE]
    prefix_len = len(keys.state(""))
    return [
        text(raw)[prefix_len:] for raw in client.scan_iter(match=keys.state_pattern(window), count=SCAN_COUNT)
    ]


def state_pages(client: redis.Redis, keys: BoardKeys, instance: str) -> Iterator[list[StateRow]]:
    """Every member of the instance with its state and meta, one HSCAN page at a time."""
    cursor = 0
    while True:
        cursor, page = client.hscan(keys.state(instance), cursor, count=SCAN_COUNT)
        rows = cast(dict[bytes, bytes], page)  # a client without decode_responses
        members = list(rows)
        metas = client.hmget(keys.meta, members) if members else []
        out: list[StateRow] = []
        for member_raw, meta in zip(members, metas, strict=True):
            state = parse_state(rows[member_raw])
            if state is not None:
                out.append(
                    StateRow(text(member_raw), state, meta.encode() if isinstance(meta, str) else meta)
                )
        yield out
        if cursor == 0:
            return
