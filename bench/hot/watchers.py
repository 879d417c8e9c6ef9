"""The stages the visibility run watches, one thread each: when each visibility event was first
seen in update_rank, in Redis, in update_cache, and on the API's top."""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, TopicPartition

from bench.harness.kafka import QUIET_KAFKA
from bench.harness.probes import HOST
from bench.hot.board import BOARD
from common.cache_records import Kind, decode
from common.settings import Settings

POLL_S = 0.002


class Watcher:
    """A thread that records when each visibility event i (0-based) was first seen by one
    stage; `_step` returns the highest index seen so far (-1: none) or None on a transient
    error. Times are time.monotonic() (one clock for every thread of this process)."""

    name = "watcher"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.seen_at: dict[int, float] = {}
        self.highest = -1
        self.steps = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.close()

    def close(self) -> None:
        pass

    def _step(self) -> int | None:
        raise NotImplementedError

    def _run(self) -> None:
        next_step = time.monotonic()
        while not self._stop.is_set():
            try:
                index = self._step()
            except Exception as exc:  # noqa: BLE001 - recorded; a few are tolerated
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) > 100:
                    return
                index = None
            self.steps += 1
            if index is not None and index > self.highest:
                now = time.monotonic()
                for i in range(self.highest + 1, index + 1):
                    self.seen_at.setdefault(i, now)
                self.highest = index
            if self.interval_s:
                # a fixed tick; after a slow step the missed ticks are skipped, not caught up
                next_step = max(next_step + self.interval_s, time.monotonic())
                time.sleep(max(0.0, next_step - time.monotonic()))


class TopPoller(Watcher):
    """The API's top 1, every POLL_S on one keep-alive connection. When v<j> is on top,
    every v<i>, i <= j, is in memory (one board's records stay in order end to end)."""

    name = "top-poller"

    def __init__(self, base: str) -> None:
        super().__init__(POLL_S)
        parts = urllib.parse.urlsplit(base)
        self._conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=5)
        self._path = f"/v1/boards/{BOARD}/top?limit=1"
        self.direct: set[int] = set()  # events seen on top themselves

    def close(self) -> None:
        self._conn.close()

    def _step(self) -> int | None:
        self._conn.request("GET", self._path)
        items = orjson.loads(self._conn.getresponse().read())["items"]
        member = items[0]["member"] if items else ""
        if not (member.startswith("v") and member[1:].isdigit()):
            return -1
        self.direct.add(int(member[1:]))
        return int(member[1:])


class SeqPoller(Watcher):
    """The board's seq in Redis, every POLL_S: the worker applied event i once
    seq >= base + i + 1."""

    name = "seq-poller"

    def __init__(self, client: redis.Redis, key: str, base: int) -> None:
        super().__init__(POLL_S)
        self._client, self._key, self._base = client, key, base

    def _step(self) -> int | None:
        return int(self._client.get(self._key) or 0) - self._base - 1


class TopicWatcher(Watcher):
    """A consumer of a topic's partitions from their ends: when each event (or its state
    record) became readable there. `index` maps a message to its event index, or None."""

    name = "topic-watcher"

    def __init__(
        self,
        settings: Settings,
        topic: str,
        index: Callable[[bytes, bytes], int | None],
        partitions: Sequence[int] | None = None,
        conf: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(0.0)  # poll() waits for data itself
        self._index = index
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": f"bench-watch-{os.getpid()}",
                "enable.auto.commit": False,
                **QUIET_KAFKA,
                **(conf or {}),
            }
        )
        count = len(self._consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        assigned = []
        for partition in partitions if partitions is not None else range(count):
            _, end = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            assigned.append(TopicPartition(topic, partition, end))
        self._consumer.assign(assigned)

    def close(self) -> None:
        self._consumer.close()

    def _step(self) -> int | None:
        msg = self._consumer.poll(0.01)
        if msg is None or msg.error() is not None:
            return None
        key, value = msg.key(), msg.value()
        return None if key is None or value is None else self._index(key, value)


def event_index(key: bytes, value: bytes) -> int | None:
    """update_rank: a visibility event's index."""
    member = orjson.loads(value).get("member", "")
    return int(member[1:]) if isinstance(member, str) and member[:1] == "v" and member[1:].isdigit() else None


def cache_index(key: bytes, value: bytes) -> int | None:
    """update_cache: the index of a visibility member's state record."""
    record = decode(key, value)
    if record.kind is not Kind.STATE or not record.member.startswith("v"):
        return None
    return int(record.member[1:])
