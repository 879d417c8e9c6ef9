"""The worker benchmark: rankstream's write path against the seed design, in one run.

On one private Kafka and one private Redis, back to back (the box is shared and noisy, so the
ratios within a run are what counts, not the absolute numbers):

1. `events_per_s`: one real `rankstream worker` process drains N pre-produced single-event
   messages; progress is the sum of the boards' `seq` keys in Redis. `events_per_s_arrays`:
   the same with JSON arrays of 100 events per message.
2. `seed_ceiling_events_per_s`: the seed design (one Lua call per event: msgId dedupe, then
   ZINCRBY per window) driven by redis-benchmark with 50 clients: Redis' own ceiling for
   "one script call per event", with no Python and no Kafka at all.
3. `naive_events_per_s`: the seed design as a plain Python consumer would run it: one message
   per poll, one script call per event, one synchronous commit per message.

Knobs: RANKSTREAM_BENCH_EVENTS (N, default 300000), RANKSTREAM_BENCH_NAIVE_EVENTS (20000).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson
import redis
from confluent_kafka import Consumer, KafkaException, Producer

from bench.common import (
    REPO,
    BenchError,
    CpuMeter,
    Result,
    Row,
    child_env,
    env_int,
    git_commit,
    machine,
    say,
    timestamp,
)
from common.settings import Settings, load_settings
from rankstream.stack import LocalKafka, LocalRedis, free_port
from rankstream.topics import UPDATE_PARTITIONS, ensure_topics

FOLDER = REPO / ".stack" / "bench"
SEED_SCRIPT = Path(__file__).resolve().parent / "lua" / "seed_update.lua"

DEFAULT_EVENTS = 300_000
DEFAULT_NAIVE_EVENTS = 20_000
BOARDS = 200
MEMBERS = 20_000
# Classic Zipf (s=1): a few big spenders and a long tail, as in a live room.
ZIPF_S = 1.0
WINDOWS = ("total", "day", "week")
ARRAY_SIZE = 100
SEED_REQUESTS = 300_000
SEED_CLIENTS = 50
DEDUPE_TTL_S = 7 * 24 * 3600  # the seed design's msgId dedupe record (the naive and ceiling runs)
SEED_ROOM = "s:{gift:room1}"

# librdkafka's informational lines (e.g. a purged background event when an admin client is
# dropped) would interleave with the tables; warnings and errors still show
QUIET_KAFKA = {"log_level": "4"}
POLL_S = 0.05
STALL_S = 60.0  # no progress for this long = the run failed, not a slow run
WORKER_STOP_S = 30.0

GOALS: dict[str, float] = {"events_per_s": 100_000, "vs_seed_ceiling": 1.5, "vs_naive": 5}
MEMORY_GOALS: dict[str, float] = {"redis_bytes_per_event_id": 32}  # ceilings (bench/memory.py)
# ceilings, ours / the seeds' bare design in the same run (bench/redis_cost.py)
COST_GOALS: dict[str, float] = {"redis_vs_bare": 2.0, "redis_vs_bare_repeating": 2.0, "bytes_vs_bare": 1.6}
_DIAGNOSTICS = (
    "single.events_per_s_from_assign",
    "arrays.events_per_s_from_assign",
    "single.cpu_pct.worker",
    "single.cpu_pct.redis",
    "single.cpu_pct.kafka",
    "single.cpu_pct.bench",
    "single.cpu_pct.others",
    "single.cpu_us_per_event.worker",
    "single.cpu_us_per_event.redis",
    "single.worker_metrics.apply_share",
    "single.worker_metrics.mean_batch_messages",
    "arrays.cpu_pct.worker",
    "arrays.cpu_pct.redis",
    "arrays.cpu_pct.others",
    "arrays.cpu_us_per_event.worker",
    "arrays.cpu_us_per_event.redis",
    "arrays.worker_metrics.apply_share",
    "arrays.worker_metrics.mean_batch_messages",
    "seed_ceiling.cpu_pct.redis",
    "seed_ceiling.cpu_pct.redis_benchmark",
    "seed_ceiling.cpu_pct.others",
    "seed_ceiling.cpu_us_per_event.redis",
    "naive.per_event_ms.poll",
    "naive.per_event_ms.apply",
    "naive.per_event_ms.commit",
    "naive.cpu_pct.bench",
    "naive.cpu_pct.kafka",
    "naive.cpu_pct.others",
)
ROWS = [
    Row("events_per_s", "events_per_s"),
    Row("events_per_s_arrays", "events_per_s"),
    Row("seed_ceiling_events_per_s"),
    Row("naive_events_per_s"),
    Row("vs_seed_ceiling", "vs_seed_ceiling"),
    Row("vs_seed_ceiling_arrays", "vs_seed_ceiling"),
    Row("vs_naive", "vs_naive"),
    Row("vs_naive_arrays", "vs_naive"),
    Row("applied"),
    Row("applied_arrays"),
    Row("time_to_first_event_s"),
    Row("time_to_first_event_s_arrays"),
    Row("redis_bytes_per_event_id", "redis_bytes_per_event_id", at_most=True),
    Row("redis_bytes_per_fence"),
    Row("redis_us_per_event"),
    Row("seed_bare_redis_us_per_event"),
    Row("redis_vs_bare", "redis_vs_bare", at_most=True),
    Row("redis_vs_bare_repeating", "redis_vs_bare_repeating", at_most=True),
    Row("redis_bytes_per_member_window"),
    Row("bare_zset_bytes_per_member"),
    Row("bytes_vs_bare", "bytes_vs_bare", at_most=True),
    Row("worker_us_per_event"),
    Row("kafka_us_per_event"),
    *(Row(f"details.{path}") for path in _DIAGNOSTICS),
]


# --- the servers ------------------------------------------------------------------------------


@dataclass
class Stack:
    kafka_server: LocalKafka
    redis_server: LocalRedis
    boards_file: Path
    client: redis.Redis

    def settings(self, tag: str) -> Settings:
        """Settings with topics of their own, so runs never read each other's events."""
        return load_settings(
            {},
            kafka_bootstrap=self.kafka_server.bootstrap,
            redis_url=self.redis_server.url,
            boards=self.boards_file,
            topic_updates=f"bench.{tag}.update_rank",
            topic_dlq=f"bench.{tag}.update_rank.dlq",
            topic_cache=f"bench.{tag}.update_cache",
            kafka=QUIET_KAFKA,
        )

    def pids(self) -> dict[str, int]:
        assert self.kafka_server.proc is not None
        assert self.redis_server.proc is not None
        return {"redis": self.redis_server.proc.pid, "kafka": self.kafka_server.proc.pid}


