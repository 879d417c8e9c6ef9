"""Period results end to end (CONTRACT 6, README "Period results"): three worker processes
(tests/sim_worker.py) on real Kafka and Redis share one simulated service clock, a file the test
moves, through two days of events in Asia/Shanghai. Board type `gift` declares
`period_results: {windows: [hour, day, last_3h], top: 5}` (its 30min and total windows emit
nothing), type `plain` declares none. Events are mostly small incrs over 8 members (ties, decided
by who got there first), with set, best and delete; some are late within the late grace (in the
period that just closed, large: they change its result) or beyond it (they count in total and open
periods only), some ahead of the clock; at a few boundaries one lands at the last ms of the grace
and one at the first ms after it. Each board's events stay in one partition (the models apply them
in the order produced).

Mid-stream the workers are struck, always the current results leader (the holder of the lease
`{results}:emitter`), right after the clock made results due: SIGKILL while its transaction is
being built (a result `sending`, restarted later), SIGSTOP likewise (a zombie: resumed once
another worker took the lease and settled what it left; the worker that took its partitions fenced
its transactional id, so it stops by itself later, and is restarted as its pod would be), SIGTERM
(it leaves for good), and SIGKILL once its transaction is committed but some of its markers still
say `sending` (restarted later). The successor must find those records rather than send them
again, and send the others (an aborted transaction is never read).

At the end `rank_period_closed`, read with read_committed, must hold exactly one record per
(board, window, period) of a declared window in which an event counted (a delete adds no member:
it registers no result), each equal to the final standing of that period in the independent
models (tests/period_model.py for hour and day, tests/rolling_model.py for last_3h): its member
count and its top 5 (rank, member, score, meta) in the board's order, closed_at its end; its seq
no older than the period's last counted event and no newer than the board's last. Each period's
marker says `sent` at that record's partition and offset. A result a struck leader left `sending`
in a committed transaction is the struck leader's record (older than the strike).

The clock protocol (as tests/integration/test_rolling_oracle.py's): the clock moves only once
every event produced so far is applied (each board's seq equals the model's), so the workers
classify each event late or on time exactly as the models do; before it enters a new hour it stops
at the hour's last ms until the next last_3h period of every board due is prepared (its marker
`done`); and it never passes the expiry of a period whose result is still due (in production the
clock is the real one: a lease lapse of 15 s is nothing against an hour, here it is many simulated
hours). The dates lie 100 days ahead of the real clock: Redis expires keys by its own."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from common.settings import Settings
from rankstream.topics import RESULTS_PARTITIONS
from tests.conftest import ROOT, unique
from tests.helpers import worker_env
from tests.integration.test_periods_oracle import accept_future_timestamps, wait_until
from tests.period_model import BoardType, Calendar, Span
from tests.period_model import Model as PeriodModel
from tests.redis_layout import read_general
from tests.rolling_model import BoardType as RollingType
from tests.rolling_model import Model as RollingModel
from tests.sim_worker import CLOCK_ENV, PASS_ENV, ClockFile
from tests.stream_events import Message, fresh_ts

pytestmark = pytest.mark.integration

ZONE = "Asia/Shanghai"
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
GRACE = 10 * MINUTE
SETTLE_MS = 5_000  # a result is due at its period's end + late grace + this (common/results.py)
SKEW = DAY  # the default max_future_skew_s
TOP = 5
DECLARED = ("hour", "day", "last_3h")
GIFT_WINDOWS = ("total", "30min", "hour", "day", "last_3h")
RETENTION = {"30min": 8, "hour": 6, "day": 3}  # last_3h: the default 2 (kept 1 h after it ends)
PLAIN_WINDOWS = ("total", "hour")
GIFT = ("gift:r1", "gift:r2", "gift:r3")
META_BOARD = "gift:r1"  # its events all carry their member's meta, and none is a delete
# the message key of each board's events: one board's events must stay in order (one partition),
# as the model applies them in the order produced; an array holds the two boards of a key
KEYS = {"gift:r1": "pair", "gift:r2": "pair", "gift:r3": "gift:r3", "plain:x": "plain:x"}
PAIR = ["gift:r1", "gift:r2"]
PLAIN = "plain:x"
MEMBERS = tuple(f"m{i}" for i in range(8))
HOURS = 50  # of events, from 21:00 local: two midnights
EDGES = (3, 17, 27, 41)  # hours whose start's late grace is probed at its last ms and just after
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


def config() -> str:
    document = {
        "timezone": ZONE,
        "types": {
            "gift": {
                "windows": list(GIFT_WINDOWS),
                "retention": RETENTION,
                "late_grace": "10m",
                "period_results": {"windows": list(DECLARED), "top": TOP},
            },
            "plain": {"windows": list(PLAIN_WINDOWS), "late_grace": "10m"},
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


def first_instant(tz: ZoneInfo) -> int:
    """21:00 local, 100 days from now."""
    day = (datetime.now(tz) + timedelta(days=100)).date()
    return int(datetime(day.year, day.month, day.day, 21, tzinfo=tz).timestamp() * 1000)


def result_key(board: str, window: str, period: str) -> str:
    return f"{board}|{window}|{period}"


class Expect:
    """Both models fed with every event, and what they say each result must be."""

    def __init__(self, start: int) -> None:
        tz = ZoneInfo(ZONE)
        calendar = Calendar(tz, start - 3 * DAY, start + 40 * DAY, {})
        types = {
            "gift": BoardType("gift", GIFT_WINDOWS[:-1], RETENTION, GRACE),
            "plain": BoardType("plain", PLAIN_WINDOWS, {"hour": 72}, GRACE),
        }
        self.periods = PeriodModel(calendar, types, SKEW)
        self.rolling = RollingModel(
            tz, start - 70 * DAY, start + 70 * DAY, {"gift": RollingType("gift", GIFT_WINDOWS)}, SKEW
        )
        self.due: dict[str, int] = {}  # result key -> when it is due: a result must come
        self.closed_at: dict[str, int] = {}
        self.last_seq: dict[str, int] = {}  # result key -> its board's seq after its last counted event
        self.snapshots: dict[str, dict[str, Any]] = {}  # result key -> the result when its period ended
        self.beyond = 0  # events late beyond the grace of their hour
        self.log: list[tuple[int, int, dict[str, Any]]] = []

    def span(self, window: str, period: str) -> Span:
        calendar = self.periods.calendar
        return calendar.spans[window][calendar.by_id[window][period]]

    def apply(self, event: dict[str, Any], now: int, raw: bytes) -> None:
        board, ts, op = event["board"], event["ts"], event.get("op", "incr")
        self.periods.apply(event, ts, now, raw)
        self.log.append((now, self.periods.boards[board].seq, event))
        assert not self.periods.dead, self.periods.dead
        seq = self.periods.boards[board].seq
        if not board.startswith("gift:"):
            return
        assert self.rolling.apply(event, ts, now)
        assert self.rolling.seq(board) == seq
        spec = self.periods.types["gift"]
        for window in ("hour", "day"):
            span = self.periods.calendar.at("gift", window, ts)
            assert span is not None
            if now >= min(span.end + GRACE, self.periods.expiry(spec, window, span)):
                self.beyond += window == "hour"
                continue
            self._counted(result_key(board, window, span.id), span.end, seq, op)
        if op == "delete":  # it takes the member out of the window, wherever it is: no result due
            return
        hours = self.rolling.buckets["h"]
        for q in range(hours.at(ts), hours.at(ts) + 3):  # the periods summing its bucket
            period = hours[q]
            if now < self.rolling.limit(board, "last_3h", period.id):
                self._counted(result_key(board, "last_3h", period.id), period.end, seq, op)

    def _counted(self, key: str, end: int, seq: int, op: str) -> None:
        self.last_seq[key] = seq
        if op != "delete":  # a delete adds no member: it registers no result (worker/apply.py)
            self.due.setdefault(key, end + GRACE + SETTLE_MS)
            self.closed_at[key] = end

    def snapshot(self, now: int) -> None:
        """Each result as it stands when its period ends (late events may change it still)."""
        for key, end in self.closed_at.items():
            if end <= now and key not in self.snapshots:
                self.snapshots[key] = self.result(key)

    def expiry(self, key: str) -> int:
        board, window, period = key.split("|")
        if window == "last_3h":
            return self.rolling.expiry(board, window, period)
        assert window in DECLARED, f"a result is due for {key}, whose window declares none"
        return self.periods.expiry(self.periods.types["gift"], window, self.span(window, period))

    def result(self, key: str) -> dict[str, Any]:
        """The record's body without its seq."""
        board, window, period = key.split("|")
        if window == "last_3h":
            ranking: list[tuple[str, float]] = [
                (item.member, item.score) for item in self.rolling.ranking(board, window, period)
            ]
            end = self.rolling.span(window, period).end
        else:
            ranking = [(m, float(s)) for m, s in self.periods.ranking(board, f"{window}:{period}")]
            end = self.span(window, period).end
        top: list[dict[str, Any]] = []
        for rank, (member, score) in enumerate(ranking[:TOP], 1):
            top.append({"rank": rank, "member": member, "score": score})
            if board == META_BOARD:
                top[-1]["meta"] = {"name": f"Member {member}"}
        return {"board": board, "window": window, "period": period, "closed_at": end,
                "members": len(ranking), "top": top}  # fmt: skip


