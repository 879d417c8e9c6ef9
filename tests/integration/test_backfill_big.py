"""A backfill bigger than the producer's local queue (librdkafka's default is 100k messages)
waits for deliveries instead of failing with BufferError (record format 1: a record per member);
in format 2 the same board goes out in chunks of CHUNK_MEMBERS members."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from common.cache_records import CHUNK_MEMBERS, partition_for
from common.store.encoding import hot_flag
from rankstream.topics import CACHE_PARTITIONS, ensure_topics
from tests.helpers import backfill

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("record_format", [1, 2])
def test_backfill_of_a_board_larger_than_the_producer_queue(make_settings, tmp_path, rclient, record_format):
    boards = tmp_path / "boards.yaml"
    boards.write_text("timezone: UTC\ntypes:\n  gift: {windows: [total]}\nhot:\n  - {board: 'gift:big'}\n")
    settings = make_settings(boards=boards, cache_record_format=record_format)
    ensure_topics(settings)
    state = f"{settings.key_prefix}{{gift:big}}:h:total"
    members = 120_000
    for start in range(0, members, 10_000):
        rclient.hset(state, mapping={f"u{i}": f"{i}|1700000000000" for i in range(start, start + 10_000)})
    rclient.set(f"{settings.key_prefix}{{gift:big}}:seq", members)
    backfill(settings, rclient)
    reader = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "count"})
    partition = TopicPartition(settings.topic_cache, partition_for("gift:big", CACHE_PARTITIONS))
    _, high = reader.get_watermark_offsets(partition, timeout=10)
    reader.close()
    # every member (format 2: in chunks of CHUNK_MEMBERS), a reset at the seq before, the marker
    assert high == (members if record_format == 1 else members // CHUNK_MEMBERS) + 2
    flag = rclient.get(f"{settings.key_prefix}{{gift:big}}:hot")
    assert flag == hot_flag(members, ("total",)).encode() == b"120000|total"  # backfilled at that seq