def _stop_quietly(server: LocalKafka | LocalRedis) -> None:
    try:
        server.stop()
    except Exception as exc:  # noqa: BLE001 - stop the other server too; report, do not mask the run's error
        say(f"stopping {server.name} failed: {exc}")


@contextlib.contextmanager
def private_stack(folder: Path) -> Iterator[Stack]:
    """A fresh Kafka and Redis on free ports in `folder`; both stopped however the run ends."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    boards_file = folder / "boards.yaml"
    boards_file.write_text(
        f"timezone: UTC\ntypes:\n  gift: {{windows: [{', '.join(WINDOWS)}]}}\n", encoding="utf-8"
    )
    # AOF on, as `rankstream dev` runs it: what users pay for is measured with persistence
    redis_server = LocalRedis("redis", folder / "redis", port=free_port(), persist=True)
    kafka = LocalKafka("kafka", folder / "kafka", port=free_port(), controller_port=free_port())
    try:
        redis_server.start()
        say(f"redis on port {redis_server.port}; starting kafka on {kafka.bootstrap}")
        kafka.start()
        client = redis.Redis(port=redis_server.port, socket_timeout=30)
        try:
            yield Stack(kafka, redis_server, boards_file, client)
        finally:
            client.close()
    finally:
        _stop_quietly(kafka)
        _stop_quietly(redis_server)


# --- events -----------------------------------------------------------------------------------


def make_events(n: int, id_prefix: str, rng: random.Random) -> list[dict[str, Any]]:
    """n update events over BOARDS boards (uniform) and MEMBERS members (Zipf)."""
    cum_weights = list(itertools.accumulate(1 / (rank + 1) ** ZIPF_S for rank in range(MEMBERS)))
    members = rng.choices(range(MEMBERS), cum_weights=cum_weights, k=n)
    now_ms = int(time.time() * 1000)
    return [
        {
            "id": f"{id_prefix}-{i}",
            "board": f"gift:room{rng.randrange(BOARDS)}",
            "member": f"u{member}",
            "score": rng.randint(1, 100),
            "ts": now_ms - rng.randrange(5000),
        }
        for i, member in enumerate(members)
    ]


Message = tuple[bytes, bytes]  # (key, value)


def single_messages(events: Sequence[Mapping[str, Any]]) -> list[Message]:
    return [(str(e["board"]).encode(), orjson.dumps(e)) for e in events]


def array_messages(events: Sequence[Mapping[str, Any]], size: int) -> list[Message]:
    """Arrays of up to `size` events of one board, keyed by it (as a batching producer would)."""
    by_board: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        by_board.setdefault(str(event["board"]), []).append(event)
    out: list[Message] = []
    for board, group in by_board.items():
        out += [(board.encode(), orjson.dumps(group[i : i + size])) for i in range(0, len(group), size)]
    # interleave boards, as many producers writing at once would
    random.Random(7).shuffle(out)
    return out


def produce(bootstrap: str, topic: str, messages: Sequence[Message]) -> float:
    """Write every message and wait for all acks; returns messages/s."""
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "none",
            **QUIET_KAFKA,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "on_delivery": on_delivery,
        }
    )
    started = time.monotonic()
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:  # local queue full: let librdkafka send some first
                producer.poll(0.1)
    left = producer.flush(120)
    if left or failures:
        raise BenchError(f"producing to {topic}: {left} unsent, {len(failures)} failed {failures[:1]}")
    return len(messages) / (time.monotonic() - started)


# --- 1. rankstream end to end -----------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Seconds are counted from the worker's spawn."""

    assigned_s: float | None  # its partitions were assigned: from here on it only works
    first_s: float  # the first applied event showed up in Redis: the clock starts
    start_count: int  # applied when the clock started
    done_s: float  # N applied: the clock stops
    cpu_pct: dict[str, float]

    @property
    def elapsed_s(self) -> float:
        return self.done_s - self.first_s

    @property
    def drain_s(self) -> float | None:
        return None if self.assigned_s is None else self.done_s - self.assigned_s


