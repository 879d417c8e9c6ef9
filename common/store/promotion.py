"""promote.lua's typed wrapper: an API node registers a board it made hot by itself, and keeps
the registration alive while it serves the board from memory (worker/promotions.py: what the
workers do while it exists)."""

from __future__ import annotations

import uuid

from common.store.encoding import text
from common.store.keys import BoardKeys
from common.store.scripts import load_script
from common.store.topology import Store

_SCRIPT = load_script("promote", (("K", ("PROMOTED",)), ("A", ("TOKEN", "TTL"))))


def register(client: Store, keys: BoardKeys, ttl_ms: int) -> str:
    """Keep the board's registration alive for `ttl_ms`, or start one: its token. Each new
    registration gets a token of its own, so a node that finds another token than the one it
    loaded the board under knows the registration lapsed meanwhile (and writes made then were
    not published)."""
    token: bytes | str = _SCRIPT.run(client, [keys.promoted], [uuid.uuid4().hex, ttl_ms])
    return text(token)
