"""Fencing a dead predecessor at once, instead of waiting for the broker.

Under KIP-447 a partition whose last owner died mid-transaction can't be read by its new owner
until that transaction ends (its offsets are "unstable"), and read_committed readers of the
outputs wait too. The broker aborts it only after `transaction.timeout.ms` plus its abort-check
interval (10 s + up to 10 s by default). So each worker records, in Redis, that it took a
partition; a worker assigned a partition whose previous owner is no longer a member of the
group opens a producer with that owner's transactional id: its `init_transactions` bumps the
epoch, which aborts the leftover transaction now. A previous owner still in the group (a plain
rebalance, or a restarted pod that kept its id) is never touched. Any failure here only falls
back to the broker's own timeout."""

from __future__ import annotations

import logging

import redis
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from common.keys import partition_owners
from common.settings import Settings

_log = logging.getLogger(__name__)
FENCE_TIMEOUT_S = 10.0


class PredecessorFence:
    def __init__(self, settings: Settings, client: redis.Redis, transactional_id: str) -> None:
        self._settings = settings
        self._client = client
        self._tid = transactional_id  # also the worker consumer's client.id: how members are told apart
        self.fenced: list[str] = []

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        by_topic: dict[str, list[str]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(str(tp.partition))
        try:
            stale: set[str] = set()
            for topic, numbers in by_topic.items():
                key = partition_owners(self._settings.key_prefix, self._settings.worker_group, topic)
                previous = self._client.hmget(key, numbers)
                self._client.hset(key, mapping=dict.fromkeys(numbers, self._tid))
                owners = {p.decode() if isinstance(p, bytes) else p for p in previous if p is not None}
                stale |= owners - {self._tid}
            if stale:
                for tid in sorted(stale - self._live_members()):
                    self._fence(tid)
        except (redis.RedisError, KafkaException) as exc:
            _log.warning(
                "could not fence predecessors; the broker will time them out", extra={"error": str(exc)}
            )

    def _live_members(self) -> set[str]:
        group = self._settings.worker_group
        admin = AdminClient(self._settings.librdkafka())
        described = admin.describe_consumer_groups([group], request_timeout=FENCE_TIMEOUT_S)[group]
        return {member.client_id for member in described.result(timeout=FENCE_TIMEOUT_S).members}

    def _fence(self, transactional_id: str) -> None:
        producer = Producer(self._settings.librdkafka({"transactional.id": transactional_id}))
        producer.init_transactions(FENCE_TIMEOUT_S)
        self.fenced.append(transactional_id)
        _log.info(
            "fenced a worker that left the group mid-transaction",
            extra={"transactional_id": transactional_id},
        )
