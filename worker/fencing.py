"""Fencing a dead predecessor at once, instead of waiting for the broker.

Under KIP-447 a partition whose last owner died mid-transaction can't be read by its new owner
until that transaction ends (its offsets are "unstable"), and read_committed readers of the
outputs wait too. The broker aborts it only after `transaction.timeout.ms` plus its abort-check
interval (10 s + up to 10 s by default). So each worker records, in Redis, the partitions it
holds, and gives them back when they are revoked (after their last transaction committed). A
worker assigned a partition that still names another owner knows that owner never gave it back
(killed, or a zombie that lost it): it opens a producer with that owner's transactional id,
whose `init_transactions` bumps the epoch and aborts the leftover transaction now. A plain
rebalance leaves nothing to fence; a restarted pod keeps its own id. Any failure here only
falls back to the broker's own timeout. (Asking the group who is alive does not work: during
a rebalance its member list can be incomplete, and a live worker would be fenced.)"""

from __future__ import annotations

import logging

import redis
from confluent_kafka import KafkaException, Producer, TopicPartition

from common.settings import Settings
from common.store.keys import partition_owners
from common.store.topology import Store

_log = logging.getLogger(__name__)
FENCE_TIMEOUT_S = 10.0


class PredecessorFence:
    def __init__(self, settings: Settings, client: Store, transactional_id: str) -> None:
        self._settings = settings
        self._client = client
        self._tid = transactional_id
        self.fenced: list[str] = []

    def _key(self, topic: str) -> str:
        return partition_owners(self._settings.key_prefix, self._settings.worker_group, topic)

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        """Take the partitions; fence whoever held one and never gave it back."""
        try:
            stale: set[str] = set()
            for topic, numbers in _by_topic(partitions).items():
                previous = self._client.hmget(self._key(topic), numbers)
                self._client.hset(self._key(topic), mapping=dict.fromkeys(numbers, self._tid))
                stale |= {p.decode() if isinstance(p, bytes) else p for p in previous if p is not None}
            for tid in sorted(stale - {self._tid}):
                self._fence(tid)
        except (redis.RedisError, KafkaException) as exc:
            _log.warning(
                "could not fence predecessors; the broker will time them out", extra={"error": str(exc)}
            )

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        """Give the partitions back (their last transaction is committed by now): the next
        owner has no one to fence. A partition lost (not revoked) keeps the entry, on purpose."""
        try:
            for topic, numbers in _by_topic(partitions).items():
                owners = self._client.hmget(self._key(topic), numbers)
                mine = [
                    n for n, o in zip(numbers, owners, strict=True) if o in (self._tid, self._tid.encode())
                ]
                if mine:
                    self._client.hdel(self._key(topic), *mine)
        except redis.RedisError as exc:  # the next owner fences us: harmless once we are gone
            _log.warning("could not release partitions", extra={"error": str(exc)})

    def _fence(self, transactional_id: str) -> None:
        producer = Producer(self._settings.librdkafka({"transactional.id": transactional_id}))
        producer.init_transactions(FENCE_TIMEOUT_S)
        self.fenced.append(transactional_id)
        _log.info(
            "fenced a worker that died holding partitions", extra={"transactional_id": transactional_id}
        )


def _by_topic(partitions: list[TopicPartition]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(str(tp.partition))
    return out
