"""Hash tags and key syntax in members and ids stay data: events whose member and id are made of
braces, colons, key names of the schema and glob characters change their own board's ranking
exactly as any member would, and not one key outside their board's hash tag. (A board id with a
brace or a key name in it never gets this far: the parser refuses it, `bad_board`, in
tests/unit/test_chaos_stream.py's kinds `board_hash_tag` and `board_key_injection`.)"""

from __future__ import annotations

import re
import time

import pytest

from common.boards import load_boards
from common.events import Op, UpdateEvent
from tests.helpers import BOTH_TOPOLOGIES
from tests.redis_layout import read_general, scan_board
from worker.apply import Applier

pytestmark = [pytest.mark.integration, BOTH_TOPOLOGIES]
HOSTILE = ["}", "{", "{}", "{gift:b}", "}:seq", "gift:b}:z:total{", "{gift:b}:z:total", "*", "?", "[a-z]",
           "\\", "a b", ":", "::", "%s", "'; FLUSHALL", "💥", "seq", "z:total", "{t}:fence"]  # fmt: skip


def dump(client, prefix: str, board: str) -> dict[str, bytes | None]:
    """Each key of the board's tag with its serialized value."""
    return {key: client.dump(key) for key in sorted(scan_board(client, f"{prefix}{{{board}}}*"))}


def test_hostile_members_and_ids_stay_inside_their_board(settings, rclient):
    boards = load_boards(settings.boards)
    applier = Applier(rclient, boards, settings.key_prefix, 600_000)
    now = int(time.time() * 1000)
    neighbour = UpdateEvent("n-1", "gift:b", "gift", "someone", Op.INCR, 7.0, None, None)
    applier.apply([(neighbour, now)])
    before = dump(rclient, settings.key_prefix, "gift:b")
    keys_before = {
        k.decode() if isinstance(k, bytes) else k for k in rclient.scan_iter(match=f"{settings.key_prefix}*")
    }
    events = [
        (UpdateEvent(hostile, "gift:a", "gift", hostile, Op.INCR, float(i + 1), None, None), now - i)
        for i, hostile in enumerate(HOSTILE)
    ]
    applier.apply(events)
    assert dump(rclient, settings.key_prefix, "gift:b") == before, "the neighbour board changed"
    keys_after = {
        k.decode() if isinstance(k, bytes) else k for k in rclient.scan_iter(match=f"{settings.key_prefix}*")
    }
    tag = f"{settings.key_prefix}{{gift:a}}"
    strays = {k for k in keys_after - keys_before if not k.startswith(tag)}
    # the service's own keys outside boards: the rolling and hot registries, a cluster slot's mark
    shared = re.compile(re.escape(settings.key_prefix) + r"\{(rolling|hot|shards|s[0-9]+)\}(:|$)")
    assert {k for k in strays if not shared.match(k)} == set()
    got = read_general(rclient, tag, "total", asc=False, tie="first")
    assert {m: s for m, (s, _) in got.items()} == {h: float(i + 1) for i, h in enumerate(HOSTILE)}
    # the same ids again: each one a duplicate of its own event, none of another's
    applier.apply(events)
    assert read_general(rclient, tag, "total", asc=False, tie="first") == got
