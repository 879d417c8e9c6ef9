"""Period results end to end (docs/contract.md §6, docs/period-results.md): three worker processes
(tests/sim_worker.py) on real Kafka and Redis share one simulated service clock, a file the test
moves, through two days of events in Asia/Shanghai (the boards and the stream:
tests/results_stream.py; what each result must be: tests/results_model.py).

Mid-stream the workers are struck, always the current results leader (the holder of the lease
`{results}:emitter`), right after the clock made results due: SIGKILL while its transaction is
being built (a result `sending`, restarted later), SIGSTOP likewise (a zombie: resumed once
another worker took the lease and settled what it left; the worker that took its partitions fenced
its transactional id, so it stops by itself later, and is restarted as its pod would be), SIGTERM
(it leaves for good), and SIGKILL once its transaction is committed but some of its markers still
say `sending` (restarted later). The successor must find those records rather than send them
again, and send the others (an aborted transaction is never read).

At the end `rank_period_closed`, read with read_committed, must hold exactly one record per
(board, window, period) of a declared window in which an event counted, each equal to the models'
final standing of that period, its marker `sent` at that record (tests/results_model.py). A result
a struck leader left `sending` in a committed transaction is the struck leader's record (older
than the strike).

The clock protocol (as tests/integration/test_rolling_oracle.py's): the clock moves only once
every event produced so far is applied (each board's seq equals the model's), so the workers
classify each event late or on time exactly as the models do; before it enters a new hour it stops
at the hour's last ms until the next last_3h period of every board due is prepared (its marker
`done`); and it never passes the expiry of a period whose result is still due (in production the
clock is the real one: a lease lapse of 15 s is nothing against an hour, here it is many simulated
hours)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from chaos.traffic import Record
from common.clock import TEST_CLOCK_ENV, ClockFile
from common.settings import Settings
from tests.boundaries import assert_crosses
from tests.conftest import ROOT
from tests.helpers import BOTH_TOPOLOGIES, mget, read_results, worker_env
from tests.integration.test_periods_oracle import accept_future_timestamps, wait_until
from tests.results_model import Expect, check_records, check_totals
from tests.results_stream import GIFT, ZONE, Stream, config, first_instant
from tests.rolling_model import HOUR, MINUTE
from tests.sim_worker import DWELL_ENV, PASS_ENV
from tests.stream_events import event_times

pytestmark = [pytest.mark.integration, pytest.mark.slow, BOTH_TOPOLOGIES]

# at the first step of these hours (by the simulated clock): what happens to the workers
# and at which moment of the leader's transaction of the results just due (Cluster.catch)
ACTIONS = {
    6: ("kill", "sending"),
    12: ("restart", ""),
    16: ("pause", "sending"),
    20: ("leave", ""),
    30: ("kill", "marking"),
    38: ("restart", ""),
}
WORKER_IDS = ("w1", "w2", "w3")
PASS_S = "0.05"  # noqa: S105 - not a password: the preparer's and the emitter's passes (the product's: 1 s)
WAIT_S = 90.0  # a wait that may span a rebalance after a SIGKILL or a lease lapse (15 s)


@dataclass(frozen=True)
class Strike:
    """A kill, pause or leave: when (ms, real clock), and the markers of the results then due
    right after it."""

    action: str
    worker: str
    at_ms: int
    marks: dict[str, str]


class Cluster:
    """The worker processes, the clock they share and the waits of the clock protocol."""

    def __init__(
        self, settings: Settings, client: redis.Redis, clock: ClockFile, expect: Expect, logs: Path
    ) -> None:
        self.settings = settings
        self.client = client
        self.clock = clock
        self.expect = expect
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.killed: list[str] = []  # SIGKILLed, not restarted yet
        self.left: list[str] = []  # stopped with SIGTERM, for good
        self.zombie = ""  # paused and resumed: it may stop by itself (fenced)
        self.actions: list[tuple[str, str, bool]] = []  # (action, worker, it held the lease)
        self.strikes: list[Strike] = []
        self.prefix = settings.key_prefix
        self.dwell = logs / "dwell"  # while it exists the emitters linger where strikes land

    # --- the workers ----------------------------------------------------------------------------
    def start(self, worker: str) -> None:
        env = worker_env(self.settings, worker_id=worker)
        env.update({
            "RANKSTREAM_WORKER_BATCH_TIMEOUT_MS": "5",
            "RANKSTREAM_LOG_LEVEL": "INFO",
            TEST_CLOCK_ENV: str(self.clock.path),
            PASS_ENV: PASS_S,
            DWELL_ENV: str(self.dwell),
        })  # fmt: skip
        self.ports[worker] = int(env["RANKSTREAM_WORKER_HTTP_PORT"])
        with (self.logs / f"{worker}.log").open("ab") as log:
            argv = [sys.executable, "-m", "tests.sim_worker"]
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        self.procs[worker] = proc

    def leader(self) -> str | None:
        """The worker holding the results lease (its value is `<group>-<worker id>`)."""
        raw = cast(bytes | None, self.client.get(f"{self.prefix}{{results}}:emitter"))
        if raw is None:
            return None
        return raw.decode().removeprefix(f"{self.settings.worker_group}-")

    def victim(self) -> tuple[str, bool]:
        running = sorted(w for w, p in self.procs.items() if p.poll() is None)
        assert running, "no worker left"
        leader = self.leader()
        return (leader, True) if leader in running else (running[0], False)

    def act(self, action: str, moment: str, rng: random.Random) -> None:
        """kill (SIGKILL), pause (SIGSTOP: a zombie leader, resumed once a successor settled what
        it left) or leave (SIGTERM) the leader, or restart the worker killed last. kill and pause
        strike at `moment` of the leader's transaction (catch) if they see it within seconds."""
        if action == "restart":
            worker = self.killed.pop()
            self.start(worker)
            self.actions.append((action, worker, False))
            return
        due_key = f"{self.prefix}{{results}}:due"
        keys = [
            k.decode() for k in cast(list[bytes], self.client.zrangebyscore(due_key, "-inf", self.clock()))
        ]
        if not (moment and self.catch(keys, moment)):
            time.sleep(rng.uniform(0, 0.3))
        worker, leading = self.victim()
        proc = self.procs[worker]
        if action == "kill":
            proc.kill()
            self.killed.append(worker)
            proc.wait(60)
        elif action == "pause":
            proc.send_signal(signal.SIGSTOP)
        else:  # leaves: finishes its pass and its batch, commits, gives the lease back
            self.left.append(worker)
            proc.send_signal(signal.SIGTERM)
            assert self.exited(worker, 60) == 0, f"{worker} exited with {proc.returncode}"
        struck = Strike(
            action, worker, time.time_ns() // 1_000_000, dict(zip(keys, self.markers(keys), strict=True))
        )
        self.strikes.append(struck)
        if action == "pause":
            self.await_successor(worker)
            proc.send_signal(signal.SIGCONT)
            self.zombie = worker
        self.actions.append((action, worker, leading))

    def exited(self, worker: str, timeout: float) -> int:
        """The worker's exit code once it exits; if it doesn't within `timeout`, fails with its
        threads' stacks (tests/sim_worker.py dumps them on SIGUSR1) and its last log lines."""
        proc = self.procs[worker]
        started = time.monotonic()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            tail = (self.logs / f"{worker}.log").read_text(errors="replace")[-12_000:]
            raise AssertionError(f"{worker} up {timeout} s after SIGTERM; its log ends:\n{tail}") from None
        took = time.monotonic() - started
        assert took <= self.settings.shutdown_deadline_s + 5, f"{worker} took {took:.1f} s to exit"
        log = (self.logs / f"{worker}.log").read_text(errors="replace")
        # an orderly stop: not one the deadline cut short (common/deadline.py exit_at, whose exit
        # status is 0 too, or faulthandler's backstop)
        for cut in ("shutdown deadline reached", "Timeout (0:"):
            assert cut not in log, f"{worker} was cut short at the deadline; its log ends:\n{log[-12_000:]}"
        return code

    def catch(self, keys: list[str], moment: str) -> bool:
        """Polls the markers of `keys` until the leader's transaction is at `moment`: `sending`
        (one marked sending: the transaction is being built or committed) or `marking` (one
        marked sent, another still sending: it is committed, its markers are being moved)."""
        deadline = time.monotonic() + 3
        while keys and time.monotonic() < deadline:
            states = {mark.split(":", 1)[0] for mark in self.markers(keys)}
            if "sending" in states and (moment == "sending" or "sent" in states):
                return True
        return False

    def revive(self) -> None:
        """Restart a worker that stopped by itself, as its pod would be: only the paused one may,
        once resumed (the worker that took its partitions fenced its transactional id)."""
        for worker, proc in self.procs.items():
            if proc.poll() is None or worker in self.killed or worker in self.left:
                continue
            assert (worker, proc.returncode) == (self.zombie, 1), (worker, proc.returncode)
            self.start(worker)
            self.actions.append(("revive", worker, False))
            self.zombie = ""

    def markers(self, keys: list[str]) -> list[str]:
        names = []
        for key in keys:
            board, window, period = key.split("|")
            names.append(f"{self.prefix}{{{board}}}:rp:{window}:{period}")
        values = cast(list[bytes | None], mget(self.client, names)) if names else []
        return [(v or b"").decode() for v in values]

    def await_successor(self, zombie: str) -> None:
        """Until another worker holds the lease and has settled what the zombie left due."""
        due_key = f"{self.prefix}{{results}}:due"
        now = self.clock()

        def settled() -> tuple[bool, str]:
            left = cast(list[bytes], self.client.zrangebyscore(due_key, "-inf", now))
            leader = self.leader()
            return leader not in {None, zombie} and not left, f"lease {leader}, due {left}"

        wait_until(settled, "a successor to the paused leader", WAIT_S)  # not revive: it is paused

    def outcomes(self) -> Counter[str]:
        """What the running workers' emitters did (rankstream_worker_period_results by outcome)."""
        total: Counter[str] = Counter()
        for worker, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            url = f"http://127.0.0.1:{self.ports[worker]}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "rankstream_worker_period_results_total":
                        total[sample.labels["outcome"]] += int(sample.value)
        return total

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused one too
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    # --- the clock protocol ---------------------------------------------------------------------
    def advance(self, now: int) -> None:
        """To `now`, stopping at the last ms of an hour it leaves until the next periods are prepared."""
        hours = self.expect.rolling.buckets["h"]
        current = self.clock()
        assert now > current
        crossed = hours.at(now) - hours.at(current)
        assert crossed <= 1, "the clock never skips an hour: the preparer works in each"
        if crossed:
            last = hours.bucket_at(current).end - 1
            if last > current:
                self.move(last)
            self.settle(last)
        self.move(now)

    def move(self, to: int) -> None:
        """Set the clock, once no result still due belongs to a period expiring by then."""
        due_key = f"{self.prefix}{{results}}:due"
        now = self.clock()

        def emitted() -> tuple[bool, str]:
            entries = cast(list[tuple[bytes, float]], self.client.zrange(due_key, 0, -1, withscores=True))
            waiting = [(k.decode(), int(s)) for k, s in entries if self.expect.expiry(k.decode()) <= to]
            late = [(k, due) for k, due in waiting if due > now]
            assert not late, f"due after the clock ({now}) yet expiring before {to}: {late}"
            return not waiting, f"results still due: {waiting}"

        self.wait(emitted, "results of periods about to expire")
        self.clock.set(to)

    def settle(self, now: int) -> None:
        """Until the next last_3h period of every board due in this hour is prepared."""
        hours = self.expect.rolling.buckets["h"]
        current = hours.bucket_at(now)
        following = hours[hours.at(now) + 1]
        due = cast(set[bytes], self.client.smembers(f"{self.prefix}{{rolling}}:h:{current.id}"))
        boards = sorted(b.decode() for b in due)
        assert set(boards) <= set(GIFT), boards
        markers = [f"{self.prefix}{{{board}}}:rp:last_3h:{following.id}" for board in boards]

        def prepared() -> tuple[bool, str]:
            values = cast(list[bytes | None], mget(self.client, markers)) if markers else []
            missing = [(m, v) for m, v in zip(markers, values, strict=True) if v != b"done"]
            return not missing, f"not prepared: {missing}"

        self.wait(prepared, "the next last_3h periods prepared")

    def wait_applied(self) -> None:
        boards = sorted(self.expect.periods.boards)
        keys = [f"{self.prefix}{{{board}}}:seq" for board in boards]
        want = [self.expect.periods.boards[board].seq for board in boards]

        def applied() -> tuple[bool, str]:
            got = [int(v or 0) for v in cast(list[bytes | None], mget(self.client, keys))]
            assert all(g <= w for g, w in zip(got, want, strict=True)), f"applied {got}, the model {want}"
            return got == want, f"applied {got}, the model {want}"

        self.wait(applied, "the workers")

    def wait(self, condition: Callable[[], tuple[bool, str]], what: str) -> None:
        """wait_until, restarting a worker that stopped by itself meanwhile (revive)."""

        def check() -> tuple[bool, str]:
            self.revive()
            return condition()

        try:
            wait_until(check, what, WAIT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the workers: {self.probes()}") from None

    def probes(self) -> dict[str, Any]:
        """Each running worker's /livez and /readyz (for a failure's message)."""
        out: dict[str, Any] = {}
        for worker, proc in self.procs.items():
            if proc.poll() is not None:
                out[worker] = f"exited {proc.returncode}"
                continue
            for route in ("livez", "readyz"):
                url = f"http://127.0.0.1:{self.ports[worker]}/{route}"
                try:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        out[f"{worker} {route}"] = orjson.loads(resp.read())
                except OSError as exc:
                    out[f"{worker} {route}"] = repr(exc)
        return out


@pytest.fixture
def results_settings(make_settings: Callable[..., Settings], tmp_path: Path, topics: Settings) -> Settings:
    """The test's settings on its boards; its topics (the results topic too) exist meanwhile."""
    path = tmp_path / "boards.yaml"
    path.write_text(config())
    settings = make_settings(boards=path)
    assert settings.topic_results == topics.topic_results != "rank_period_closed"
    accept_future_timestamps(settings)
    return settings


def test_period_results(results_settings, rclient, tmp_path):
    settings = results_settings
    started = time.monotonic()
    start = first_instant(ZoneInfo(ZONE))
    expect, stream = Expect(start), Stream(start, seed=6)
    clock = ClockFile.create(tmp_path / "clock", start)
    cluster = Cluster(settings, rclient, clock, expect, tmp_path)
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0, "enable.idempotence": True}
    )
    try:
        for worker in WORKER_IDS:
            cluster.start(worker)
        previous, sent = start, []
        for hour, now, kind in stream.steps():
            striking = kind == "first" and hour in ACTIONS
            if striking:  # the emitter lingers where a strike lands (tests/sim_worker.py)
                cluster.dwell.touch()
            cluster.advance(now)
            if striking:  # at once: the leader is at work on what is due
                cluster.act(*ACTIONS[hour], stream.rng)
                cluster.dwell.unlink()
            expect.snapshot(now)
            for message in stream.messages(previous, now, kind):
                value = message.value()
                producer.produce(settings.topic_updates, value, key=message.key, timestamp=message.kafka_ts)
                for event in message.events:
                    expect.apply(event, now, value)
                sent.append(message)
            assert producer.flush(30) == 0
            cluster.wait_applied()
            previous = now
        streamed = time.monotonic() - started
        assert_crosses("the period-results stream", ZoneInfo(ZONE), event_times(sent), ("day",))
        # the emitter kept up: nothing due an hour ago is still waiting
        due_key = f"{settings.key_prefix}{{results}}:due"
        backlog = cast(list[bytes], rclient.zrangebyscore(due_key, "-inf", clock() - HOUR))
        assert backlog == [], backlog
        final = max(expect.due.values())
        while clock() < final:  # every declared period closes, its grace passes, its result is due
            cluster.advance(min(clock() + 15 * MINUTE, final))
            expect.snapshot(clock())
        wait_until(
            lambda: (rclient.zcard(due_key) == 0, str(rclient.zrange(due_key, 0, -1))), "none due", 120.0
        )
        outcomes = cluster.outcomes()
    finally:
        cluster.stop_all()
        clock.close()
    records = read_results(settings)
    print(
        f"\n{len(records)} results; events applied {sum(b.seq for b in expect.periods.boards.values())}; "
        f"streamed in {streamed:.0f}s, all in {time.monotonic() - started:.0f}s; workers: {cluster.actions}; "
        f"the running workers' emitters: {dict(outcomes)}"
    )
    check_records(records, expect, rclient, settings)
    check_totals(expect, rclient, settings)
    found, resent = check_strikes(records, cluster.strikes)
    print(
        f"results a struck leader left sending: {found} found committed by a successor, {resent} sent again"
    )
    assert found and resent, "the strikes missed their moments (each one's transaction was settled)"
    # the stream did what it is for
    struck = [leading for action, _, leading in cluster.actions if action in {"kill", "pause", "leave"}]
    assert len(struck) == 4 and all(struck), cluster.actions  # each struck the leader
    changed = [k for k, before in expect.snapshots.items() if before != expect.result(k)]
    assert len(changed) >= 20, f"late events within the grace changed only {changed}"
    assert expect.beyond >= 50, expect.beyond
    print(f"results changed after their period ended: {len(changed)}; late beyond the grace: {expect.beyond}")


def check_strikes(records: list[Record], strikes: list[Strike]) -> tuple[int, int]:
    """The results a struck leader left `sending`: committed by it (its record is older than the
    strike) if it had marked one of its transaction sent already, and then found by the successor,
    not sent again; else either (committed just before the strike, or aborted and sent again).
    Returns how many were found and how many sent again."""
    stamps = {(msg.key or b"").decode(): msg.timestamp for msg in records}
    found = resent = 0
    for strike in strikes:
        states = {key: mark.split(":", 1)[0] for key, mark in strike.marks.items()}
        committed = "sent" in states.values()  # one transaction per pass: all of it committed
        for key, state in states.items():
            if state != "sending":
                continue
            before = stamps[key] < strike.at_ms
            assert before or not committed, (strike, key, stamps[key])
            found += before
            resent += not before
    return found, resent
