"""The hot-board benchmark: a board of 1,000,000 members served from an API node's memory.

On one private Kafka and Redis, back to back (the box is shared and noisy: ratios within the
run count, not absolute numbers):

1. Fill `gift:hot` with 1M members through the worker's write path (Applier), then publish its
   state to update_cache as a worker does at start (worker.main.cache_publisher: backfill).
2. `ready_s_1m`: a real `rankstream api` process, from spawn to /readyz 200 (polled every
   20 ms); `replay_records_per_s`: records replayed / the API's own `ready_after_s`.
3. `bytes_per_member`: RSS growth of a fresh process building what the API builds (HotWindow
   with 1M puts, finish_loading, meta for 5 %), per member; tracemalloc's count beside it.
4. `hot_top10_rps` (top 10 from memory), `bare_rps` (bare aiohttp, same body) and
   `redis_top10_rps` (a second API node without the hot section, `nocache=1`, same data):
   wrk, interleaved rounds, best of each.
5. `visibility_p99_ms`: with a real worker and the hot API running, events produced at a
   steady rate, each a new member that outranks all others; a poller reads the top 1 every
   2 ms. Event i is visible once the top member is v<j>, j >= i (the board's events stay in
   order from update_rank to update_cache to memory).

Knobs: RANKSTREAM_BENCH_HOT_MEMBERS (1000000), RANKSTREAM_BENCH_ROUNDS (2),
RANKSTREAM_BENCH_WRK_S (8), RANKSTREAM_BENCH_VIS_RATE (500), RANKSTREAM_BENCH_VIS_S (10),
RANKSTREAM_BENCH_PROFILE (1: cProfile the replay in a child process; 0: skip it).

`python -m bench.hot memory N [--tracemalloc]` and `python -m bench.hot profile ...` are the
helper processes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import http.client
import math
import os
import pstats
import random
import sys
import threading
import time
import tracemalloc
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.api import (
    HOST,
    QUIET_KAFKA,
    Child,
    Children,
    Servers,
    Target,
    check_top,
    children,
    cpu_us_per_request,
    fill,
    get_json,
    header,
    http_get,
    met,
    percentile,
    private_servers,
    ratio,
    rss_bytes,
    start_api,
    start_bare,
    wait_ready,
    write_boards,
    wrk_rounds,
)
from bench.common import ENV_PREFIX, REPO, BenchError, CpuMeter, Result, Row, child_env, env_int, say
from common.boards import BoardsConfig, load_boards
from common.cache_records import Kind, decode, partition_for
from common.clients import kafka_producer
from common.settings import Settings, load_settings
from rankstream.stack import free_port
from rankstream.topics import CACHE_PARTITIONS, UPDATE_PARTITIONS, ensure_topics
from worker.main import cache_publisher

FOLDER = REPO / ".stack" / "bench" / "hot"
BOARD = "gift:hot"
HOT_YAML = (
    f'timezone: UTC\ntypes:\n  gift: {{windows: [total]}}\nhot:\n  - {{board: "{BOARD}", windows: [total]}}\n'
)
COLD_YAML = "timezone: UTC\ntypes:\n  gift: {windows: [total]}\n"
DEFAULT_MEMBERS = 1_000_000
DEFAULT_ROUNDS = 2
DEFAULT_WRK_S = 8
DEFAULT_VIS_RATE = 500
DEFAULT_VIS_S = 10
VIS_POLL_S = 0.002
VIS_LINGER_MS = 5
VIS_SCORE = 10**12  # above every filled score: each visibility event takes rank 1
VIS_WAIT_S = 10.0  # after the last event, how long the poller may wait for it
BACKFILL_TIMEOUT_S = 300.0
WORKER_READY_S = 90.0
# the bench's own producers (fill events, the backfill workaround) may queue this many
BIG_QUEUE = {"queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000}

GOALS: dict[str, float] = {
    "replay_records_per_s": 300_000,
    "ready_s_1m": 5,
    "bytes_per_member": 150,
    "hot_vs_bare": 0.85,
    "hot_vs_redis": 3,
    "visibility_p99_ms": 100,
}
AT_MOST = ("ready_s_1m", "bytes_per_member", "visibility_p99_ms")

ROWS = [
    Row("members"),
    Row("fill_members_per_s"),
    Row("backfill_s"),
    Row("backfill_records_per_s"),
    Row("ready_s_1m", "ready_s_1m", at_most=True),
    Row("ready_after_s"),
    Row("replay_records_per_s", "replay_records_per_s"),
    Row("bytes_per_member", "bytes_per_member", at_most=True),
    Row("bytes_per_member_tracemalloc"),
    Row("api_rss_bytes_per_member"),
    Row("bare_rps"),
    Row("hot_top10_rps"),
    Row("redis_top10_rps"),
    Row("hot_vs_bare", "hot_vs_bare"),
    Row("hot_vs_redis", "hot_vs_redis"),
    Row("hot_vs_bare_cpu"),
    Row("hot_vs_redis_cpu"),
    Row("hot_top10_p50_ms"),
    Row("hot_top10_p99_ms"),
    Row("visibility_p50_ms"),
    Row("visibility_p99_ms", "visibility_p99_ms", at_most=True),
    Row("visibility_max_ms"),
    Row("visibility_events"),
    Row("visibility_observed"),
    Row("visibility_resolved"),
    Row("details.server_cpu_us_per_request.bare"),
    Row("details.server_cpu_us_per_request.hot_top10"),
    Row("details.server_cpu_us_per_request.redis_top10"),
    Row("details.cpu_pct.hot_top10.others"),
    Row("details.visibility.stages.update_rank.p50_ms"),
    Row("details.visibility.stages.update_rank.p99_ms"),
    Row("details.visibility.stages.redis.p50_ms"),
    Row("details.visibility.stages.redis.p99_ms"),
    Row("details.visibility.stages.update_cache.p50_ms"),
    Row("details.visibility.stages.update_cache.p99_ms"),
    Row("details.visibility.stages.api.p50_ms"),
    Row("details.visibility.stages.api.p99_ms"),
    Row("details.visibility.cpu_pct.worker"),
    Row("details.visibility.cpu_pct.api"),
    Row("details.visibility.cpu_pct.others"),
]


# --- 1. fill and backfill ---------------------------------------------------------------------


def worker_producer(settings: Settings, **extra: Any) -> Producer:
    """The producer `rankstream worker` publishes update_cache with (worker/main.py build_loop)."""
    return kafka_producer(
        settings, {"enable.idempotence": True, "acks": "all", **extra}, defaults={"linger.ms": 5}
    )


def backfill(servers: Servers, settings: Settings, boards: BoardsConfig) -> tuple[Settings, Result]:
    """cache_publisher() as a starting worker calls it, then flush. If the worker's own producer
    cannot take the board (a BufferError: its local queue is full), that is reported and the
    backfill is redone into a fresh update_cache topic with a producer whose queue holds it all,
    so the rest of the benchmark still runs; the settings returned name the topic used."""
    result: Result = {}
    producer = worker_producer(settings)
    started = time.monotonic()
    try:
        publisher = cache_publisher(settings, boards, producer, servers.client)
    except BufferError as exc:
        queued = len(producer)
        result["worker_producer_error"] = f"BufferError: {exc} (after {time.monotonic() - started:.1f} s)"
        say(f"backfill with the worker's producer FAILED: {exc}; {queued} records were queued")
        producer.purge()
        producer.flush(10)
        settings = settings.model_copy(update={"topic_cache": settings.topic_cache + ".retry"})
        ensure_topics(settings)
        producer = worker_producer(settings, **BIG_QUEUE)
        result["workaround"] = "a fresh update_cache topic and queue.buffering.max.messages=2000000"
        started = time.monotonic()
        publisher = cache_publisher(settings, boards, producer, servers.client)
    left = producer.flush(BACKFILL_TIMEOUT_S)
    elapsed = time.monotonic() - started
    if left:
        raise BenchError(f"backfill: {left} records not acknowledged")
    flag = servers.client.get(f"{settings.key_prefix}{{{BOARD}}}:hot")
    if flag is None:
        raise BenchError("backfill: the board's hot flag was not set")
    result.update(
        records=publisher.published,
        backfill_s=round(elapsed, 2),
        records_per_s=round(publisher.published / elapsed, 1),
        topic=settings.topic_cache,
    )
    return settings, result


# --- 2. replay --------------------------------------------------------------------------------


def replay(group: Children, settings: Settings, members: int) -> tuple[Child, str, Result]:
    started = time.monotonic()
    api, base = start_api(group, "api-hot", settings)
    _, status = wait_ready(api, f"{base}/readyz", poll_s=0.02)
    ready_s = time.monotonic() - started
    board = status["boards"][BOARD]
    replayed, after = int(board["records_replayed"]), float(status["ready_after_s"])
    check_top(get_json(f"{base}/v1/boards/{BOARD}/top?limit=10"), "memory", members)
    say(f"hot API ready in {ready_s:.2f} s ({replayed:,} records, ready_after_s {after:.2f})")
    return (
        api,
        base,
        {
            "ready_s": round(ready_s, 3),
            "ready_after_s": round(after, 3),
            "records_replayed": replayed,
            "replay_records_per_s": round(replayed / after, 1) if after > 0 else math.nan,
            "replay_records_per_s_from_spawn": round(replayed / ready_s, 1),
            "readyz": status,
        },
    )


def profile_replay(group: Children, settings: Settings) -> Result:
    """The API's replay (HotBoards, in a child process of its own) under cProfile."""
    argv = [sys.executable, "-m", "bench.hot", "profile", "--bootstrap", settings.kafka_bootstrap]
    argv += ["--redis", settings.redis_url.get_secret_value(), "--boards", str(settings.boards)]
    argv += ["--prefix", settings.key_prefix, "--topic", settings.topic_cache]
    return _child_json(argv, "replay profile", timeout=300)


