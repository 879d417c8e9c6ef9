"""`promotion_s_100k`: a board of 100,000 members (RANKSTREAM_BENCH_PROMOTE_MEMBERS) that no
config makes hot, on an API node with RANKSTREAM_HOT_PROMOTE_READS_PER_S=5, read ~50 times a
second until it answers from memory. Reported: from the node's decision to load it to its first
answer from memory (its own log lines: the load), and from the first read (the decision waits
for the read rate's average to pass the threshold)."""

from __future__ import annotations

import random
import time
from datetime import datetime

import orjson

from bench.common import BenchError, Result, env_int, say
from bench.harness.fill import fill
from bench.harness.nodes import start_api
from bench.harness.probes import get_json, wait_ready
from bench.harness.processes import Child, Children
from bench.harness.stack import Stack, write_boards
from bench.hot.board import COLD_YAML, FOLDER
from common.boards import BoardsConfig
from common.settings import Settings

BOARD = "gift:trending"
DEFAULT_MEMBERS = 100_000
THRESHOLD = "5"
TIMEOUT_S = 120.0


def _logged_at(child: Child, message: str) -> float | None:
    """When the node logged `message` (its JSON line's ts, as epoch seconds)."""
    for line in child.log.read_text(errors="replace").splitlines():
        if message in line and line.startswith("{"):
            ts = orjson.loads(line)["ts"]
            return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return None


def promotion(group: Children, stack: Stack, settings: Settings, boards: BoardsConfig) -> Result:
    members = env_int("PROMOTE_MEMBERS", DEFAULT_MEMBERS)
    say(f"filling {BOARD} with {members:,} members; an API node makes it hot by its reads")
    fill(stack.client, boards, settings.key_prefix, board=BOARD,
         members=[f"t{i:07d}" for i in range(members)], rng=random.Random(20261129))  # fmt: skip
    cold = settings.model_copy(update={"boards": write_boards(FOLDER / "boards-cold.yaml", COLD_YAML)})
    api, base = start_api(
        group, "api-promote", cold, RANKSTREAM_HOT_PROMOTE_READS_PER_S=THRESHOLD, RANKSTREAM_LOG_LEVEL="INFO"
    )
    try:
        wait_ready(api, f"{base}/readyz")
        url = f"{base}/v1/boards/{BOARD}/top?limit=10"
        first = time.time()
        reads = 0
        while time.time() - first < TIMEOUT_S:
            body = get_json(url)
            reads += 1
            if body["source"] == "memory":
                break
            time.sleep(0.02)  # ~50 reads a second: the room's viewers
        else:
            raise BenchError(f"{BOARD} not served from memory {TIMEOUT_S} s after its first read")
        served = time.time()
        began = _logged_at(api, "loading a board read often")
        done = _logged_at(api, "a board read often is served from memory")
        if began is None or done is None:
            raise BenchError(f"the node did not log its load: {api.tail()}")
    finally:
        group.stop(api)
    return {
        "members": members,
        "promotion_s": round(done - began, 3),
        "from_first_read_s": round(served - first, 3),
        "reads": reads,
    }
