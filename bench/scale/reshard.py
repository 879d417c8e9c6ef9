"""`rankstream reshard-board`'s copy, timed: the sharded cases' unsharded board (big1:global,
every member in every window after its drain) copied to 3 shards on the cluster, as the command
copies it (rankstream/reshard_copy.py), right after that case and before the next empties Redis.

    reshard_member_states_per_s        member states (a member in one window instance) written a second
    reshard_redis_us_per_member_state  the masters' Redis CPU per member state (INFO cpu)
    reshard_s                          the whole copy: states, meta, ids, markers"""

from __future__ import annotations

import time

from bench.common import Result, say
from bench.harness.stats import ratio
from bench.scale.targets import RedisTarget
from common.boards import BoardsConfig
from common.idwindow import LISTPACK_CAP
from common.store.topology import connect
from rankstream.reshard import names_of_type
from rankstream.reshard_copy import Context, copy_board, plan_markers

SHARDS = 3


def run(target: RedisTarget, prefix: str, boards: BoardsConfig, type_name: str, board: str) -> Result:
    client = connect(target.url, target.cluster, socket_timeout=60)
    ctx = Context(
        client=client,
        prefix=prefix,
        boards=boards,
        board_type=boards.types[type_name],
        id_window_s=86_400,
        listpack_cap=LISTPACK_CAP,
        updates_topic="update_rank",
        updates_topic_id="",
        now_s=int(client.time()[0]),
    )
    old = names_of_type(client, prefix, boards, type_name)[board]
    before = target.snapshots()
    started = time.monotonic()
    copied = copy_board(ctx, board, old, SHARDS, plan_markers(ctx, board, old, SHARDS))
    took = time.monotonic() - started
    after = target.snapshots()
    redis_s = sum(after[n.port].cpu_s - before[n.port].cpu_s for n in target.masters)
    out: Result = {
        "reshard_s": round(took, 2),
        "reshard_member_states": copied.members,
        "reshard_ids": copied.ids,
        "reshard_member_states_per_s": round(copied.members / took),
        "reshard_redis_us_per_member_state": ratio(redis_s * 1e6, copied.members),
    }
    say(f"reshard {board} to {SHARDS} shards: {copied.members:,} member states in {took:.1f} s")
    return out