def _child_json(argv: Sequence[str], what: str, timeout: float) -> Result:
    import subprocess  # noqa: PLC0415 - only here: every other process goes through Children

    proc = subprocess.run(
        list(argv), cwd=REPO, env=child_env({}), capture_output=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"{what} exited with {proc.returncode}: {proc.stderr.decode()[-400:]}")
    result: Result = orjson.loads(proc.stdout)
    return result


def _profile_main(args: argparse.Namespace) -> Result:
    from api.hotboards import HotBoards  # noqa: PLC0415 - the helper process only

    settings = load_settings(
        {},
        kafka_bootstrap=args.bootstrap,
        redis_url=args.redis,
        boards=Path(args.boards),
        key_prefix=args.prefix,
        topic_cache=args.topic,
        kafka=QUIET_KAFKA,
    )
    hot = HotBoards(settings, load_boards(settings.boards))

    def stop_when_ready() -> None:
        while not hot.ready and not hot._stop.is_set():
            time.sleep(0.005)
        hot._stop.set()  # the follow loop ends within one consume timeout

    threading.Thread(target=stop_when_ready, daemon=True).start()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    hot._run()  # the replay thread's body, on this thread so cProfile sees it
    profiler.disable()
    wall = time.perf_counter() - started
    stats: dict[Any, tuple[int, int, float, float, Any]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in stats.values())

    def name(func: tuple[str, int, str]) -> str:
        path, line, fn = func
        short = path.replace(str(REPO) + "/", "") if path.startswith(str(REPO)) else Path(path).name
        return f"{short}:{line}({fn})" if line else fn

    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]

    def ours(func: tuple[str, int, str]) -> bool:
        path, _, fn = func
        if path == "~":  # builtins: the Kafka consume call, sorting
            return "consume" in fn or "sort" in fn
        return any(part in path for part in ("hotboards", "hotwindow", "cache_records", "sortedlist"))

    by_cum = sorted((kv for kv in stats.items() if ours(kv[0])), key=lambda kv: kv[1][3], reverse=True)[:15]
    return {
        "ready_after_s_profiled": None if hot.ready_after_s is None else round(hot.ready_after_s, 3),
        "wall_s_profiled": round(wall, 3),
        "records_replayed": sum(b.replayed for b in hot.boards.values()),
        "profiled_cpu_s": round(total, 3),
        "top_tottime": [
            {"function": name(f), "calls": nc, "tottime_s": round(tt, 3), "share": round(tt / total, 3)}
            for f, (_, nc, tt, _, _) in ranked
        ],
        "top_cumulative_s": {name(f): round(ct, 3) for f, (_, _, _, ct, _) in by_cum},
    }


