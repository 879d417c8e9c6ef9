"""The id window (docs/contract.md §2 and 4): the same (board, id) produced again less than the window
after it was applied is a producer duplicate. apply.lua remembers ids through
common/lua/idwindow.lua; this module holds what the worker computes for it.

Fingerprints: an id is remembered as the first 80 bits of its BLAKE2b hash. Two different ids
of one board collide with probability 2^-80 per pair; with n ids in one window the chance that
any real event is taken for a duplicate is at most n^2 / 2^81: for n = 10^9 that is
10^18 / 2.4e24 = 4.1e-7 (the goal is <= 1e-6).

Memory: one id costs its fingerprint (10 B) and applied-at second (an integer score) in a
listpack sorted set (about 18 B with the entry headers), plus its share of the bucket key (one
key per 24-48 ids) and of the directory (one byte per bucket). Each write to a bucket first
drops what left the window (the worker's transactions: once in `slack_s` at most), so a bucket
holds live ids, and ids at most that much older. bench/memory.py measures it with Redis' own
INFO (`redis_bytes_per_event_id`): about 24 B per id.

Expiry: a key of the id window lives at least a window and a second after the last id it took
(a board that stops taking events leaves no id window behind). apply.lua and guarded.lua set
that on each write; the worker's transactions set `key_ttl_ms` instead, once in `slack_s` at
most (common/store/native.py _refresh).
"""

from __future__ import annotations

import hashlib

FINGERPRINT_BYTES = 10
# An id window or tie index bucket that grows past it splits. Below Redis' default
# zset-max-listpack-entries (and hash-max-listpack-entries in its shipped config), 128, so every
# bucket stays in the compact encoding (beyond it, 3-4x the bytes per entry); 48 and not 128
# because every insert into a listpack scans it: at 48 Redis spends ~15% less on a distinct
# member's writes and ~25% less on a Zipf stream's than at 128, for the same bytes per entry
# (bench/redis_cost.py at 48, 32 and 128, three runs each: 32 costs ~1% more bytes, saves no more)
LISTPACK_CAP = 48


def slack_s(window_s: int) -> int:
    """How long past the window an id may stay in its bucket, and a key of the id window past
    what its newest id needs: a sixtieth of the window (a bucket is then trimmed, and a key's
    expiry set, once in that long at most, not on each write)."""
    return window_s // 60


def key_ttl_ms(window_s: int) -> int:
    """The expiry the worker's transactions give a key of the id window: a window, a second and
    the slack (the longest any writer gives one)."""
    return (window_s + 1 + slack_s(window_s)) * 1000


def fingerprint(event_id: str) -> bytes:
    return hashlib.blake2b(event_id.encode(), digest_size=FINGERPRINT_BYTES).digest()