def applied_count(client: redis.Redis, seq_keys: Sequence[str]) -> int:
    values = cast("list[bytes | None]", client.mget(seq_keys))
    return sum(int(v) for v in values if v is not None)


@dataclass(frozen=True)
class WorkerRun:
    """One worker process and what it is measured on."""

    n: int
    prefix: str  # Redis key prefix: a fresh one per run, so no dedupe record is shared
    group: str
    http_port: int
    log: Path

    @property
    def seq_keys(self) -> list[str]:
        return [f"{self.prefix}{{gift:room{k}}}:seq" for k in range(BOARDS)]


def start_worker(stack: Stack, settings: Settings, run: WorkerRun) -> subprocess.Popen[bytes]:
    env = child_env(
        {
            "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "RANKSTREAM_REDIS_URL": stack.redis_server.url,
            "RANKSTREAM_BOARDS": str(stack.boards_file),
            "RANKSTREAM_TOPIC_UPDATES": settings.topic_updates,
            "RANKSTREAM_TOPIC_DLQ": settings.topic_dlq,
            "RANKSTREAM_TOPIC_CACHE": settings.topic_cache,
            "RANKSTREAM_WORKER_GROUP": run.group,
            "RANKSTREAM_KEY_PREFIX": run.prefix,
            "RANKSTREAM_WORKER_HTTP_PORT": str(run.http_port),
            "RANKSTREAM_LOG_LEVEL": "WARNING",
        }
    )
    with run.log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rankstream.cli", "worker"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches us only: the finally stops it in order
        )  # fmt: skip