# --- 3. memory --------------------------------------------------------------------------------


def memory(members: int, use_tracemalloc: bool) -> Result:
    argv = [sys.executable, "-m", "bench.hot", "memory", str(members)]
    return _child_json([*argv, "--tracemalloc"] if use_tracemalloc else argv, "memory child", timeout=600)


def _memory_main(members: int, use_tracemalloc: bool) -> Result:
    """What HotBoards holds for one `total` window: HotWindow(desc, inv) with every member put,
    then finish_loading(), and the meta dict. Members and metas are the objects the API keeps:
    decoded from update_cache records (a member id split from the key, the meta a slice of the
    value; an orjson.dumps() result would hold a 4 KiB buffer whatever its length)."""
    from api.hotwindow import HotWindow  # noqa: PLC0415 - the helper process only
    from common.cache_records import state_record  # noqa: PLC0415
    from common.ranking import TieMode  # noqa: PLC0415

    rng = random.Random(20261124)
    now_ms = int(time.time() * 1000)
    gc.collect()
    before = rss_bytes()
    if use_tracemalloc:
        tracemalloc.start()
    started = time.perf_counter()
    window = HotWindow(True, TieMode.INV)
    meta: dict[str, bytes] = {}
    for i in range(members):
        raw_meta = f'{{"name":"Player {i}","lvl":{i % 60}}}'.encode() if i % 20 == 0 else None
        score = float(int(100 * rng.paretovariate(1.2)))
        tie = now_ms - rng.randrange(86_400_000)
        record = decode(
            *state_record(BOARD, "total", f"u{i:07d}", score=score, tie_ms=tie, seq=i + 1, meta=raw_meta)
        )
        window.put(record.member, record.score, record.tie_ms, record.seq)
        if record.meta:
            meta[record.member] = record.meta
    put_s = time.perf_counter() - started
    window.finish_loading()
    build_s = time.perf_counter() - started - put_s
    gc.collect()
    after = rss_bytes()
    out: Result = {
        "members": len(window),
        "meta_members": len(meta),
        "put_s": round(put_s, 3),
        "finish_loading_s": round(build_s, 3),
    }
    if use_tracemalloc:
        current, peak = tracemalloc.get_traced_memory()
        out.update(traced_bytes=current, traced_peak_bytes=peak, bytes_per_member=round(current / members, 1))
    elif before is not None and after is not None:
        out.update(rss_before=before, rss_after=after, bytes_per_member=round((after - before) / members, 1))
    return out


