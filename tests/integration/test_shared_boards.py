"""Two real workers applying the same boards at once: the producer sets no message key, so each
board's events arrive on every partition and both workers decide and write the same boards
concurrently (the message key is recommended, not relied upon). Each worker's kept state of a
board goes stale every time the other writes it; the guarded writes must refuse, re-read and
decide again, and the end state must equal an independent model.

The stream is built so its end state does not depend on the order the partitions are applied
in: increments only, and every event of a member carries the member's own time (its tie). Ids
are re-produced on another partition (a producer retry), and one worker is killed -9 midway
(redelivery onto boards the other keeps writing)."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

import pytest
from confluent_kafka import Producer

from common.boards import parse_boards
from common.store.encoding import encode_member, tie_mode
from common.store.keys import BoardKeys
from rankstream.topics import ensure_topics
from tests.helpers import BOTH_TOPOLOGIES, applied_so_far, stop_workers, wait_applied_and_committed, wait_for
from tests.integration.test_worker_oracle import worker_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BOARDS_YAML = "timezone: UTC\ntypes:\n  shared: {windows: [total, day]}\n"
BOARDS = [f"shared:room{i}" for i in range(4)]
MEMBERS = [f"user-{i:04d}" for i in range(300)]
EVENTS = 24_000
PARTITIONS = 6  # rankstream.topics UPDATE_PARTITIONS


def _stream(seed: int, now: int) -> tuple[list[tuple[int, bytes]], dict[str, dict[str, int]], dict[str, int]]:
    """(partition, value) messages; per board the model's scores and its count of applied ids."""
    rng = random.Random(seed)
    ts = {m: now - 60_000 - i for i, m in enumerate(MEMBERS)}  # the member's tie, whatever order
    scores: dict[str, dict[str, int]] = {b: defaultdict(int) for b in BOARDS}
    applied: dict[str, int] = dict.fromkeys(BOARDS, 0)
    messages: list[tuple[int, bytes]] = []
    for i in range(EVENTS):
        board, member, score = rng.choice(BOARDS), rng.choice(MEMBERS), rng.randrange(1, 9)
        event = {"id": f"s{seed}-{i}", "board": board, "member": member, "op": "incr", "score": score,
                 "ts": ts[member]}  # fmt: skip
        value = json.dumps(event).encode()
        messages.append((rng.randrange(PARTITIONS), value))
        if rng.random() < 0.05:  # a producer retry, on another partition
            messages.append((rng.randrange(PARTITIONS), value))
        scores[board][member] += score
        applied[board] += 1
    return messages, scores, applied


@BOTH_TOPOLOGIES
def test_two_workers_writing_the_same_boards_at_once_end_exact(make_settings, rclient, tmp_path):
    boards = tmp_path / "boards.yaml"
    boards.write_text(BOARDS_YAML)
    settings = make_settings(boards=boards)
    ensure_topics(settings)
    now = int(time.time() * 1000)
    messages, scores, applied = _stream(7, now)
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20, "enable.idempotence": True}
    )
    for partition, value in messages:
        producer.produce(settings.topic_updates, value, partition=partition)
    assert producer.flush(30) == 0
    target = sum(applied.values())
    a = worker_process(settings, worker_id="pod-a")
    b = worker_process(settings, worker_id="pod-b")
    c = None
    try:
        wait_for(lambda: applied_so_far(rclient, settings, BOARDS) > target * 0.3, 120, "30% applied")
        a.kill()  # redelivery of its uncommitted batches, onto boards b keeps writing
        a.wait(10)
        c = worker_process(settings, worker_id="pod-c")
        wait_applied_and_committed(rclient, settings, target, boards=BOARDS)
    finally:
        stop_workers(b, c)
        if a.poll() is None:
            a.kill()
    for board in BOARDS:
        keys = BoardKeys(settings.key_prefix, board)
        assert int(rclient.get(keys.seq) or 0) == applied[board]
        got = {m.decode(): s for m, s in rclient.zrange(keys.rank("total"), 0, -1, withscores=True)}
        ts = {m: now - 60_000 - i for i, m in enumerate(MEMBERS)}
        mode = tie_mode(parse_boards(BOARDS_YAML).types["shared"])
        want = {encode_member(mode, ts[m], m): float(s) for m, s in scores[board].items()}
        assert got == want, board