def stop_worker(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM (the worker commits and exits), SIGKILL after WORKER_STOP_S; seconds it took."""
    started = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WORKER_STOP_S)
        except subprocess.TimeoutExpired:
            say(f"worker {proc.pid} ignored SIGTERM for {WORKER_STOP_S:.0f}s: killing it")
            proc.kill()
            proc.wait()
    return time.monotonic() - started


def _log_tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:]) or "(empty log)"


def partitions_assigned(port: int) -> bool:
    """Whether the worker's /readyz reports all of the topic's partitions assigned to it."""
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:  # 503 = not ready yet, the body still tells why
        body = exc.read()
    except OSError:  # not listening yet
        return False
    return int(orjson.loads(body).get("partitions", 0)) >= UPDATE_PARTITIONS


def watch(client: redis.Redis, run: WorkerRun, proc: subprocess.Popen[bytes], meter: CpuMeter) -> Progress:
    """Poll the applied count every POLL_S. The clock starts at the first poll that sees an
    applied event (start-up and the group join are not throughput) and stops at N. Until
    then /readyz is polled too, to know when the worker got its partitions."""
    seq_keys, n = run.seq_keys, run.n
    spawned = time.monotonic()
    assigned: float | None = None
    first: tuple[float, int] | None = None
    last_count, last_change = 0, spawned
    next_tick = spawned
    while True:
        count, now = applied_count(client, seq_keys), time.monotonic()
        if assigned is None and first is None and partitions_assigned(run.http_port):
            assigned = now
        if first is None and count > 0:
            first = (now, count)
            meter.start()
        if count >= n:
            cpu = meter.stop()
            break
        if count != last_count:
            last_count, last_change = count, now
        elif now - last_change > STALL_S:
            raise BenchError(f"no progress for {STALL_S:.0f}s at {count}/{n}; log: {_log_tail(run.log)}")
        if proc.poll() is not None:
            raise BenchError(f"the worker exited with {proc.returncode} at {count}/{n}: {_log_tail(run.log)}")
        next_tick += POLL_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
    assert first is not None
    if count == first[1]:
        raise BenchError(f"all {n} events were applied before the first poll: too few to measure")
    since = None if assigned is None else assigned - spawned
    return Progress(since, first[0] - spawned, first[1], now - spawned, cpu)


def cpu_us_per_event(cpu_pct: Mapping[str, float], events_per_s: float) -> dict[str, float]:
    """CPU time per event of each process: less sensitive to a noisy box than the rates are."""
    return {
        name: round(pct / 100 / events_per_s * 1e6, 1)
        for name, pct in cpu_pct.items()
        if name not in {"machine", "others"}
    }


def scrape_metrics(port: int) -> dict[str, float]:
    """The worker's own account of where its time went (from its /metrics)."""
    wanted = {
        "rankstream_worker_apply_seconds_sum": "apply_seconds",
        "rankstream_worker_apply_seconds_count": "batches",
        "rankstream_worker_batch_messages_sum": "messages",
        'rankstream_worker_events_total{outcome="applied"}': "applied_events",
        'rankstream_worker_events_total{outcome="duplicate"}': "duplicate_events",
        "rankstream_worker_batch_retries_total": "retries",
    }
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError as exc:
        say(f"worker metrics unavailable: {exc}")
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            out[wanted[name]] = float(value)
    return out


def _messages(variant: str, n: int, tag: str, rng: random.Random) -> list[Message]:
    events = make_events(n, tag, rng)
    return single_messages(events) if variant == "single" else array_messages(events, ARRAY_SIZE)


def measure_worker(stack: Stack, n: int, variant: str, rng: random.Random) -> Result:
    """One worker process over N fresh events in a fresh topic, group and key prefix."""
    stack.client.flushall()  # every measurement starts from the same empty Redis
    tag = f"{variant}-{uuid.uuid4().hex[:8]}"
    settings = stack.settings(tag)
    ensure_topics(settings)
    messages = _messages(variant, n, tag, rng)
    say(f"{variant}: producing {n} events in {len(messages)} messages")
    produce_rate = produce(settings.kafka_bootstrap, settings.topic_updates, messages)
    prefix = "b:" if variant == "single" else f"b{variant[0]}:"
    run = WorkerRun(n, prefix, f"bench-{tag}", free_port(), FOLDER / f"worker-{variant}.log")
    proc = start_worker(stack, settings, run)
    say(f"{variant}: worker pid {proc.pid} draining")
    try:
        meter = CpuMeter({"worker": proc.pid, **stack.pids(), "bench": os.getpid()})
        progress = watch(stack.client, run, proc, meter)
        time.sleep(0.5)  # anything applied twice would show up now
        final = applied_count(stack.client, run.seq_keys)
        metrics = scrape_metrics(run.http_port)
    finally:
        stop_s = stop_worker(proc)
    report = _worker_report(n, progress, final, metrics)
    report.update(
        messages=len(messages),
        produce_messages_per_s=round(produce_rate, 1),
        worker_exit_code=proc.returncode,
        worker_stop_s=round(stop_s, 2),
    )
    return report


def _worker_report(n: int, progress: Progress, final: int, metrics: Mapping[str, float]) -> Result:
    measured = n - progress.start_count
    rate = measured / progress.elapsed_s
    worker_metrics: dict[str, float] = dict(metrics)
    if metrics.get("batches"):
        worker_metrics["mean_batch_messages"] = round(metrics.get("messages", 0) / metrics["batches"], 1)
    drain = progress.drain_s
    if "apply_seconds" in metrics and drain:
        # the share of the worker's working time spent inside Applier.apply (building the
        # calls, the Redis round trip, Lua); the rest is consuming, parsing and committing
        worker_metrics["apply_share"] = round(metrics["apply_seconds"] / drain, 3)
    return {
        "events_per_s": round(rate, 1),
        # N / (N applied - partitions assigned): counts the first batch's fetch and parse,
        # which the clock above cannot see (it starts when Redis shows the first event)
        "events_per_s_from_assign": round(n / drain, 1) if drain else None,
        "applied": final,
        "applied_exact": final == n,
        "time_to_assign_s": None if progress.assigned_s is None else round(progress.assigned_s, 2),
        "time_to_first_event_s": round(progress.first_s, 2),
        "measured_events": measured,
        "measured_s": round(progress.elapsed_s, 3),
        "cpu_pct": progress.cpu_pct,
        "cpu_us_per_event": cpu_us_per_event(progress.cpu_pct, rate),
        "worker_metrics": worker_metrics,
    }


# --- 2. the seed design at Redis' own ceiling -------------------------------------------------


def redis_benchmark() -> str:
    found = shutil.which("redis-benchmark")
    if found is None:
        raise BenchError("redis-benchmark not found: apt-get install -y redis-tools")
    return found


def seed_benchmark_argv(port: int, sha: str, requests: int, clients: int) -> list[str]:
    """redis-benchmark replaces EVERY `__rand_int__` with its own random 12-digit number in
    [0, -r). With -r MEMBERS the member matches the rankstream run's member count; the event id
    takes two of them side by side, so ids stay unique (MEMBERS^2 = 4e8 values) while members
    repeat. One fixed board: a single Redis does not care which slot a key hashes to."""
    keys = [f"{SEED_ROOM}:id:__rand_int____rand_int__", *(f"{SEED_ROOM}:{w}" for w in WINDOWS)]
    argv = [redis_benchmark(), "-h", "127.0.0.1", "-p", str(port), "-n", str(requests)]
    argv += ["-c", str(clients), "-r", str(MEMBERS), "--csv"]
    return [*argv, "EVALSHA", sha, str(len(keys)), *keys, "u__rand_int__", "1", str(DEDUPE_TTL_S)]


def parse_rps(csv_text: str) -> float:
    """requests/s from redis-benchmark --csv: a header row naming "rps", then one row per test."""
    rows = [r for r in csv.reader(csv_text.splitlines()) if r]
    if len(rows) < 2 or "rps" not in rows[0]:
        raise BenchError(f"unexpected redis-benchmark output: {csv_text.strip()[:200]!r}")
    column = rows[0].index("rps")
    return float(rows[-1][column])


def _seed_sanity(client: redis.Redis, requests: int) -> dict[str, int]:
    """redis-benchmark counts error replies as requests: prove the script really ran."""
    ids = client.dbsize() - len(WINDOWS)
    pairs = cast("list[tuple[bytes, float]]", client.zrange(f"{SEED_ROOM}:total", 0, -1, withscores=True))
    increments = int(sum(score for _, score in pairs))
    if ids < 0.99 * requests or increments != ids:
        raise BenchError(
            f"seed ceiling run is not trustworthy: {requests} calls, {ids} ids, {increments} incr"
        )
    return {"new_ids": ids, "members": len(pairs)}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_seed_ceiling(stack: Stack, requests: int = SEED_REQUESTS, clients: int = SEED_CLIENTS) -> Result:
    stack.client.flushall()
    sha = stack.client.script_load(SEED_SCRIPT.read_text(encoding="utf-8"))
    argv = seed_benchmark_argv(stack.redis_server.port, sha, requests, clients)
    say(f"seed ceiling: redis-benchmark -n {requests} -c {clients}")
    started = time.monotonic()
    meter = CpuMeter(stack.pids())
    children0 = _children_cpu_s()
    meter.start()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cpu = meter.stop()
    # redis-benchmark has exited (and was reaped) by now: its CPU is in our children's rusage
    cpu["redis_benchmark"] = round(100 * (_children_cpu_s() - children0) / (time.monotonic() - started), 1)
    if "others" in cpu:  # the meter could not see redis-benchmark, so it counted it as "others"
        cpu["others"] = round(max(0.0, cpu["others"] - cpu["redis_benchmark"]), 1)
    if proc.returncode != 0:
        raise BenchError(f"redis-benchmark exited with {proc.returncode}: {err.strip()[-200:]}")
    rps = parse_rps(out)
    return {
        "events_per_s": round(rps, 1),
        "requests": requests,
        "clients": clients,
        "wall_s": round(time.monotonic() - started, 2),
        "cpu_pct": cpu,
        "cpu_us_per_event": cpu_us_per_event(cpu, rps),
        **_seed_sanity(stack.client, requests),
        "command": " ".join(argv[1:]),
    }


# --- 3. the seed design as a naive Python consumer ---------------------------------------------


def _apply_naive(client: redis.Redis, sha: str, value: bytes) -> int:
    event = orjson.loads(value)
    tag = f"s:{{{event['board']}}}"
    keys = [f"{tag}:id:{event['id']}", *(f"{tag}:{w}" for w in WINDOWS)]
    args = [event["member"], event["score"], DEDUPE_TTL_S]
    return cast("int", client.evalsha(sha, len(keys), *keys, *args))


@dataclass
class NaiveStats:
    """Where the naive consumer's wall time goes, summed over the measured messages."""

    elapsed_s: float = 0.0
    applied: int = 0
    poll_s: float = 0.0
    apply_s: float = 0.0
    commit_s: float = 0.0

    def per_event_ms(self, n: int) -> dict[str, float]:
        return {
            "poll": round(1000 * self.poll_s / n, 3),
            "apply": round(1000 * self.apply_s / n, 3),
            "commit": round(1000 * self.commit_s / n, 3),
        }


def naive_consume(consumer: Consumer, client: redis.Redis, sha: str, n: int) -> NaiveStats:
    """Poll one message, apply it, commit it synchronously, repeat. The clock runs from the
    first message to the last commit (the group join is not throughput)."""
    stats = NaiveStats()
    started: float | None = None
    seen = 0
    idle_since = time.monotonic()
    while seen < n:
        t0 = time.perf_counter()
        msg = consumer.poll(1.0)
        t1 = time.perf_counter()
        if msg is None:
            if time.monotonic() - idle_since > STALL_S:
                raise BenchError(f"naive consumer: no message for {STALL_S:.0f}s at {seen}/{n}")
            continue
        if msg.error() is not None:
            continue  # e.g. partition EOF: not an event
        if started is None:
            started = time.monotonic()
        else:
            stats.poll_s += t1 - t0
        stats.applied += _apply_naive(client, sha, msg.value() or b"")
        t2 = time.perf_counter()
        consumer.commit(message=msg, asynchronous=False)
        t3 = time.perf_counter()
        stats.apply_s += t2 - t1
        stats.commit_s += t3 - t2
        seen += 1
        idle_since = time.monotonic()
    assert started is not None
    stats.elapsed_s = time.monotonic() - started
    return stats


def measure_naive(stack: Stack, n: int, rng: random.Random) -> Result:
    stack.client.flushall()
    tag = f"naive-{uuid.uuid4().hex[:8]}"
    settings = stack.settings(tag)
    ensure_topics(settings)
    produce(settings.kafka_bootstrap, settings.topic_updates, single_messages(make_events(n, tag, rng)))
    sha = stack.client.script_load(SEED_SCRIPT.read_text(encoding="utf-8"))
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"bench-{tag}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **QUIET_KAFKA,
        }
    )
    say(f"naive: consuming {n} events one by one")
    meter = CpuMeter({"bench": os.getpid(), **stack.pids()})
    try:
        consumer.subscribe([settings.topic_updates])
        meter.start()  # includes the group join, which the clock below does not
        stats = naive_consume(consumer, stack.client, sha, n)
        cpu = meter.stop()
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()
    if stats.applied != n:
        raise BenchError(f"naive consumer applied {stats.applied} of {n} events")
    return {
        "events_per_s": round(n / stats.elapsed_s, 1),
        "events": n,
        "elapsed_s": round(stats.elapsed_s, 2),
        "per_event_ms": stats.per_event_ms(n),
        "cpu_pct": cpu,
    }