# --- 5. visibility ----------------------------------------------------------------------------


def start_worker(group: Children, settings: Settings) -> tuple[Child, int]:
    port = free_port()
    env = child_env(
        {
            "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "RANKSTREAM_REDIS_URL": settings.redis_url.get_secret_value(),
            "RANKSTREAM_BOARDS": str(settings.boards),
            "RANKSTREAM_KEY_PREFIX": settings.key_prefix,
            "RANKSTREAM_TOPIC_UPDATES": settings.topic_updates,
            "RANKSTREAM_TOPIC_DLQ": settings.topic_dlq,
            "RANKSTREAM_TOPIC_CACHE": settings.topic_cache,
            "RANKSTREAM_WORKER_GROUP": "bench-hot",
            "RANKSTREAM_WORKER_HTTP_PORT": str(port),
            "RANKSTREAM_LOG_LEVEL": "WARNING",
        }
    )
    return group.spawn("worker", [sys.executable, "-m", "rankstream.cli", "worker"], env), port


def wait_assigned(worker: Child, port: int) -> float:
    """Until the worker's /readyz says it holds every update_rank partition; seconds."""
    started = time.monotonic()
    while time.monotonic() - started < WORKER_READY_S:
        worker.check_alive()
        _, body = http_get(f"http://{HOST}:{port}/readyz", timeout=2)
        try:
            if body and int(orjson.loads(body).get("partitions", 0)) >= UPDATE_PARTITIONS:
                return time.monotonic() - started
        except (orjson.JSONDecodeError, AttributeError):
            pass
        time.sleep(0.1)
    raise BenchError(f"the worker got no partitions within {WORKER_READY_S:.0f}s: {worker.tail()}")


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
    """The API's top 1, every VIS_POLL_S on one keep-alive connection. When v<j> is on top,
    every v<i>, i <= j, is in memory (one board's records stay in order end to end)."""

    name = "top-poller"

    def __init__(self, base: str) -> None:
        super().__init__(VIS_POLL_S)
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
    """The board's seq in Redis, every VIS_POLL_S: the worker applied event i once
    seq >= base + i + 1."""

    name = "seq-poller"

    def __init__(self, client: redis.Redis, key: str, base: int) -> None:
        super().__init__(VIS_POLL_S)
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


