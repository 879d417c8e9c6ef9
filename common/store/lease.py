"""lease.lua's typed wrapper: a lease one owner holds at a time, renewed and released only by it
(an atomic check-and-set: a holder whose lease lapsed can't renew or drop its successor's)."""

from __future__ import annotations

from common.store.scripts import load_script
from common.store.topology import Store

_SCRIPT = load_script("lease", (("K", ("LEASE",)), ("A", ("OP", "OWNER", "TTL"))))


def hold(client: Store, key: str, owner: str, ttl_ms: int) -> bool:
    """Take the lease if it is free, renew it if `owner` holds it: does `owner` hold it now?"""
    return bool(_SCRIPT.run(client, [key], ["hold", owner, ttl_ms]))


def release(client: Store, key: str, owner: str) -> bool:
    """Drop the lease if `owner` holds it."""
    return bool(_SCRIPT.run(client, [key], ["release", owner, 0]))