# --- the whole benchmark ----------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator > 0 else float("nan")


def _met(values: Mapping[str, float]) -> dict[str, bool]:
    return {name: values[name] >= goal for name, goal in GOALS.items()}


def summarize(single: Result, arrays: Result, ceiling: Result, naive: Result) -> Result:
    ceiling_rate, naive_rate = ceiling["events_per_s"], naive["events_per_s"]
    base = {
        "events_per_s": single["events_per_s"],
        "vs_seed_ceiling": _ratio(single["events_per_s"], ceiling_rate),
        "vs_naive": _ratio(single["events_per_s"], naive_rate),
    }
    with_arrays = {
        "events_per_s": arrays["events_per_s"],
        "vs_seed_ceiling": _ratio(arrays["events_per_s"], ceiling_rate),
        "vs_naive": _ratio(arrays["events_per_s"], naive_rate),
    }
    return {
        **base,
        "events_per_s_arrays": with_arrays["events_per_s"],
        "seed_ceiling_events_per_s": ceiling_rate,
        "naive_events_per_s": naive_rate,
        "vs_seed_ceiling_arrays": with_arrays["vs_seed_ceiling"],
        "vs_naive_arrays": with_arrays["vs_naive"],
        "applied": single["applied"],
        "applied_arrays": arrays["applied"],
        "time_to_first_event_s": single["time_to_first_event_s"],
        "time_to_first_event_s_arrays": arrays["time_to_first_event_s"],
        "goals": GOALS,
        "met": _met(base),
        "met_arrays": _met(with_arrays),
    }