class Stream:
    """The clock's steps and the events produced at each."""

    def __init__(self, start: int, seed: int) -> None:
        self.start = start
        self.rng = random.Random(seed)
        self.used: dict[str, set[int]] = {}
        self.ids = 0

    def steps(self) -> Iterator[tuple[int, int, str]]:
        """(hour index, clock, kind) in time order."""
        rng = self.rng
        for hour in range(HOURS):
            at = self.start + hour * HOUR
            points = [(at + 5 * MINUTE, "late")]
            if hour in EDGES:
                points += [(at + GRACE - 1, "edge-in"), (at + GRACE, "edge-out")]
            points += [
                (at + rng.randint(11, 25) * MINUTE, "first"),  # ACTIONS happen here
                (at + rng.randint(28, 44) * MINUTE, "mid"),
                (at + rng.randint(46, 58) * MINUTE, "last"),  # the preparer's quarter
            ]
            for now, kind in sorted(points):
                yield hour, now, kind

    def messages(self, previous: int, now: int, kind: str) -> list[Message]:
        rng = self.rng
        hour_start = now - (now - self.start) % HOUR
        out: list[Message] = []
        for board in GIFT:
            out += [
                self._message(now, [board], rng.randint(previous + 1, now)) for _ in range(rng.randint(1, 3))
            ]
            if kind == "late":  # within the grace, in the hour that closed: large, it moves the top
                for _ in range(rng.randint(1, 2)):
                    late = hour_start - rng.randint(1, 30 * MINUTE)
                    out.append(self._message(now, [board], late, big=True))
            elif kind == "edge-in":  # the grace's last ms: counts
                out.append(self._message(now, [board], hour_start - 1, big=True))
            elif kind == "edge-out":  # its first ms after: counts in later periods only
                out.append(self._message(now, [board], hour_start - rng.randint(1, 9 * MINUTE), big=True))
            elif rng.random() < 0.4:  # beyond the grace of its hour
                late = hour_start - rng.randint(1, 50 * MINUTE)
                out.append(self._message(now, [board], late, big=rng.random() < 0.5))
            if rng.random() < 0.1:  # hours late
                out.append(self._message(now, [board], now - rng.randint(2 * HOUR, 5 * HOUR)))
            if rng.random() < 0.1:  # ahead of the clock
                out.append(self._message(now, [board], now + rng.randint(MINUTE, 50 * MINUTE)))
        if rng.random() < 0.3:  # one message for two boards
            out.append(self._message(now, rng.sample(PAIR, 2), rng.randint(previous + 1, now)))
        out += [
            self._message(now, [PLAIN], now - rng.randint(0, 40 * MINUTE)) for _ in range(rng.randint(0, 2))
        ]
        return out

    def _message(self, now: int, boards: list[str], ts: int, big: bool = False) -> Message:
        events = [self._event(b, fresh_ts(self.used.setdefault(b, set()), ts), big) for b in boards]
        assert len({KEYS[board] for board in boards}) == 1
        return Message(KEYS[boards[0]], now, events, array=len(events) > 1 or self.rng.random() < 0.3)

    def _event(self, board: str, ts: int, big: bool) -> dict[str, Any]:
        rng = self.rng
        self.ids += 1
        member = rng.choice(MEMBERS)
        event: dict[str, Any] = {"id": f"e{self.ids}", "board": board, "member": member, "ts": ts}
        weights = (80, 8, 12, 0) if board == META_BOARD else (74, 8, 10, 8)
        op = "incr" if big else rng.choices(("incr", "set", "best", "delete"), weights)[0]
        if op != "incr" or rng.random() < 0.5:
            event["op"] = op
        if op == "incr":
            event["score"] = rng.randint(6, 12) if big else rng.choice((-1, 1, 1, 2, 2, 3, 5))
        elif op != "delete":
            event["score"] = rng.randint(0, 15)
        if board == META_BOARD:
            event["meta"] = {"name": f"Member {member}"}
        return event


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

    # --- the workers ----------------------------------------------------------------------------
    def start(self, worker: str) -> None:
        env = worker_env(self.settings, worker_id=worker)
        env.update({
            "RANKSTREAM_WORKER_BATCH_TIMEOUT_MS": "5",
            "RANKSTREAM_LOG_LEVEL": "INFO",
            CLOCK_ENV: str(self.clock.path),
            PASS_ENV: PASS_S,
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
            assert proc.wait(60) == 0, f"{worker} exited with {proc.returncode}"
        struck = Strike(
            action, worker, time.time_ns() // 1_000_000, dict(zip(keys, self.markers(keys), strict=True))
        )
        self.strikes.append(struck)
        if action == "pause":
            self.await_successor(worker)
            proc.send_signal(signal.SIGCONT)
            self.zombie = worker
        self.actions.append((action, worker, leading))

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
        values = cast(list[bytes | None], self.client.mget(names)) if names else []
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
            values = cast(list[bytes | None], self.client.mget(markers)) if markers else []
            missing = [(m, v) for m, v in zip(markers, values, strict=True) if v != b"done"]
            return not missing, f"not prepared: {missing}"

        self.wait(prepared, "the next last_3h periods prepared")

    def wait_applied(self) -> None:
        boards = sorted(self.expect.periods.boards)
        keys = [f"{self.prefix}{{{board}}}:seq" for board in boards]
        want = [self.expect.periods.boards[board].seq for board in boards]

        def applied() -> tuple[bool, str]:
            got = [int(v or 0) for v in cast(list[bytes | None], self.client.mget(keys))]
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


def read_results(settings: Settings) -> list[Any]:
    """Every committed record of the results topic (read_committed, to the end of each partition)."""
    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": unique("results-reader"),
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    })  # fmt: skip
    topic = settings.topic_results
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(RESULTS_PARTITIONS)])
    records: list[Any] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < RESULTS_PARTITIONS:
            assert time.monotonic() < deadline, f"reading {topic}: partitions at their end {ended}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                partition = msg.partition()
                assert partition is not None
                ended.add(partition)
                continue
            records.append(msg)
    finally:
        consumer.close()
    return records


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
        previous = start
        for hour, now, kind in stream.steps():
            cluster.advance(now)
            if kind == "first" and hour in ACTIONS:  # at once: the leader is at work on what is due
                cluster.act(*ACTIONS[hour], stream.rng)
            expect.snapshot(now)
            for message in stream.messages(previous, now, kind):
                value = message.value()
                producer.produce(settings.topic_updates, value, key=message.key, timestamp=message.kafka_ts)
                for event in message.events:
                    expect.apply(event, now, value)
            assert producer.flush(30) == 0
            cluster.wait_applied()
            previous = now
        streamed = time.monotonic() - started
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