def _event_index(key: bytes, value: bytes) -> int | None:
    """update_rank: a visibility event's index."""
    member = orjson.loads(value).get("member", "")
    return int(member[1:]) if isinstance(member, str) and member[:1] == "v" and member[1:].isdigit() else None


def _cache_index(key: bytes, value: bytes) -> int | None:
    """update_cache: the index of a visibility member's state record."""
    record = decode(key, value)
    if record.kind is not Kind.STATE or not record.member.startswith("v"):
        return None
    return int(record.member[1:])


def stage_latencies(produced: Sequence[float], seen_at: dict[int, float]) -> list[float]:
    """ms from produce to first seen, for the events seen (in order, so none is skipped)."""
    return sorted((seen_at[i] - t) * 1000 for i, t in enumerate(produced) if i in seen_at)


def by_second(produced: Sequence[float], seen_at: dict[int, float], start: float) -> list[list[float]]:
    """[p50, max] ms of the events produced in each second of the run: when the slow ones were."""
    buckets: dict[int, list[float]] = {}
    for i, t in enumerate(produced):
        if i in seen_at:
            buckets.setdefault(int(t - start), []).append((seen_at[i] - t) * 1000)
    return [[round(percentile(sorted(v), 0.5), 1), round(max(v), 1)] for _, v in sorted(buckets.items())]


def _stats(values: Sequence[float]) -> Result:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.50), 2),
        "p90_ms": round(percentile(values, 0.90), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(values[-1], 2),
    }


