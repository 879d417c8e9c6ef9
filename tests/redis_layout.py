"""The general layout read straight from Redis, independently of common/store: a window
instance's tie index (`<tag>:t:<instance>:<d>:<p>` hashes, member id -> tie ms) and its zsets
(`:z:` and, with max_members, `:o:`; members prefixed with their tie in 12 hex digits, inverted
where earlier ties must sort later bytewise; no prefix under tie_break none). An instance the
previous release wrote has its state hash (`:h:`, member -> "<score>|<tie ms>") instead of
the index."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import cast

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from common.store.topology import Store, node_client

TIE_HEX = 12
TIE_MAX = 16**TIE_HEX - 1
SLOT_KEYS = 10_000_000


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def scan_board(client: Store, pattern: str) -> set[str]:
    """The keys matching `pattern`, a board's (its hash tag `{<board>}` in the pattern). On a
    cluster, the keys of the tag's slot (CLUSTER GETKEYSINSLOT on its master) matched here: a
    SCAN walks every key of every test on every master, and the oracle suites' checks spent most
    of their time in it."""
    if isinstance(client, RedisCluster):
        client.exists(pattern)  # a call by key: if the slot moved, MOVED corrects the client's map
        node = node_client(client, client.get_node_from_key(pattern))  # type: ignore[no-untyped-call]
        slot = key_slot(pattern.encode())
        keys = cast(list[bytes], node.execute_command("CLUSTER GETKEYSINSLOT", slot, SLOT_KEYS))  # type: ignore[no-untyped-call]
        assert len(keys) < SLOT_KEYS, f"slot {slot} holds more keys than a test reads"
        return {key for key in map(_text, keys) if fnmatchcase(key, pattern)}
    return {_text(k) for k in client.scan_iter(match=pattern, count=10_000)}


def index_keys(client: Store, tag: str, inst: str) -> list[str]:
    """The instance's tie index keys: its buckets, and its directory once a bucket split."""
    buckets = scan_board(client, f"{tag}:t:{inst}:*")
    directory = f"{tag}:t:{inst}"
    return sorted(buckets | ({directory} if client.exists(directory) else set()))


def read_index(client: redis.Redis, tag: str, inst: str) -> dict[str, int]:
    """member -> tie ms, from every bucket of the instance's tie index."""
    ties: dict[str, int] = {}
    for key in index_keys(client, tag, inst):
        if key == f"{tag}:t:{inst}":
            continue
        for member, tie in cast(dict[bytes, bytes], client.hgetall(key)).items():
            assert _text(member) not in ties, f"{member!r} is in two buckets of {tag} {inst}"
            ties[_text(member)] = int(tie)
    return ties


def read_general(
    client: redis.Redis, tag: str, inst: str, asc: bool, tie: str
) -> dict[str, tuple[float, int]]:
    """member -> (score, tie ms) of a general instance: the index's (or state hash's) ties, the
    zsets' scores; asserts they agree (every zset entry is its member's tie, prefixed as the
    order says, and where a state hash is kept its score is the zset's)."""
    hashed = {
        _text(m): _text(v).split("|")
        for m, v in cast(dict[bytes, bytes], client.hgetall(f"{tag}:h:{inst}")).items()
    }
    if hashed:
        assert not index_keys(client, tag, inst), f"{tag} {inst} has a state hash and a tie index"
    ties = {m: int(tie) for m, (_, tie) in hashed.items()} if hashed else read_index(client, tag, inst)
    inverted = (not asc) == (tie == "first")
    states: dict[str, tuple[float, int]] = {}
    for z in ("z", "o"):
        for raw, score in cast(
            list[tuple[bytes, float]], client.zrange(f"{tag}:{z}:{inst}", 0, -1, withscores=True)
        ):
            encoded = _text(raw)
            member = encoded if tie == "none" else encoded[TIE_HEX:]
            assert member in ties, f"{encoded!r} of {tag} {inst} is not in its tie index"
            if tie != "none":
                t = ties[member]
                assert encoded[:TIE_HEX] == f"{TIE_MAX - t if inverted else t:012x}", (
                    f"tie prefix of {encoded!r}"
                )
            assert member not in states, f"{member!r} is twice in {tag} {inst}"
            assert not hashed or float(hashed[member][0]) == score, f"the state hash's score of {member!r}"
            states[member] = (score, ties[member])
    assert set(states) == set(ties), f"the tie index of {tag} {inst} names members its zsets lack"
    return states
