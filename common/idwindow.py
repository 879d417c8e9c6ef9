"""The id window (CONTRACT 2 and 4): the same (board, id) produced again less than the window
after it was applied is a producer duplicate. apply.lua remembers ids through
common/lua/idwindow.lua; this module holds what the worker computes for it.

Fingerprints: an id is remembered as the first 80 bits of its BLAKE2b hash. Two different ids
of one board collide with probability 2^-80 per pair; with n ids in one window the chance that
any real event is taken for a duplicate is at most n^2 / 2^81: for n = 10^9 that is
10^18 / 2.4e24 = 4.1e-7 (the goal is <= 1e-6).

Memory: one id costs its fingerprint (10 B) and applied-at second (a 4-byte integer) in a
listpack hash (about 18 B with the entry headers), plus its share of the bucket key (one key
per 64-128 ids) and of the directory (one byte per bucket); bench/worker.py measures it with
Redis' own INFO (`redis_bytes_per_event_id`).
"""

from __future__ import annotations

import hashlib

FINGERPRINT_BYTES = 10
# Redis' default hash-max-listpack-entries: a bucket that grows past it splits (a hash beyond it
# would turn into a hashtable, 3-4x the bytes per entry)
LISTPACK_CAP = 128


def fingerprint(event_id: str) -> bytes:
    return hashlib.blake2b(event_id.encode(), digest_size=FINGERPRINT_BYTES).digest()
