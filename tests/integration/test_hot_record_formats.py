"""A rolling upgrade of the workers on hot boards: workers writing update_cache record format 1
(`RANKSTREAM_CACHE_RECORD_FORMAT=1`, what the previous release writes) and format 2 take turns
on the same boards, and an API node following them live, and one replaying the topic after,
hold exactly what Redis holds: every member's state, the order, and every member's meta."""

from __future__ import annotations

from collections import Counter
from typing import cast

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from api.hotboards import HotBoard
from api.state import APP_STATE
from common.cache_records import partition_for
from common.settings import Settings
from common.store.keys import BoardKeys
from tests.helpers import applied_so_far, produce, running_worker, wait_for
from tests.integration.test_hot_boards import (
    ALL_BOARDS,
    HOT,
    NodeRunner,
    assert_memory_equals_redis,
    hot_settings,
    model_with_history,
    wait_memory_caught_up,
)
from tests.oracle import Message, generate, now_ms

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def assert_meta_equals_redis(client: redis.Redis, prefix: str, hot: HotBoard) -> int:
    """Every member memory holds has the meta Redis holds for it; the members compared with one."""
    raw = cast(dict[bytes, bytes], client.hgetall(f"{BoardKeys(prefix, hot.board).tag}:meta"))
    stored = {m.decode(): v for m, v in raw.items()}
    present = {m for window in hot.instances.values() for m in window.items()}
    assert {m: hot.meta.get(m) for m in present} == {m: stored.get(m) for m in present}, hot.board
    return sum(1 for m in present if m in stored)


def formats_on_topic(settings: Settings, board: str) -> Counter[int]:
    """How many records of each format the board's update_cache partition holds."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "formats",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    try:
        topic = settings.topic_cache
        count = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        partition = TopicPartition(topic, partition_for(board, count), 0)
        end = consumer.get_watermark_offsets(partition, timeout=10)[1]
        consumer.assign([partition])
        found: Counter[int] = Counter()
        while consumer.position([partition])[0].offset < end:  # past transaction markers too
            for message in consumer.consume(1000, 1.0):
                key, value = message.key() or b"", message.value()
                if message.error() is None and value and key.startswith(f"{board}\0".encode()):
                    found[2 if value[0] & 0x20 else 1] += 1
        return found
    finally:
        consumer.close()


def check_node(node: NodeRunner, client: redis.Redis, settings: Settings) -> tuple[int, int]:
    """(members compared, members with meta compared) over every hot board, once caught up."""
    wait_memory_caught_up(node, client, settings)

    def compare(app: object) -> tuple[int, int]:
        boards = app[APP_STATE].hot.boards  # type: ignore[index]
        states = sum(assert_memory_equals_redis(client, settings.key_prefix, boards[b]) for b in HOT)
        return states, sum(assert_meta_equals_redis(client, settings.key_prefix, boards[b]) for b in HOT)

    result: tuple[int, int] = node.call(compare)
    return result


def test_workers_of_both_record_formats_side_by_side_keep_memory_exact(make_settings, tmp_path, rclient):
    new = hot_settings(make_settings, tmp_path, worker_id="pod-new")
    old = new.model_copy(update={"cache_record_format": 1, "worker_id": "pod-old"})
    start = now_ms()
    by_key: dict[bytes, list[Message]] = {}
    for message in generate(seed=41, total=9_000, now_ms=start, boards=ALL_BOARDS):
        by_key.setdefault(message.key, []).append(message)
    # a third of each board's messages (in their order) a part: every board in every part
    thirds = [[m for ms in by_key.values() for m in ms[len(ms) * k // 3 : len(ms) * (k + 1) // 3]]
              for k in range(3)]  # fmt: skip

    def applied(parts: int) -> int:
        return sum(model_with_history([m for part in thirds[:parts] for m in part], start)[0].seq.values())

    with NodeRunner(new) as live:  # follows the whole roll
        with running_worker(old):  # the old release alone
            produce(new, thirds[0])
            wait_for(lambda: applied_so_far(rclient, new) >= applied(1), 120, "part 1 applied")
            with running_worker(new):  # both, while the roll goes on
                produce(new, thirds[1])
                wait_for(lambda: applied_so_far(rclient, new) >= applied(2), 120, "part 2 applied")
        with running_worker(new):  # the new release alone
            produce(new, thirds[2])
            wait_for(lambda: applied_so_far(rclient, new) >= applied(3), 120, "part 3 applied")
            wait_for(lambda: live.get("/readyz")[0] == 200, 60, "the live node ready")
            states, metas = check_node(live, rclient, new)
            assert states >= 50 and metas >= 5  # members compared: states, and metas held
    for board in HOT:
        found = formats_on_topic(new, board)
        assert found[1] > 0 and found[2] > 0, (board, found)  # both formats, or this proves nothing
    with NodeRunner(new) as replayed:  # a node started after: the topic replayed
        wait_for(lambda: replayed.get("/readyz")[0] == 200, 60, "the replaying node ready")
        assert check_node(replayed, rclient, new) == (states, metas)