def check_records(records: list[Any], expect: Expect, client: redis.Redis, settings: Settings) -> None:
    by_key: dict[str, list[Any]] = {}
    for msg in records:
        by_key.setdefault(msg.key().decode(), []).append(msg)
    twice = {k: len(v) for k, v in by_key.items() if len(v) > 1}
    assert not twice, f"results sent more than once: {twice}"
    assert not [k for k in by_key if k.startswith(f"{PLAIN}|")], "a type without period_results emitted"
    assert {k.split("|")[1] for k in by_key} <= set(DECLARED)
    missing, extra = sorted(set(expect.due) - set(by_key)), sorted(set(by_key) - set(expect.due))
    assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    assert len(by_key) > 300
    windows = {w: sum(1 for k in by_key if k.split("|")[1] == w) for w in DECLARED}
    assert windows["day"] >= 3 * len(GIFT), windows
    final_seq = {board: state.seq for board, state in expect.periods.boards.items()}
    for key, (msg,) in sorted(by_key.items()):
        body = orjson.loads(msg.value())
        seq = body.pop("seq")
        board = body["board"]
        assert isinstance(seq, int) and expect.last_seq[key] <= seq <= final_seq[board], (key, seq)
        want = expect.result(key)
        assert body == want, diagnose(key, body, expect, client, settings.key_prefix)
        instance = f"{want['window']}:{want['period']}"
        marker = cast(bytes | None, client.get(f"{settings.key_prefix}{{{board}}}:rp:{instance}"))
        assert marker is not None, key
        state, partition, offset, marked_seq, _ = marker.decode().split(":")
        sent = (state, int(partition), int(offset), int(marked_seq))
        assert sent == ("sent", msg.partition(), msg.offset(), seq), (key, marker)


