"""The scenarios: each starts its own Kafka, Redis, workers and API nodes, produces the seeded
stream while it injects its faults, waits for the workers to commit everything, and ends in the
checker's exact comparison. `Outcome` is one row of the Guarantees table."""

from __future__ import annotations

import json
import random
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from chaos.check import Verdict, compare
from chaos.config import ALL_BOARDS, HOT, SOAK_BOARDS, boards_yaml, kind
from chaos.fuzz import fuzz, judge, locked_env
from chaos.model import Model
from chaos.proxy import Proxy
from chaos.servers import ApiNode, Process, Servers, wait_for
from chaos.stream import Planned, Stream
from chaos.traffic import Pacer, Reads
from rankstream.capacity import Figures
from rankstream.topics import UPDATE_PARTITIONS


@dataclass(frozen=True)
class Profile:
    """How big a run is: `short` is the test suite's, `full` is `make chaos`'s."""

    name: str
    events: int
    messages_per_s: float
    soak_s: float  # the soak's length (`python -m chaos --soak-minutes`)


PROFILES = {"short": Profile("short", 4_000, 120.0, 60.0), "full": Profile("full", 40_000, 250.0, 1800.0)}


@dataclass
class Outcome:
    scenario: str
    profile: str
    seed: int
    faults: list[str] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(
        default_factory=list
    )  # what the scenario itself asserts, beyond the comparison

    @property
    def passed(self) -> bool:
        """Exact, or within the documented degradation of its scenario (TOLERATED)."""
        v = self.verdict
        if self.failures:
            return False
        if self.scenario in TOLERATED:  # losses (and the ranks they move) are the documented cost
            return v.doubled == 0 and all(p.startswith(LOSS_SHAPED) for p in v.problems)
        return v.exact

    def row(self) -> dict[str, Any]:
        v = self.verdict
        return {"scenario": self.scenario, "profile": self.profile, "seed": self.seed, "events": v.events,
                "applied": v.applied, "dead_letters": v.dead_letters, "results": v.results,
                "answers_compared": v.answers, "faults": len(self.faults), "fault_kinds": sorted(set(self.faults)),
                "lost": v.lost, "doubled": v.doubled, "wrong": v.wrong, "exact": v.exact, "passed": self.passed,
                "tolerated": TOLERATED.get(self.scenario, ""),
                "recover_max_s": round(max(self.recover_s, default=0.0), 1),
                "recover_median_s": round(sorted(self.recover_s)[len(self.recover_s) // 2], 1) if self.recover_s else 0.0,
                "seconds": round(self.seconds), "problems": [*self.failures, *v.problems], "notes": self.notes}  # fmt: skip


class Run:
    """One scenario's servers, processes and producer."""

    def __init__(self, folder: Path, profile: Profile, seed: int, *, proxied: bool = False, cluster: bool = False,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.start_ms = int(time.time() * 1000)
        self.servers = Servers.start(folder, boards_yaml(self.start_ms), cluster=cluster)
        self.servers.extra_env = env or {}
        self.proxy = Proxy(self.servers.redis_server.port) if proxied else None
        if self.proxy is not None:
            self.servers.service_redis_port = self.proxy.port
        self.settings = self.servers.settings()
        self.profile, self.seed = profile, seed
        self.workers: dict[str, Process] = {}
        self.nodes: dict[str, ApiNode] = {}
        self.rng = random.Random(seed)
        self.pacer: Pacer | None = None
        self.model: Model | None = None  # the model the run ended compared with
        self._serial = 0

    def add_worker(self) -> str:
        self._serial += 1
        name = f"worker-{self._serial}"
        self.workers[name] = self.servers.worker(name)
        return name

    def add_node(self, name: str) -> ApiNode:
        self.nodes[name] = self.servers.api_node(name)
        return self.nodes[name]

    def produce(self, events: int = 0, rate: float = 0.0, boards: list[str] | None = None) -> Pacer:
        """The seeded stream: the profile's events at its rate unless told otherwise."""
        plan = Stream(self.seed, self.start_ms, boards).messages(events or self.profile.events)
        return self.pace(plan, rate or self.profile.messages_per_s)

    def pace(self, plan: Iterator[Planned], rate: float) -> Pacer:
        """`plan` produced at `rate` messages a second, in a thread."""
        self.pacer = Pacer(self.servers.kafka.bootstrap, self.settings.topic_updates, plan, rate)
        self.pacer.start()
        return self.pacer

    @property
    def producing(self) -> bool:
        return self.pacer is not None and self.pacer.is_alive()

    # --- progress -------------------------------------------------------------------------
    def _offsets(self) -> tuple[dict[int, int], dict[int, int]] | None:
        """(end offsets, committed offsets) of update_rank; None while Kafka does not answer."""
        topic = self.settings.topic_updates
        # a consumer of its own each time: one kept across a broker restart was seen answering
        # nothing for minutes after the broker was back
        consumer = Consumer({"bootstrap.servers": self.servers.kafka.bootstrap, "group.id": self.settings.worker_group,
                             "enable.auto.commit": False, "socket.timeout.ms": 5000})  # fmt: skip
        parts = [TopicPartition(topic, p) for p in range(UPDATE_PARTITIONS)]
        try:
            ends = {p.partition: consumer.get_watermark_offsets(p, timeout=5)[1] for p in parts}
            committed = {p.partition: max(p.offset, 0) for p in consumer.committed(parts, timeout=5)}
        except KafkaException:
            return None
        finally:
            consumer.close()
        return ends, committed

    def committed_sum(self) -> int:
        """Offsets committed on update_rank, all partitions (-1 while Kafka does not answer)."""
        found = self._offsets()
        return -1 if found is None else sum(found[1].values())

    def marks(self) -> dict[int, int]:
        """update_rank's end offsets now."""
        while (found := self._offsets()) is None:
            time.sleep(0.5)
        return found[0]

    def committed_past(self, marks: dict[int, int]) -> bool:
        found = self._offsets()
        return found is not None and all(found[1][p] >= end for p, end in marks.items())

    def recover(self, outcome: Outcome, since: float, timeout: float = 300) -> None:
        """Wait until everything produced up to a second after the fault began (or until it
        ended, if later) is applied and committed; record how long that took from `since`, the
        fault's start."""
        time.sleep(max(0.0, since + 1.0 - time.monotonic()))
        marks = self.marks()
        wait_for(lambda: self.committed_past(marks), timeout, "the workers catching up after a fault")
        outcome.recover_s.append(time.monotonic() - since)

    def finish(self, outcome: Outcome) -> None:
        """The stream produced and committed whole, every node ready, then the comparison (once:
        a scenario that needs the model after it calls this itself)."""
        if self.model is not None:
            return
        assert self.pacer is not None
        self.pacer.finish()
        marks = self.marks()
        wait_for(lambda: self.committed_past(marks), 600, "the workers committing the whole stream")
        for name, node in self.nodes.items():
            wait_for(node.ready, 300, f"{name} ready")
        outcome.verdict, self.model = compare(self.servers, self.nodes, self.start_ms)

    def close(self) -> None:
        if self.pacer is not None:
            self.pacer.stopping.set()
        for proc in [*self.workers.values(), *self.nodes.values()]:
            proc.kill()
        if self.proxy is not None:
            self.proxy.close()
        self.servers.stop()


def _between(run: Run, seconds: float) -> None:
    """Let the stream flow for `seconds` (or until it ends)."""
    end = time.monotonic() + seconds
    while run.producing and time.monotonic() < end:
        time.sleep(0.2)


def _spacing(run: Run, faults: int) -> float:
    return run.profile.events / run.profile.messages_per_s / (faults + 1)


# --- the scenarios ----------------------------------------------------------------------------


def _repeated(run: Run, outcome: Outcome, times: int, label: str, fault: Callable[[], None]) -> None:
    """Two workers and the stream; `fault` injected `times` times, evenly spaced, each followed
    by the wait for recovery (timed from the fault's start)."""
    run.add_worker()
    run.add_worker()
    run.produce()
    for _ in range(times):
        _between(run, _spacing(run, times))
        began = time.monotonic()
        fault()
        outcome.faults.append(label)
        run.recover(outcome, began)


def worker_kill(run: Run, outcome: Outcome, kills: int) -> None:
    """Two workers; one of them killed with -9 and started again (same id, as a pod's container
    restarts) `kills` times while the stream flows."""

    def kill() -> None:
        worker = run.workers[run.rng.choice(sorted(run.workers))]
        worker.kill()
        worker.start()

    _repeated(run, outcome, kills, "worker kill -9", kill)


def worker_churn(run: Run, outcome: Outcome, steps: int) -> None:
    """Three workers; every few seconds one joins, then one leaves (SIGTERM or kill -9 in turn)."""
    for _ in range(3):
        run.add_worker()
    run.produce()
    for step in range(steps):
        _between(run, _spacing(run, steps))
        began = time.monotonic()
        if step % 2 == 0:
            run.add_worker()
            outcome.faults.append("worker joins")
        else:
            name = run.rng.choice(sorted(run.workers))
            leaving = run.workers.pop(name)
            if step % 4 == 1:
                leaving.terminate()
                outcome.faults.append("worker leaves (SIGTERM)")
            else:
                leaving.kill()
                outcome.faults.append("worker leaves (kill -9)")
        run.recover(outcome, began)


def kafka_restart(run: Run, outcome: Outcome, restarts: int) -> None:
    """The broker stopped for 5 s and started again, under load."""
    _repeated(run, outcome, restarts, "Kafka broker stopped 5 s", lambda: run.servers.restart_kafka(5.0))


def redis_restart(run: Run, outcome: Outcome, restarts: int) -> None:
    """redis-server killed with -9 and started again on its AOF, under load."""
    _repeated(run, outcome, restarts, "redis-server kill -9, AOF restart", run.servers.kill_redis)


def api_restart(run: Run, outcome: Outcome, restarts: int) -> None:
    """An API node killed with -9 and started again under load: until it has replayed every hot
    board it answers 503 for them (and /readyz 503); then its answers equal the model's."""
    node = run.nodes["api-1"]
    run.add_worker()
    run.produce()
    hot_board, windows = next(iter(HOT.items()))
    refused: list[int] = []
    for _ in range(restarts):
        _between(run, _spacing(run, restarts))
        began = time.monotonic()
        node.kill()
        node.start()
        early = 0
        while not node.ready():
            status, body = node.get(f"/v1/boards/{hot_board}/top?window={windows[0]}&limit=1")
            if status == 200:
                raise AssertionError(f"a restarted node answered {hot_board} before it was ready: {body}")
            early += status == 503
            if time.monotonic() - began > 300:
                raise TimeoutError("the restarted API node never became ready")
            time.sleep(0.05)
        outcome.faults.append("API node kill -9 and restart")
        outcome.recover_s.append(time.monotonic() - began)
        refused.append(early)
    outcome.notes.append(f"hot board answers 503 before each restarted node was ready: {refused}")


def _cold_board_refused(status: int, body: Any) -> bool:
    """A board served from Redis while Redis is away: 503 with a JSON error."""
    return (
        status == 503
        and isinstance(body, dict)
        and isinstance(body.get("error"), dict)
        and "code" in body["error"]
    )


def redis_outage(run: Run, outcome: Outcome, seconds: float) -> None:
    """Redis unreachable for `seconds` (every connection reset, new ones refused) under load:
    the workers pause and lose nothing, hot boards keep answering from memory, other boards
    answer 503 JSON, and everything recovers without a process restarted."""
    assert run.proxy is not None
    run.add_worker()
    run.add_worker()
    run.produce()
    _between(run, _spacing(run, 1))
    pids = {name: proc.pid for name, proc in {**run.workers, **run.nodes}.items()}
    hot_board, windows = next(iter(HOT.items()))
    run.proxy.cut()
    began = time.monotonic()
    hot_ok = cold_refused = 0
    while time.monotonic() - began < seconds:
        for name, node in run.nodes.items():
            status, body = node.get(f"/v1/boards/{hot_board}/top?window={windows[0]}&limit=3")
            if status != 200 or body.get("source") != "memory":
                raise AssertionError(f"{name}: hot board {hot_board} during the outage: {status} {body}")
            hot_ok += 1
            status, body = node.get("/v1/boards/gift:r1/top?limit=3")
            if not _cold_board_refused(status, body):
                raise AssertionError(f"{name}: a board from Redis during the outage: {status} {body}")
            cold_refused += 1
        time.sleep(0.5)
    run.proxy.restore()
    restored = time.monotonic()
    outcome.faults.append(f"Redis unreachable {seconds:.0f} s")
    run.recover(outcome, restored)
    restarted = [
        n for n, proc in {**run.workers, **run.nodes}.items() if not proc.alive() or proc.pid != pids[n]
    ]
    if restarted:
        raise AssertionError(f"processes did not survive the outage: {restarted}")
    outcome.notes.append(
        f"during the outage: {hot_ok} hot answers from memory, {cold_refused} answers 503 JSON"
    )


def redis_slow(run: Run, outcome: Outcome, seconds: float, delay_s: float) -> None:
    """Every chunk to and from Redis `delay_s` late for `seconds`, under load: the workers go on
    committing throughout (no 5-second stretch without progress)."""
    assert run.proxy is not None
    run.add_worker()
    run.add_worker()
    run.produce()
    _between(run, _spacing(run, 1))
    run.proxy.slow(delay_s)
    began = time.monotonic()
    last, stalled = run.committed_sum(), 0.0
    since = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(1.0)
        now = run.committed_sum()
        if now > last:
            last, since = now, time.monotonic()
        stalled = max(stalled, time.monotonic() - since)
    run.proxy.slow(0.0)
    restored = time.monotonic()
    outcome.faults.append(f"Redis {delay_s * 1000:.0f} ms slower per round trip for {seconds:.0f} s")
    run.recover(outcome, restored)
    outcome.notes.append(f"longest stretch without a commit while slowed: {stalled:.1f} s")
    if stalled > 5.0:
        raise AssertionError(f"no progress for {stalled:.1f} s while Redis was slow")


def cluster_failover(run: Run, outcome: Outcome, failovers: int, wait: bool) -> None:
    """A Redis Cluster master killed with -9 under load, its replica promoted, the node back as a
    replica; with `wait` the workers WAIT for a replica before each commit (nothing committed is
    lost), without it what the replica had not received when the master died is lost."""
    cluster = run.servers.cluster
    assert cluster is not None
    run.servers.wait_replicas = 1 if wait else 0
    label = f"Redis Cluster master kill -9, failover {'with' if wait else 'without'} WAIT"
    _repeated(
        run, outcome, failovers, label, lambda: run.servers.fail_over(run.rng.choice(cluster.master_ports()))
    )


def backlog(run: Run, outcome: Outcome, events: int) -> None:
    """`events` produced while no worker runs, then one worker drains them: its memory stays
    bounded (the largest RSS at most 1.5 times its RSS a tenth of the way in) and it commits
    steadily (never 10 s without a commit). The period-results type sits this one out: its
    1-minute periods would close long before the drain reaches them."""
    run.produce(events, float("inf"), [b for b in ALL_BOARDS if kind(b) != "cup"])
    assert run.pacer is not None
    run.pacer.finish()
    total = sum(run.marks().values())
    worker = run.workers[run.add_worker()]
    began = last_progress = time.monotonic()
    rss: list[tuple[int, int]] = []  # (committed, RSS bytes)
    done, stalled = 0, 0.0
    while done < total:
        time.sleep(1.0)
        now = run.committed_sum()
        if not worker.alive():
            raise AssertionError("the draining worker died")
        rss.append((now, worker.rss_bytes()))
        if now > done:
            done, last_progress = now, time.monotonic()
        stalled = max(stalled, time.monotonic() - last_progress)
        if stalled > 120:
            raise AssertionError(f"no progress for {stalled:.0f} s while draining")
    drain_s = time.monotonic() - began
    warm = next(r for c, r in rss if c >= total // 10)
    peak = max(r for _, r in rss)
    outcome.faults.append(f"{total:,} messages behind")
    outcome.recover_s.append(drain_s)
    outcome.notes.append(
        f"drained {total:,} messages in {drain_s:.0f} s ({total / drain_s:,.0f}/s); worker RSS {warm / 2**20:.0f} MiB "
        f"a tenth of the way in, at most {peak / 2**20:.0f} MiB; longest stretch without a commit {stalled:.1f} s"
    )
    if peak > 1.5 * warm or stalled > 10:
        raise AssertionError(outcome.notes[-1])


def _restart_node(node: ApiNode, env: dict[str, str]) -> float:
    """The node killed and started again with `env` on top of the environment it began with;
    the seconds until it was ready."""
    node.kill()
    node.env = {**node.first_env, **env}
    node.start()
    return wait_for(node.ready, 300, "the restarted API node ready")


def http_fuzz(run: Run, outcome: Outcome, cases: int, coverage: bool) -> None:
    """Schemathesis against an API node while the stream flows: `cases` requests or more with reads
    open, then as many with read tokens and a rate limit on (half carrying a token, half none):
    no 5xx, every answer (401 and 429 included) as the spec says. The node is then opened again
    and the run ends in the exact comparison like every other."""
    run.add_worker()
    run.produce()
    _between(run, 5.0)
    node = run.nodes["api-1"]
    folder = run.servers.folder / "fuzz"
    opened = fuzz(
        node.base, node.admin, label="open", cases=cases, seed=run.seed, folder=folder, coverage=coverage
    )
    token = secrets.token_urlsafe(24)
    outcome.recover_s.append(_restart_node(node, locked_env(token)))
    outcome.faults.append("API node restarted with read tokens and a rate limit")
    node.token = token
    if node.get("/v1/boards/gift:r1/top?limit=1")[0] != 200:
        outcome.failures.append("a locked node refused its own token")
    node.token = ""
    if node.get("/v1/boards/gift:r1/top?limit=1")[0] != 401:
        outcome.failures.append("a locked node answered a read without a token")
    with_token = fuzz(node.base, node.admin, label="locked, a token", cases=cases // 2, seed=run.seed + 2,
                      folder=folder, token=token, coverage=coverage)  # fmt: skip
    without = fuzz(node.base, node.admin, label="locked, no token", cases=cases // 2, seed=run.seed + 4,
                   folder=folder, coverage=coverage)  # fmt: skip
    outcome.recover_s.append(_restart_node(node, {}))
    outcome.faults.append("API node restarted open")
    outcome.notes += [report.line() for report in (*opened, *with_token, *without)]
    outcome.failures += [f"fuzzing: {problem}" for problem in judge(opened, with_token, without, cases)]


SOAK_ID_WINDOW_S = 300
SOAK_READS_PER_S = 20.0
# the members reads look up, on each board: viewers follow a board's top and a few members, and a
# node keeps bounded maps of the requests it saw (api/routes.py MAX_REQUEST_KEYS, MAX_HOT_ANSWERS)
# that reads spread over every member would take the whole soak to fill
SOAK_READ_MEMBERS = 200


def _drain_rate(run: Run, total: int) -> float:
    """Messages a second the workers commit while they drain a backlog of `total` (timed between
    a fifth and four fifths of it, past their start)."""
    low, high = total // 5, total * 4 // 5
    marks: dict[int, float] = {}
    while (done := run.committed_sum()) < total:
        for mark in (low, high):
            if done >= mark and mark not in marks:
                marks[mark] = time.monotonic()
        time.sleep(0.2)
    marks.setdefault(low, time.monotonic())
    marks.setdefault(high, time.monotonic())
    return (high - low) / max(marks[high] - marks[low], 0.2)


def _flat(samples: list[tuple[float, dict[str, int], int]], after_s: float) -> dict[str, tuple[float, float]]:
    """Per process, among the samples taken after `after_s`: (the drift: its median RSS over the
    last quarter of them against that over the first quarter, the larger over the smaller; the
    peak: its largest RSS over that first quarter's median). A leak is drift; one busy moment
    is a peak, reported but not a trend."""
    late = [rss for at, rss, _ in samples if at >= after_s]
    quarter = max(1, len(late) // 4)
    out = {}
    for name in sorted({n for rss in late for n in rss}):
        values = [rss[name] for rss in late if name in rss]
        first, last = statistics.median(values[:quarter]), statistics.median(values[-quarter:])
        out[name] = (max(first, last) / min(first, last), max(values) / first)
    return out


def soak(run: Run, outcome: Outcome, seconds: float, burst: int) -> None:
    """The soak: `burst` messages of big boards (10,000 members each) produced ahead of two
    workers measure their most (the drain rate); then the stream flows at half that for `seconds`
    with reads on both API nodes and a 5-minute id window. Every worker's and API node's RSS is
    sampled, flat within 5% after the warm-up (the id window and a minute; held when the soak is
    three warm-ups or longer, reported otherwise); Redis' used_memory at the end is within 10%
    of what the documented cost model (docs/capacity.md) predicts for the model's members,
    windows and remembered ids; the run ends exact."""
    base = run.servers.used_memory()
    plan = Stream(run.seed, run.start_ms, SOAK_BOARDS).messages(10**12)
    run.pace(islice(plan, burst), float("inf")).finish()
    total = sum(run.marks().values())
    run.add_worker()
    run.add_worker()
    most = _drain_rate(run, total)
    rate = most / 2
    reads = Reads(list(run.nodes.values()), SOAK_BOARDS, SOAK_READ_MEMBERS, SOAK_READS_PER_S, run.seed)
    reads.start()
    pacer = run.pace(islice(plan, int(rate * seconds)), rate)
    samples: list[tuple[float, dict[str, int], int]] = []  # (seconds in, RSS by process, used_memory)
    began, every = time.monotonic(), min(20.0, max(2.0, seconds / 90))
    while pacer.is_alive():
        pacer.join(every)
        processes = {**run.workers, **run.nodes}
        samples.append((time.monotonic() - began, {n: p.rss_bytes() for n, p in processes.items()},
                        run.servers.used_memory()))  # fmt: skip
    outcome.faults.append(f"{seconds / 60:.0f}-minute soak at half the drain rate")
    marks = run.marks()
    outcome.recover_s.append(wait_for(lambda: run.committed_past(marks), 300, "the workers catching up"))
    used = run.servers.used_memory()
    statuses = reads.stop()
    run.finish(outcome)
    assert run.model is not None
    figures = Figures()
    member_windows = run.model.member_windows()
    ids = run.model.ids_applied_since(pacer.last_ms - SOAK_ID_WINDOW_S * 1000)
    data = member_windows * figures.redis_bytes_per_member_window + ids * figures.redis_bytes_per_event_id
    error = (used - base) / data - 1
    warm_up = SOAK_ID_WINDOW_S + 60.0
    series = [{"s": round(at), "rss_mib": {n: round(v / 2**20, 1) for n, v in rss.items()}, "used_memory_mib": round(mem / 2**20, 1)}
              for at, rss, mem in samples]  # fmt: skip
    (run.servers.folder / "soak-samples.json").write_text(json.dumps(series, indent=0), encoding="utf-8")
    flat = _flat(samples, warm_up)
    late = [mem for at, _, mem in samples if at >= warm_up] or [used]
    rss = {n: f"{min(r[n] for _, r, _ in samples if n in r) / 2**20:.0f}-{max(r[n] for _, r, _ in samples if n in r) / 2**20:.0f}"
           for n in flat}  # fmt: skip
    drift = max((d for d, _ in flat.values()), default=1.0)
    outcome.notes += [
        f"drain rate {most:,.0f} messages/s ({burst:,} messages behind two workers); soaked at {rate:,.0f}/s for "
        f"{seconds:.0f} s with {SOAK_READS_PER_S:.0f} reads/s ({dict(sorted(statuses.items()))}), id window "
        f"{SOAK_ID_WINDOW_S} s",
        f"RSS (MiB, whole soak) {rss}; after the {warm_up:.0f} s warm-up, drift (last quarter's median against "
        "the first's) and peak (largest over the first quarter's median): "
        + ", ".join(f"{n} {d:.3f}, {p:.3f}" for n, (d, p) in flat.items()),
        f"Redis used_memory {used / 2**20:.1f} MiB, {base / 2**20:.1f} MiB of it before any event; the cost model: "
        f"{member_windows:,} members x windows x {figures.redis_bytes_per_member_window:.0f} B + {ids:,} ids x "
        f"{figures.redis_bytes_per_event_id:.0f} B = {data / 2**20:.1f} MiB; measured data {error:+.1%} off it; "
        f"used_memory after the warm-up {min(late) / 2**20:.1f}-{max(late) / 2**20:.1f} MiB",
    ]
    if abs(error) > 0.10:
        outcome.failures.append(f"Redis data {error:+.1%} off the cost model")
    if seconds >= 3 * warm_up and drift > 1.05:
        outcome.failures.append(f"RSS not flat within 5% after the warm-up: {flat}")
    unexpected = {status: n for status, n in statuses.items() if status not in (200, 404)}
    if unexpected or not statuses[200]:
        outcome.failures.append(f"reads during the soak answered {dict(statuses)}")


Scenario = Callable[[Run, Outcome], None]
SCENARIOS: dict[str, tuple[str, Callable[[Profile], Scenario]]] = {
    "worker-kill": ("a worker killed with -9 ten times in one run (three in the short profile)",
                    lambda p: lambda r, o: worker_kill(r, o, 10 if p.name == "full" else 3)),
    "worker-churn": ("three workers, one joining or leaving every few seconds",
                     lambda p: lambda r, o: worker_churn(r, o, 8 if p.name == "full" else 4)),
    "kafka-restart": ("the Kafka broker stopped and restarted under load",
                      lambda p: lambda r, o: kafka_restart(r, o, 2 if p.name == "full" else 1)),
    "redis-restart": ("redis-server killed with -9 and restarted on its AOF under load",
                      lambda p: lambda r, o: redis_restart(r, o, 2 if p.name == "full" else 1)),
    "api-restart": ("an API node killed and restarted under load: 503 until complete, then identical answers",
                    lambda p: lambda r, o: api_restart(r, o, 3 if p.name == "full" else 1)),
    "redis-outage": ("Redis unreachable for 30 s (10 s in the short profile): workers pause and lose nothing, hot boards "
                     "answer from memory, other boards 503 JSON, recovery without restarts",
                     lambda p: lambda r, o: redis_outage(r, o, 30.0 if p.name == "full" else 10.0)),
    "redis-slow": ("Redis slowed by a throttling TCP proxy (20 ms per round trip) for 30 s under load: steady progress",
                   lambda p: lambda r, o: redis_slow(r, o, 30.0 if p.name == "full" else 10.0, 0.02)),
    "failover-wait": ("a Redis Cluster master killed with -9 and failed over, workers WAITing for a replica: exact",
                      lambda p: lambda r, o: cluster_failover(r, o, 2 if p.name == "full" else 1, wait=True)),
    "failover-nowait": ("the same failover without WAIT: writes the replica had not received are lost (documented); "
                        "nothing doubled",
                        lambda p: lambda r, o: cluster_failover(r, o, 2 if p.name == "full" else 1, wait=False)),
    "http-fuzz": ("HTTP fuzzing from the OpenAPI spec under load: 1,000 cases or more with reads open, as many with "
                  "read tokens and a rate limit on (100 each in the short profile): no 5xx, every answer as the spec "
                  "says, 401 and 429 included",
                  lambda p: lambda r, o: http_fuzz(r, o, 1_000 if p.name == "full" else 100, p.name == "full")),
    "soak": ("a 30-minute soak (its length: --soak-minutes; 1 minute in the short profile) at half the drain rate "
             "of two workers, with reads and a 5-minute id window: every worker's and API node's RSS flat within 5% "
             "after warm-up, Redis used_memory within 10% of the documented cost model",
             lambda p: lambda r, o: soak(r, o, p.soak_s, 150_000 if p.name == "full" else 20_000)),
    "backlog": ("a worker starting 3,000,000 events (about 2 million messages) behind (200,000 events in the short "
                "profile): bounded memory, steady progress",
                lambda p: lambda r, o: backlog(r, o, 3_000_000 if p.name == "full" else 200_000)),
}  # fmt: skip
# a scenario whose documented degradation is not a failure: what it may lose (docs/chaos.md)
TOLERATED = {"failover-nowait": "writes the replica had not received when its master died"}
LOSS_SHAPED = ("redis ", "api-")  # differences in Redis and in answers: what a lost write leaves
PROXIED = {"redis-outage", "redis-slow"}  # the service reaches Redis through the harness' proxy
CLUSTERED = {"failover-wait", "failover-nowait"}  # on a Redis Cluster
ENV = {"soak": {"RANKSTREAM_ID_WINDOW_S": str(SOAK_ID_WINDOW_S)}}  # a scenario's own settings


def run_scenario(name: str, profile: Profile, seed: int, folder: Path) -> Outcome:
    outcome = Outcome(name, profile.name, seed)
    began = time.monotonic()
    run = Run(
        folder / name, profile, seed, proxied=name in PROXIED, cluster=name in CLUSTERED, env=ENV.get(name)
    )
    try:
        run.add_node("api-1")
        run.add_node("api-2")
        for node_name, node in run.nodes.items():
            wait_for(node.ready, 120, f"{node_name} ready")
        SCENARIOS[name][1](profile)(run, outcome)
        run.finish(outcome)
    except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a failed row; the others still run
        outcome.failures.append(f"the scenario broke: {type(exc).__name__}: {exc}")
    finally:
        run.close()
    outcome.seconds = time.monotonic() - began
    return outcome