def _wait_applied(client: redis.Redis, key: str, want: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while int(client.get(key) or 0) < want:
        if time.monotonic() > deadline:
            raise BenchError(f"visibility: the warm-up event was not applied within {timeout:.0f}s")
        time.sleep(0.02)


def visibility(group: Children, servers: Servers, settings: Settings, api: Child, base: str) -> Result:
    """Events at a steady rate, each a new member ranked first; per event, when Redis had it
    (worker applied), when update_cache had it (worker published), when the API served it."""
    rate = env_int("VIS_RATE", DEFAULT_VIS_RATE)
    seconds = env_int("VIS_S", DEFAULT_VIS_S)
    n = rate * seconds
    worker, port = start_worker(group, settings)
    assigned_s = wait_assigned(worker, port)
    say(f"visibility: worker assigned in {assigned_s:.1f} s; {n} events at {rate}/s")
    # the clock starts at produce(): a producer's usual linger (5 ms, as the worker's) counts;
    # linger 0 would cost the broker one request per event on a box it shares with the rest
    conf = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "linger.ms": VIS_LINGER_MS,
        "enable.idempotence": True,
    }
    producer = Producer({**conf, **QUIET_KAFKA})
    key = BOARD.encode()
    seq_key = f"{settings.key_prefix}{{{BOARD}}}:seq"
    # a first event (scored low: it never ranks first) opens connections end to end
    seq0 = int(servers.client.get(seq_key) or 0)
    warm = {"id": "vis-warm", "board": BOARD, "member": "w0", "op": "set", "score": 1}
    producer.produce(settings.topic_updates, orjson.dumps(warm), key=key)
    producer.flush(30)
    _wait_applied(servers.client, seq_key, seq0 + 1)
    seq_client = redis.Redis(port=servers.redis_server.port, socket_timeout=5)
    watchers: dict[str, Watcher] = {
        # fetches that wait 10 ms for data (up to 10 ms late) rather than one per event: the
        # broker shares this box with what is measured
        "update_rank": TopicWatcher(
            settings,
            settings.topic_updates,
            _event_index,
            conf={"fetch.wait.max.ms": 10, "fetch.min.bytes": 10**7},
        ),
        "redis": SeqPoller(seq_client, seq_key, seq0 + 1),
        "update_cache": TopicWatcher(
            settings, settings.topic_cache, _cache_index, [partition_for(BOARD, CACHE_PARTITIONS)]
        ),
        "api": TopPoller(base),
    }
    meter = CpuMeter({"worker": worker.pid, "api": api.pid, "bench": os.getpid(), **servers.pids()})
    produced = [0.0] * n
    for watcher in watchers.values():
        watcher.start()
    try:
        time.sleep(0.3)
        meter.start()
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            event = {"id": f"vis-{i}", "board": BOARD, "member": f"v{i}", "op": "set",
                     "score": VIS_SCORE + i, "ts": int(time.time() * 1000)}  # fmt: skip
            produced[i] = time.monotonic()
            producer.produce(settings.topic_updates, orjson.dumps(event), key=key)
            producer.poll(0)
        produce_s = time.monotonic() - start
        if producer.flush(30):
            raise BenchError("visibility: events not acknowledged by Kafka")
        deadline = time.monotonic() + VIS_WAIT_S
        while watchers["api"].highest < n - 1 and time.monotonic() < deadline:
            worker.check_alive()
            time.sleep(0.05)
        cpu = meter.stop()
    finally:
        for watcher in watchers.values():
            watcher.stop()
        seq_client.close()
    for name, watcher in watchers.items():
        if watcher.errors:
            say(f"visibility: {name}: {len(watcher.errors)} errors, e.g. {watcher.errors[0]}")
    stages = {name: _stats(stage_latencies(produced, w.seen_at)) for name, w in watchers.items()}
    api_stage = stages["api"]
    if api_stage["n"] < 0.99 * n:
        raise BenchError(f"visibility: only {api_stage['n']} of {n} events became visible; {worker.tail()}")
    poller = watchers["api"]
    assert isinstance(poller, TopPoller)
    return {
        "events": n,
        "rate": rate,
        "produce_s": round(produce_s, 3),
        "observed": len(poller.direct),  # seen on top themselves
        "resolved": api_stage["n"],  # visible (themselves, or a later event on top)
        **{k: v for k, v in api_stage.items() if k != "n"},
        "stages": stages,
        "by_second": {name: by_second(produced, watchers[name].seen_at, start) for name in ("redis", "api")},
        "polls": poller.steps,
        "worker_assigned_s": round(assigned_s, 2),
        "cpu_pct": cpu,
    }


# --- the whole benchmark ----------------------------------------------------------------------