def check_strikes(records: list[Any], strikes: list[Strike]) -> tuple[int, int]:
    """The results a struck leader left `sending`: committed by it (its record is older than the
    strike) if it had marked one of its transaction sent already, and then found by the successor,
    not sent again; else either (committed just before the strike, or aborted and sent again).
    Returns how many were found and how many sent again."""
    stamps = {msg.key().decode(): msg.timestamp()[1] for msg in records}
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


def check_totals(expect: Expect, client: redis.Redis, settings: Settings) -> None:
    """total counts every event, late ones too."""
    for board, state in expect.periods.boards.items():
        stored = read_general(client, f"{settings.key_prefix}{{{board}}}", "total", asc=False, tie="first")
        want = {member: (float(score), tie) for member, (score, tie) in state.instances["total"].items()}
        assert stored == want, board


def diagnose(key: str, body: dict[str, Any], expect: Expect, client: redis.Redis, prefix: str) -> str:
    """For a result that differs from the model's: the period in Redis (a calendar one) and the
    events of the members in question, with the clock when each was applied."""
    board, window, period = key.split("|")
    want = expect.result(key)
    members = {item["member"] for item in body["top"]} ^ {item["member"] for item in want["top"]}
    empty: dict[str, Any] = {}
    for got, wanted in itertools.zip_longest(body["top"], want["top"], fillvalue=empty):
        if got != wanted:
            members |= {item["member"] for item in (got, wanted) if item}
    lines = [f"{key}: got {body}", f"{key}: the model's {want}"]
    if window == "last_3h":
        hours = expect.rolling.buckets["h"]
        low, high = hours[hours.find(period) - 2].start, hours[hours.find(period)].end
    else:
        span = expect.span(window, period)
        low, high = span.start, span.end
        stored = read_general(client, f"{prefix}{{{board}}}", f"{window}:{period}", asc=False, tie="first")
        lines.append(f"in Redis: {stored}")
    for now, seq, event in expect.log:
        if event["board"] == board and event["member"] in members:
            where = "in" if low <= event["ts"] < high else "out"
            lines.append(f"applied at clock {now} (seq {seq}), ts {where}side the period: {event}")
    return "\n".join(lines)