def run() -> Result:
    n = env_int("EVENTS", DEFAULT_EVENTS)
    naive_n = env_int("NAIVE_EVENTS", DEFAULT_NAIVE_EVENTS)
    commit, dirty = git_commit()
    header: Result = {
        "machine": machine(),
        "git_commit": commit,
        "git_dirty": dirty,
        "timestamp": timestamp(),
    }
    rng = random.Random(20261122)  # the same events every run: only the code under test changes
    started = time.monotonic()
    from bench.memory import fence_bytes, measure_id_memory  # noqa: PLC0415 - it builds on this module
    from bench.redis_cost import measure_redis_cost  # noqa: PLC0415 - it builds on bench.memory

    with private_stack(FOLDER) as stack:
        single = measure_worker(stack, n, "single", rng)
        fences = fence_bytes(stack.client, "b:")  # what the single run's boards hold
        arrays = measure_worker(stack, n, "arrays", rng)
        ids = measure_id_memory(stack, rng)
        ceiling = measure_seed_ceiling(stack)
        cost = measure_redis_cost(stack.client, rng)
        naive = measure_naive(stack, naive_n, rng)
    for name, report in (("single", single), ("arrays", arrays)):
        if not report["applied_exact"]:
            say(f"WARNING: {name}: {report['applied']} events applied, expected exactly {n}")
    summary = summarize(single, arrays, ceiling, naive)
    summary["goals"] = {**summary["goals"], **MEMORY_GOALS, **COST_GOALS}
    summary["met_memory"] = {k: ids["bytes_per_event_id"] <= v for k, v in MEMORY_GOALS.items()}
    summary["met_cost"] = {k: cost[k] <= v for k, v in COST_GOALS.items()}
    return {
        **summary,
        **{k: v for k, v in cost.items() if k not in ("members", "windows", "chunk")},
        "worker_us_per_event": arrays["cpu_us_per_event"].get("worker"),
        "kafka_us_per_event": arrays["cpu_us_per_event"].get("kafka"),
        "redis_bytes_per_event_id": ids["bytes_per_event_id"],
        "redis_bytes_per_fence": fences["bytes_per_fence"],
        "n_events": n,
        "naive_n_events": naive_n,
        "boards": BOARDS,
        "members": MEMBERS,
        "windows": list(WINDOWS),
        "array_size": ARRAY_SIZE,
        "details": {
            "single": single,
            "arrays": arrays,
            "seed_ceiling": ceiling,
            "naive": naive,
            "id_window": ids,
            "fences": fences,
            "redis_cost": cost,
        },
        **header,
        "duration_s": round(time.monotonic() - started, 1),
    }