def _throughput(
    group: Children, servers: Servers, settings: Settings, *, hot_api: Child, hot_base: str, members: int
) -> tuple[dict[str, Result], Result]:
    """wrk: bare, hot (memory), redis (a second API node reading the same data from Redis)."""
    cold_settings = settings.model_copy(
        update={"boards": write_boards(FOLDER / "boards-cold.yaml", COLD_YAML)}
    )
    cold_api, cold_base = start_api(group, "api-cold", cold_settings)
    wait_ready(cold_api, f"{cold_base}/readyz")
    hot_url = f"{hot_base}/v1/boards/{BOARD}/top?limit=10"
    redis_url = f"{cold_base}/v1/boards/{BOARD}/top?limit=10&nocache=1"
    check_top(get_json(redis_url), "redis", members)
    _, body = http_get(hot_url)
    bare, bare_base = start_bare(group, body)
    pids = servers.pids()
    results = wrk_rounds(
        [
            Target("bare", f"{bare_base}/", {"bare": bare.pid, **pids}),
            Target("hot_top10", hot_url, {"api": hot_api.pid, **pids}),
            Target("redis_top10", redis_url, {"api": cold_api.pid, **pids}),
        ],
        env_int("ROUNDS", DEFAULT_ROUNDS),
        env_int("WRK_S", DEFAULT_WRK_S),
    )
    rss = {
        "api_hot": rss_bytes(hot_api.pid),
        "api_cold": rss_bytes(cold_api.pid),
        "bare": rss_bytes(bare.pid),
    }
    group.stop(bare)
    group.stop(cold_api)
    return results, {"top10_body_bytes": len(body), "rss": rss}


def run() -> Result:
    members = env_int("HOT_MEMBERS", DEFAULT_MEMBERS)
    knobs = {
        "ROUNDS": DEFAULT_ROUNDS,
        "WRK_S": DEFAULT_WRK_S,
        "VIS_RATE": DEFAULT_VIS_RATE,
        "VIS_S": DEFAULT_VIS_S,
    }
    for knob, default in knobs.items():
        env_int(knob, default)  # a bad knob fails now, not after the fill
    want_profile = os.environ.get(f"{ENV_PREFIX}PROFILE", "1").strip() != "0"
    head = header()
    started = time.monotonic()
    rng = random.Random(20261124)
    with private_servers(FOLDER) as servers, children(FOLDER / "procs") as group:
        boards_file = write_boards(FOLDER / "boards-hot.yaml", HOT_YAML)
        boards = load_boards(boards_file)
        settings = servers.settings(boards_file, "bh:", "hot")
        ensure_topics(settings)
        say(f"filling {BOARD} with {members:,} members through Applier")
        filled = fill(servers.client, boards, settings.key_prefix, board=BOARD,
                      members=[f"u{i:07d}" for i in range(members)], rng=rng)  # fmt: skip
        say(f"filled at {filled['members_per_s']:,.0f} members/s; backfilling update_cache")
        settings, backfilled = backfill(servers, settings, boards)
        say(f"backfilled {backfilled['records']:,} records in {backfilled['backfill_s']} s")
        hot_api, hot_base, replayed = replay(group, settings, members)
        profile = profile_replay(group, settings) if want_profile else None
        say("memory per member (fresh processes)")
        mem = memory(members, use_tracemalloc=False)
        traced = memory(members, use_tracemalloc=True)
        results, extra = _throughput(
            group, servers, settings, hot_api=hot_api, hot_base=hot_base, members=members
        )
        vis = visibility(group, servers, settings, hot_api, hot_base)
    phases = {"fill": filled, "backfill": backfilled, "replay": replayed, "replay_profile": profile,
              "memory_rss": mem, "memory_tracemalloc": traced, "visibility": vis}  # fmt: skip
    return {
        **_summary(members, phases, results, extra),
        **head,
        "duration_s": round(time.monotonic() - started, 1),
    }


