"""The failover benchmark: how long a worker killed with kill -9 holds up its partitions and
read_committed readers (goal: at most 10 s each).

On a private Kafka and Redis, two `rankstream worker` processes share the group while a
producer sends a steady stream (good events plus a share of bad ones, so the dead-letter topic
gets records all the time). Then one worker is killed with SIGKILL, mid-transaction:

- `partitions_held_s`: the longest produce-to-applied time (board seq in Redis) of the events
  sent in the first 2 s after the kill: those on the dead worker's partitions wait until the
  survivor (or the restarted worker) has taken them over.
- `readers_held_s`: the longest a read_committed reader of the dead-letter topic waited for a
  bad event sent in those 2 s (its LSO is stuck behind the dead worker's open transaction until
  that is aborted).

Two ways a pod dies: `restart` (its container restarts in the same pod: the same
transactional.id, so the new process's init_transactions aborts the leftover at once), and
`replaced` (the pod is gone: the broker aborts the leftover after transaction.timeout.ms plus
its abort-check interval). Knob: RANKSTREAM_BENCH_FAILOVER_RATE (events/s, default 400).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

from bench.common import REPO, BenchError, Result, env_int, say
from bench.harness.nodes import start_worker
from bench.harness.processes import Child, Children, children
from bench.harness.report import Row, git_commit, machine, timestamp
from bench.harness.stack import Stack, private_stack
from common.settings import Settings
from rankstream.topics import ensure_topics

FOLDER = REPO / ".stack" / "bench-failover"
BOARDS_YAML = "timezone: UTC\ntypes:\n  gift: {windows: [total, day]}\n"
BOARDS = [f"gift:r{i}" for i in range(24)]
BAD_EVERY = 10  # one event in ten is bad (no member): the DLQ gets a record every 25 ms at 400/s
WARM_S, AFTER_S = 8.0, 40.0
SAMPLE_S = 2.0  # the events and dead letters sent in the first seconds after the kill are timed
GOAL_S = 10.0

ROWS = [
    Row(f"{case}.{measure}", "held_s", at_most=True)
    for case in ("restart", "replaced")
    for measure in ("partitions_held_s", "readers_held_s")
]


class Stream:
    """A steady producer; remembers when each bad event was sent, by id."""

    def __init__(self, settings: Settings, rate: int) -> None:
        self._settings, self._rate = settings, rate
        self.sent = 0
        self.good_sent_at: dict[str, list[float]] = {board: [] for board in BOARDS}  # per board, in order
        self.bad_sent_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self._settings.kafka_bootstrap, "linger.ms": 2})
        started = time.monotonic()
        for n in itertools.count():
            if self._stop.is_set():
                break
            delay = started + n / self._rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            board = BOARDS[n % len(BOARDS)]
            event: dict[str, Any] = {"id": f"e{n}", "board": board, "member": f"m{n % 500}", "score": 1}
            if n % BAD_EVERY == 0:
                del event["member"]
                self.bad_sent_at[event["id"]] = time.monotonic()
            producer.produce(self._settings.topic_updates, orjson.dumps(event), key=board.encode())
            if "member" in event:
                self.good_sent_at[board].append(time.monotonic())
            producer.poll(0)
            self.sent = n + 1
        producer.flush(10)


class DlqReader:
    """A read_committed reader of the dead-letter topic: when each bad event reached it."""

    def __init__(self, settings: Settings) -> None:
        self._consumer = Consumer(
            {"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"reader-{time.time_ns()}",
             "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
        )  # fmt: skip
        self._consumer.subscribe([settings.topic_dlq])
        self.seen_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DlqReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.1):
                value = msg.value() if msg.error() is None else None
                if value:
                    self.seen_at.setdefault(orjson.loads(value)["id"], time.monotonic())


def applied(stack: Stack, settings: Settings) -> list[int]:
    """Per board (in BOARDS order), how many of its events are applied: its seq."""
    keys = [f"{settings.key_prefix}{{{b}}}:seq" for b in BOARDS]
    return [int(v or 0) for v in stack.client.mget(keys)]


def apply_latencies(
    stack: Stack, settings: Settings, stream: Stream, since: float, until: float
) -> list[float]:
    """Produce-to-applied seconds of the good events sent in [since, until): each board's seq
    says how many of its events (in order) are applied, polled every 20 ms for AFTER_S."""
    applied_at: dict[tuple[str, int], float] = {}
    done = [0] * len(BOARDS)
    while time.monotonic() < since + AFTER_S:
        now = time.monotonic()
        for i, (board, seq) in enumerate(zip(BOARDS, applied(stack, settings), strict=True)):
            for index in range(done[i], seq):
                applied_at[(board, index)] = now
            done[i] = max(done[i], seq)
        time.sleep(0.02)
    latencies = []
    for board, sent in stream.good_sent_at.items():
        for index, at in enumerate(sent):
            if since <= at < until:
                if (board, index) not in applied_at:
                    raise BenchError(
                        f"{board} event {index} sent after the kill never applied within {AFTER_S} s"
                    )
                latencies.append(applied_at[(board, index)] - at)
    return latencies


def worker(group: Children, settings: Settings, name: str) -> Child:
    """A worker named like its pod: the name is its transactional.id's suffix."""
    return start_worker(group, name, settings, http_port=0, worker_id=name)


def scenario(stack: Stack, group: Children, settings: Settings, restart: bool, rate: int) -> Result:
    ensure_topics(settings)
    with Stream(settings, rate) as stream, DlqReader(settings) as reader:
        victim = worker(group, settings, "pod-a")
        worker(group, settings, "pod-b")
        time.sleep(WARM_S)
        victim.proc.kill()
        killed = time.monotonic()
        if restart:
            worker(group, settings, "pod-a")  # the same pod name: the same transactional.id
        latencies = apply_latencies(stack, settings, stream, killed, killed + SAMPLE_S)
        after = {i: t for i, t in stream.bad_sent_at.items() if killed <= t < killed + SAMPLE_S}
        waits = [reader.seen_at[i] - t for i, t in after.items() if i in reader.seen_at]
        if len(waits) < len(after):
            raise BenchError(f"{len(after) - len(waits)} dead letters never reached the reader")
        return {
            "partitions_held_s": round(max(latencies), 2),
            "readers_held_s": round(max(waits), 2),
            "events_sampled": len(latencies),
            "dead_letters_sampled": len(waits),
        }


def run() -> Result:
    rate = env_int("FAILOVER_RATE", 400)
    FOLDER.mkdir(parents=True, exist_ok=True)
    with private_stack(FOLDER / "servers", BOARDS_YAML) as stack:
        result: Result = {"when": timestamp(), "commit": git_commit()[0], "machine": machine(), "rate": rate,
                          "goals": {"held_s": GOAL_S}}  # fmt: skip
        for name, restart in (("restart", True), ("replaced", False)):
            settings = stack.settings(name, key_prefix=f"bf{name}:", worker_group=f"bench-failover-{name}")
            with children(FOLDER / name) as group:
                say(f"failover: kill -9 one of two workers ({name})")
                result[name] = scenario(stack, group, settings, restart, rate)
        result["goal_met"] = all(result[n][k] <= GOAL_S for n in ("restart", "replaced")
                                 for k in ("partitions_held_s", "readers_held_s"))  # fmt: skip
        return result