def _summary(members: int, phases: dict[str, Any], results: dict[str, Result], extra: Result) -> Result:
    filled, backfilled, replayed = phases["fill"], phases["backfill"], phases["replay"]
    mem, traced, vis = phases["memory_rss"], phases["memory_tracemalloc"], phases["visibility"]
    bare, hot, cold = (results[k]["rps"] for k in ("bare", "hot_top10", "redis_top10"))
    cpu_us = {
        "bare": cpu_us_per_request(results["bare"], "bare"),
        "hot_top10": cpu_us_per_request(results["hot_top10"], "api"),
        "redis_top10": cpu_us_per_request(results["redis_top10"], "api"),
    }
    rss = extra["rss"]
    summary: Result = {
        "replay_records_per_s": replayed["replay_records_per_s"],
        "ready_s_1m": replayed["ready_s"],
        "bytes_per_member": mem["bytes_per_member"],
        "hot_vs_bare": ratio(hot, bare),
        "hot_vs_redis": ratio(hot, cold),
        "visibility_p99_ms": vis["p99_ms"],
    }
    return {
        **summary,
        "goals": GOALS,
        "goals_at_most": list(AT_MOST),
        "met": met(summary, GOALS, AT_MOST),
        "members": members,
        "fill_members_per_s": filled["members_per_s"],
        "backfill_s": backfilled["backfill_s"],
        "backfill_records_per_s": backfilled["records_per_s"],
        "backfill_worker_producer_error": backfilled.get("worker_producer_error"),
        "ready_after_s": replayed["ready_after_s"],
        "records_replayed": replayed["records_replayed"],
        "bytes_per_member_tracemalloc": traced["bytes_per_member"],
        "api_rss_bytes_per_member": (
            round((rss["api_hot"] - rss["api_cold"]) / members, 1)
            if rss["api_hot"] and rss["api_cold"]
            else None
        ),
        "bare_rps": bare,
        "hot_top10_rps": hot,
        "redis_top10_rps": cold,
        "hot_vs_bare_cpu": ratio(cpu_us["bare"], cpu_us["hot_top10"]),
        "hot_vs_redis_cpu": ratio(cpu_us["redis_top10"], cpu_us["hot_top10"]),
        "hot_top10_p50_ms": results["hot_top10"].get("p50_ms"),
        "hot_top10_p99_ms": results["hot_top10"].get("p99_ms"),
        "visibility_p50_ms": vis["p50_ms"],
        "visibility_max_ms": vis["max_ms"],
        "visibility_events": vis["events"],
        "visibility_observed": vis["observed"],
        "visibility_resolved": vis["resolved"],
        "notes": [
            f"{os.cpu_count()} cores shared by everything measured and the load generators; "
            "server_cpu_us_per_request and the *_cpu ratios are less sensitive to that and to noise",
            "bytes_per_member: a fresh process building the API's structure; api_rss_bytes_per_member: the "
            "real hot API node after replay minus a node without hot boards (replay leftovers, "
            "fragmentation, librdkafka buffers included)",
            "visibility: stages are when each event was readable in update_rank (consumer with 10 ms fetch "
            "waits), applied in Redis (seq polled every 2 ms), readable in update_cache, served by the API "
            f"(top 1 polled every 2 ms); producer linger {VIS_LINGER_MS} ms, counted",
        ],
        "details": {
            **phases,
            **results,
            "cpu_pct": {name: r["cpu_pct"] for name, r in results.items()},
            "server_cpu_us_per_request": cpu_us,
            "rss_mb": {k: None if v is None else round(v / 2**20, 1) for k, v in rss.items()},
            "top10_body_bytes": extra["top10_body_bytes"],
        },
    }


# --- helper processes -------------------------------------------------------------------------


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hot")
    sub = parser.add_subparsers(dest="command", required=True)
    mem = sub.add_parser("memory", help="build a hot window of N members; print its memory as JSON")
    mem.add_argument("members", type=int)
    mem.add_argument("--tracemalloc", action="store_true")
    prof = sub.add_parser("profile", help="replay hot boards under cProfile; print the profile as JSON")
    for name in ("bootstrap", "redis", "boards", "prefix", "topic"):
        prof.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    result = _memory_main(args.members, args.tracemalloc) if args.command == "memory" else _profile_main(args)
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
