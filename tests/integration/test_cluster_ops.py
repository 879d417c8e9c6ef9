"""Redis Cluster operations under load, on a cluster of the test's own (3 masters, a replica
each). Slots of the test's boards migrate live (MOVED, ASK, TRYAGAIN) while the worker writes and
an API node reads: exact against the oracle model, in Redis and in the API's answers, and no read
fails. A master fails over mid-stream (killed -9 while its replica lacks its last writes, the
replica promoted): with RANKSTREAM_REDIS_WAIT_REPLICAS=1 exact again, without a restart of the
worker or the API; without WAIT the events of those writes are lost, silently."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from redis.crc import key_slot

from api.state import APP_STATE
from common.settings import Settings
from common.store.cluster import ClusterPipe
from common.store.keys import partition_sources
from common.store.topology import Store, connect
from rankstream.cluster import LocalRedisCluster
from tests.conftest import own_topics
from tests.helpers import (
    applied_so_far,
    check_dlq,
    group_offsets,
    kafka_lag,
    running_worker,
    wait_applied_and_committed,
    wait_for,
)
from tests.integration.test_api_oracle import check_board
from tests.integration.test_hot_boards import NodeRunner
from tests.oracle import (
    ASC,
    BOARDS,
    ORACLE_BOARDS_RANGED,
    RANGED_BOARDS,
    WINDOWS,
    Message,
    Model,
    compare_redis,
    generate,
    now_ms,
    run_model,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EVENTS = 40_000
ALL_BOARDS = [*BOARDS, *RANGED_BOARDS]
# boards of every type the worker writes and the API reads while their slots move
MOVED_BOARDS = ["gift:r1", "score:s1", "capped:c1", "ranged:g1", "plain:p1", "misc:x1"]
STILL_BOARDS = ["gift:r0", "score:s0"]  # read all along, wherever they are
REDIRECTS = ("AskError", "TryAgainError", "MovedError")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    """A cluster of this test's own: it is resharded and has masters killed."""
    own = LocalRedisCluster(tmp_path / "cluster")
    try:
        own.start()
        yield own
    finally:
        own.stop()


@pytest.fixture
def cluster_settings(
    make_settings, tmp_path: Path, cluster: LocalRedisCluster, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """Settings on the test's own cluster; more overrides by indirect parametrization."""
    boards = tmp_path / "boards.yaml"
    boards.write_text(ORACLE_BOARDS_RANGED)
    # top_cache_ttl_s=0: no warm cache, so every read of the API goes to the cluster
    settings: Settings = make_settings(
        boards=boards, redis_url=cluster.url, redis_cluster=True, top_cache_ttl_s=0,
        **getattr(request, "param", {}),
    )  # fmt: skip
    with own_topics(settings):
        yield settings


@pytest.fixture
def cclient(cluster_settings: Settings) -> Iterator[Store]:
    client = connect(cluster_settings.redis_url.get_secret_value(), True)
    yield client
    client.close()


def board_slot(board: str) -> int:
    return key_slot(f"{{{board}}}".encode())  # every key of a board carries the tag {board}


def make_stream(seed: int) -> tuple[list[Message], Model]:
    start = now_ms()
    messages = list(generate(seed, EVENTS, start, ALL_BOARDS))
    return messages, run_model(messages, start)


class PacedProducer:
    """Produces the stream evenly over `seconds` in a thread, so the worker writes all along.

    With `gated`, it also never runs ahead of what `release` allowed: a test whose steps take
    longer than planned (a slow SIGTERM) still has the stream going on through every step."""

    CHUNK = 200

    def __init__(
        self, settings: Settings, messages: list[Message], seconds: float, gated: bool = False
    ) -> None:
        self._settings, self._messages, self._seconds = settings, messages, seconds
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._released = threading.Condition()
        self._allowed = 0 if gated else len(messages)
        self._closed = False  # the test's block ended: a gated wait gives up
        self.error: Exception | None = None

    def release(self, fraction: float) -> None:
        """Let the producer go on up to `fraction` of the stream (at its pace)."""
        with self._released:
            self._allowed = max(self._allowed, int(len(self._messages) * fraction))
            self._released.notify_all()

    def _wait_released(self, i: int) -> None:
        with self._released:
            self._released.wait_for(lambda: i < self._allowed or self._closed, timeout=300)
            if i >= self._allowed:
                raise TimeoutError(f"message {i} was never released")

    def _run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self._settings.kafka_bootstrap, "linger.ms": 5,
                                 "enable.idempotence": True})  # fmt: skip
            started, total = time.monotonic(), len(self._messages)
            for i, msg in enumerate(self._messages):
                if i >= self._allowed:
                    producer.poll(0)
                    self._wait_released(i)
                producer.produce(self._settings.topic_updates, msg.value, key=msg.key)
                if i % self.CHUNK == 0:
                    producer.poll(0)
                    time.sleep(max(started + self._seconds * i / total - time.monotonic(), 0))
            assert producer.flush(30) == 0
        except Exception as exc:  # noqa: BLE001 - raised again by join()
            self.error = exc

    def __enter__(self) -> PacedProducer:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error

    def __exit__(self, *exc: object) -> None:
        with self._released:
            self._closed = True
            self._released.notify_all()
        self._thread.join(120)


class Reader:
    """Reads boards through an API node without pause (several requests at once) until stopped;
    tallies every answer and checks each one's shape. Runs on the node's own event loop."""

    def __init__(self, node: NodeRunner, boards: list[str], concurrency: int = 3) -> None:
        self._node, self._boards, self._concurrency = node, boards, concurrency
        self._stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.failures: list[tuple[float, str, int, Any]] = []  # (when, path, status, body) not 200/404
        # per reading loop (each sends a request once the previous one is answered) and board:
        # the highest seq read so far, and reads that saw a lower one (board, seq, highest)
        self.seqs: dict[tuple[int, str], int] = {}
        self.went_back: list[tuple[str, int, int]] = []
        self.last_ok: dict[str, float] = {}  # when each board's top page was last answered
        self._future: Any = None

    def __enter__(self) -> Reader:
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self._node.loop)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._future is not None:
            self._future.result(60)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _run(self) -> None:
        await asyncio.gather(*(self._read(i) for i in range(self._concurrency)))

    async def _get(self, path: str, method: str = "GET", **kwargs: Any) -> tuple[int, Any]:
        http = self._node.client
        assert http is not None
        resp = await http.request(method, path, **kwargs)
        body = await resp.json()
        self.statuses[resp.status] += 1
        missing = resp.status == 404 and body["error"]["code"] == "member_not_found"  # deleted meanwhile
        if resp.status != 200 and not missing:
            self.failures.append((time.monotonic(), path, resp.status, body))
        return resp.status, body

    async def _read(self, worker: int) -> None:
        rng = random.Random(worker)
        while not self._stop.is_set():
            board = rng.choice(self._boards)
            window = rng.choice(["total", *WINDOWS[board.split(":")[0]]])
            base = f"/v1/boards/{board}"
            status, top = await self._get(f"{base}/top?limit=20&window={window}")
            if status != 200:
                continue
            self.last_ok[board] = time.monotonic()
            self._check_page(worker, board, top)
            if not top["items"]:
                continue
            member = rng.choice(top["items"])["member"]
            status, one = await self._get(f"{base}/members/{member}?window={window}")
            if status == 200:
                assert one["member"] == member and one["rank"] >= 1, one
            status, around = await self._get(f"{base}/members/{member}/around?n=3&window={window}")
            if status == 200:
                self._check_page(worker, board, around)
            status, count = await self._get(f"{base}/count?min=-1000&max=1000000&window={window}")
            if status == 200:
                assert isinstance(count["count"], int), count
            asked = {"members": [member, "ghost"]}
            status, lookup = await self._get(f"{base}/members/lookup?window={window}", "POST", json=asked)
            if status == 200:
                assert [i["member"] for i in lookup["items"]] == [member, "ghost"], lookup

    def _check_page(self, worker: int, board: str, body: dict[str, Any]) -> None:
        """Ranks consecutive, scores in the board's order; a seq lower than one this loop read
        before is noted (`went_back`)."""
        items = body["items"]
        ranks = [i["rank"] for i in items]
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))) if ranks else True, body
        scores = [float(i["score"]) for i in items]
        ascending = board.split(":", maxsplit=1)[0] in ASC
        assert scores == sorted(scores, reverse=not ascending), body
        assert body["source"] == "redis"
        seq, highest = int(body["seq"]), self.seqs.get((worker, board), 0)
        if seq < highest:
            self.went_back.append((board, seq, highest))
        self.seqs[worker, board] = max(seq, highest)


def spy_on_redirects(pipe: ClusterPipe) -> Counter[str]:
    """Counts the errors the API's cluster client met and followed (MovedError, AskError,
    TryAgainError, ConnectionError...), by wrapping its reply handler on this instance."""
    seen: Counter[str] = Counter()
    handle = pipe._done

    def counting(inner: asyncio.Future[Any], *rest: Any) -> None:
        if not inner.cancelled() and (exc := inner.exception()) is not None:
            seen[type(exc).__name__] += 1
        handle(inner, *rest)

    pipe._done = counting  # type: ignore[method-assign,assignment] # a spy on this one instance
    return seen


def error_stats(cluster: LocalRedisCluster) -> Counter[str]:
    """What the masters refused, summed: their error replies by code (INFO errorstats: ASK,
    MOVED, TRYAGAIN...) and the script calls refused (`evalsha`, `evalsha_ro`: sent where the slot was not
    served, or was moving)."""
    total: Counter[str] = Counter()
    for port in cluster.master_ports():
        client = cluster.client(port)
        for name, value in client.info("errorstats").items():
            total[name.removeprefix("errorstat_")] += int(value["count"])
        stats = client.info("commandstats")
        for command in ("cmdstat_evalsha", "cmdstat_evalsha_ro"):  # the worker's, the reads'
            total["evalsha"] += int(stats.get(command, {}).get("rejected_calls", 0))
    return total


def check_answers(node: NodeRunner, model: Model, boards: list[str]) -> int:
    """Every read route of `boards` equals the model (tests/integration/test_api_oracle.py)."""

    async def go() -> int:
        assert node.client is not None
        rng = random.Random(9)
        return sum([await check_board(node.client, model, board, rng) for board in boards])

    return asyncio.run_coroutine_threadsafe(go(), node.loop).result(120)


@dataclass(frozen=True)
class Reshard:
    """`redis-cli --cluster reshard` of the lowest `count` slots of master `source` (what that
    command moves) to master `to`: the fewest that hold two of the test's boards."""

    source: int
    to: int
    count: int
    boards: list[str]

    @classmethod
    def plan(cls, cluster: LocalRedisCluster, candidates: list[str]) -> Reshard:
        masters = cluster.master_ports()
        source = cluster.owner(board_slot(candidates[0]))
        slots = cluster.slots_of(source)
        index = {slot: i for i, slot in enumerate(slots)}
        held = sorted((index[board_slot(b)], b) for b in candidates if board_slot(b) in index)[:2]
        to = masters[(masters.index(source) + 1) % len(masters)]
        return cls(source, to, held[-1][0] + 1, [b for _, b in held])

    def run(self, cluster: LocalRedisCluster) -> None:
        cluster.reshard(self.source, self.to, self.count)
        assert [cluster.owner(board_slot(b)) for b in self.boards] == [self.to] * len(self.boards)


def test_live_reshard_while_writing_and_reading_ends_exact(
    cluster, cluster_settings, cclient, consumer_factory
):
    """Slots of the test's boards move to other masters while the worker applies the stream and
    an API node reads those boards all along; at the end Redis, the dead-letter topic and the
    API's answers equal the model, every read was answered 200 (or 404 for a member deleted
    meanwhile), and both the worker's and the API's clients really met ASK, TRYAGAIN and MOVED.

    redis-cli's reshard moves ten keys a MIGRATE without a pause; the moves by hand go slowly
    (two keys, then 150 ms), so a board's keys stay split for about a second: a read of keys on
    both sides meets ASK then TRYAGAIN again and again, and waits that out (within its give-up
    time, common/store/cluster.py) rather than failing."""
    settings = cluster_settings
    messages, model = make_stream(seed=41)
    target = sum(model.seq.values())
    masters = cluster.master_ports()
    before = error_stats(cluster)
    moves: list[tuple[str, int, int, int]] = []  # (board, from, to, keys moved)
    reshard = Reshard.plan(cluster, [b for b in ALL_BOARDS if b not in MOVED_BOARDS])
    with (
        running_worker(settings) as worker,
        NodeRunner(settings) as node,
        PacedProducer(settings, messages, seconds=20, gated=True) as producer,
    ):
        producer.release(0.5)  # the rest once the moves are done: they happen mid-stream however slow
        redirects = spy_on_redirects(node.call(lambda app: app[APP_STATE].redis))
        wait_for(lambda: node.get("/readyz")[0] == 200, 30, "the API node ready")
        with Reader(node, [*MOVED_BOARDS, *reshard.boards, *STILL_BOARDS]) as reader:
            wait_for(lambda: applied_so_far(cclient, settings) > target * 0.1, 60, "10% applied")
            reshard.run(cluster)  # redis-cli's pace: ten keys a MIGRATE, no pause
            # each board's slot to the next master, a few keys at a time: while a slot is split the
            # worker's scripts and the API's reads meet ASK (keys gone) and TRYAGAIN (keys split)
            for board in MOVED_BOARDS:
                slot = board_slot(board)
                source = cluster.owner(slot)
                to = masters[(masters.index(source) + 1) % len(masters)]
                moved = cluster.migrate_slot(slot, to, batch=2, pause_s=0.15)
                moves.append((board, source, to, moved))
                assert cluster.owner(slot) == to
            producer.release(1.0)
            producer.join()
            wait_for(lambda: applied_so_far(cclient, settings) >= target, 120, "every event applied")
        cluster.wait_ok()
        checked = check_answers(node, model, [*MOVED_BOARDS, *reshard.boards])
        retries = worker.metrics.registry.get_sample_value("rankstream_worker_batch_retries_total")
    stats = error_stats(cluster) - before
    print(f"\nslot moves {moves}, {reshard}\nerror replies of the masters {dict(stats)}"
          f"\nthe API's client followed {dict(redirects)}; the worker retried {retries} batches"
          f"\nreads {dict(reader.statuses)}")  # fmt: skip
    compare_redis(cclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
    assert reader.failures == []
    # one master serves a board's keys at any time, wherever they are moving: no read goes back
    assert reader.went_back == []
    assert sum(reader.statuses.values()) > 1000
    assert checked > 500
    assert all(moved > 0 for *_, moved in moves)
    assert redirects["AskError"] > 0 and redirects["TryAgainError"] > 0 and redirects["MovedError"] > 0
    # the worker's scripts met them too: more script calls were refused than the API's client
    # followed replies of any command (the test's own client sends no script)
    assert stats["evalsha"] > sum(redirects[e] for e in REDIRECTS)


def promoted(cluster: LocalRedisCluster, replica: int) -> bool:
    return bool(cluster.client(replica).info("replication")["role"] == "master")


def board_seqs(client: Any, settings: Settings, boards: list[str]) -> dict[str, int]:
    """Each board's seq as `client` (one node's, or the cluster's) has it."""
    return {b: int(client.get(f"{settings.key_prefix}{{{b}}}:seq") or 0) for b in boards}


@dataclass
class Failover:
    """What a failover under load did: the boards of the master killed, how many applied events
    (seq steps) its promoted replica lacked, when it was killed and when the replica took over."""

    victim: int
    replica: int
    boards: list[str]
    lacked: int = 0
    killed_at: float = 0.0
    promoted_at: float = 0.0


def fail_over(cluster: LocalRedisCluster, settings: Settings, victim: int, stall_s: float = 1.5) -> Failover:
    """The worst case of asynchronous replication, made certain: the victim's replica is cut off
    (frozen by SIGSTOP, its replication link closed by the victim, so what the victim writes
    next reaches no replica) while the worker goes on writing to the victim for `stall_s`; then
    the victim is killed -9 and the replica thawed: promoted, it lacks every write of those
    seconds."""
    replica = cluster.replica_of(victim)
    boards = [b for b in ALL_BOARDS if cluster.owner(board_slot(b)) == victim]
    seen = Failover(victim, replica, boards)
    cluster.freeze(replica)
    try:
        # closed from the victim's side: the frozen replica can't reconnect, and what is already in
        # its socket buffer (sent before) is all it will get
        cluster.client(victim).client_kill_filter(_type="replica")
        # read after the link closed: a write seen before might still be in that buffer
        before = board_seqs(cluster.client(victim), settings, boards)
        time.sleep(stall_s)
        # with WAIT the worker writes in bursts (a batch, its WAIT timing out, a back-off, the
        # batch again with what came since): wait for one past the stall if none fell inside it
        deadline = time.monotonic() + 20
        while (held := board_seqs(cluster.client(victim), settings, boards)) == before:
            assert time.monotonic() < deadline, (
                "the worker wrote nothing to the victim while its replica was frozen"
            )
            time.sleep(0.1)
        cluster.kill(victim)
        seen.killed_at = time.monotonic()
    finally:
        cluster.thaw(replica)
    wait_for(lambda: promoted(cluster, replica), 30, "the replica promoted")
    seen.promoted_at = time.monotonic()
    after = board_seqs(cluster.client(replica), settings, boards)
    seen.lacked = sum(held[b] - after[b] for b in boards)
    assert seen.lacked > 0, "the promoted replica had every write: nothing was at risk"
    cluster.wait_ok()
    return seen


def replicates(cluster: LocalRedisCluster, node: int, master: int) -> bool:
    """`node` is a replica of `master`, in sync."""
    info = cluster.client(node).info("replication")
    return bool(info.get("master_port") == master and info.get("master_link_status") == "up")


def guard_owner(cluster: LocalRedisCluster, settings: Settings) -> int:
    """The master holding the worker's record of applied offsets (worker/sources.py)."""
    key = partition_sources(settings.key_prefix, settings.worker_group, settings.topic_updates)
    return cluster.owner(key_slot(key.encode()))


@pytest.mark.parametrize("cluster_settings", [{"redis_wait_replicas": 1}], indirect=True)
def test_failover_mid_stream_with_wait_loses_nothing(cluster, cluster_settings, cclient, consumer_factory):
    """RANKSTREAM_REDIS_WAIT_REPLICAS=1: a master fails over mid-stream, its replica promoted
    lacking its last seconds of writes (fail_over). The worker and the API node run on without a
    restart; the killed node comes back as a replica of its successor. Nothing is lost: the worker
    commits no batch before a replica holds it, so what the promoted replica lacks was never
    committed, and is redelivered and applied (fenced: nothing counts twice). The master chosen
    also holds the worker's record of applied offsets, which fails over under the same rule.

    The price: with one replica per master, the promoted master has none until the killed node is
    back, and meanwhile the worker commits nothing (it applies, fails the WAIT, retries). Reads of
    the victim's boards may fail (503) from the stall until the replica takes over, and only then;
    a read may see a board's seq go back across the failover (it read writes no replica held yet,
    redone since)."""
    settings = cluster_settings
    messages, model = make_stream(seed=43)
    target = sum(model.seq.values())
    victim = guard_owner(cluster, settings)
    with (
        running_worker(settings) as worker,
        NodeRunner(settings) as node,
        PacedProducer(settings, messages, seconds=20, gated=True) as producer,
    ):
        producer.release(0.5)  # the rest once the killed node is back: the failover is mid-stream
        wait_for(lambda: node.get("/readyz")[0] == 200, 30, "the API node ready")
        boards = [b for b in ALL_BOARDS if cluster.owner(board_slot(b)) == victim][:4]
        with Reader(node, [*boards, *STILL_BOARDS]) as reader:
            wait_for(lambda: applied_so_far(cclient, settings) > target * 0.25, 60, "25% applied")
            stalled_at = time.monotonic()
            failover = fail_over(cluster, settings, victim)
            # the promoted master has no replica: the worker can't have a batch confirmed, so it
            # commits nothing (and retries) until the killed node is back as that replica
            alone = group_offsets(settings)[0]
            time.sleep(2)
            assert group_offsets(settings)[0] == alone, "a batch was committed that no replica held"
            cluster.restart(victim)
            wait_for(lambda: replicates(cluster, victim, failover.replica), 30, "the killed node a replica")
            cluster.wait_ok()
            producer.release(1.0)
            producer.join()
            wait_applied_and_committed(cclient, settings, target, timeout=120)
            settled_at = time.monotonic()
            read_boards = [*boards, *STILL_BOARDS]
            wait_for(  # every board answers again after the failover
                lambda: all(reader.last_ok.get(b, 0.0) > settled_at for b in read_boards),
                30,
                "every board read",
            )
        status, ready = node.get("/readyz")
        assert status == 200 and ready["redis"] is True
        checked = check_answers(node, model, boards)
        retries = worker.metrics.registry.get_sample_value("rankstream_worker_batch_retries_total")
    print(f"\n{failover}: promoted {failover.promoted_at - failover.killed_at:.1f}s after the kill; "
          f"the worker retried {retries} batches"
          f"\nreads {dict(reader.statuses)}; seq went back {len(reader.went_back)} times")  # fmt: skip
    compare_redis(cclient, settings.key_prefix, model)
    check_dlq(consumer_factory, settings, model, exact=True)
    assert checked > 300
    # unavailable from the stall until the replica took over (plus the client's map reload), never after
    answers = {(status, body["error"]["code"]) for _, _, status, body in reader.failures}
    assert answers <= {(503, "redis_unavailable")}
    assert all(stalled_at <= at <= failover.promoted_at + 3 for at, *_ in reader.failures), reader.failures


@pytest.mark.parametrize("cluster_settings", [{"redis_wait_replicas": 0}], indirect=True)
def test_failover_without_wait_loses_the_writes_no_replica_had(cluster, cluster_settings, cclient):
    """The same failover without WAIT (the default): the worker committed the batches whose writes
    only the killed master held, so the promoted replica lacks events nobody will redeliver. When
    the record of applied offsets survives (here: it is on another master) nothing notices: the
    loss is silent. What this test pins down is the documented risk RANKSTREAM_REDIS_WAIT_REPLICAS
    closes; were the record on the victim, the worker would block those partitions instead
    (redis_behind, worker/sources.py)."""
    settings = cluster_settings
    messages, model = make_stream(seed=44)
    target = sum(model.seq.values())
    guard = guard_owner(cluster, settings)
    victim = next(m for m in cluster.master_ports() if m != guard)
    with (
        running_worker(settings) as worker,
        PacedProducer(settings, messages, seconds=15, gated=True) as producer,
    ):
        producer.release(0.5)  # the rest after the failover, however long it takes
        wait_for(lambda: applied_so_far(cclient, settings) > target * 0.25, 60, "25% applied")
        failover = fail_over(cluster, settings, victim)
        producer.release(1.0)
        producer.join()
        wait_for(lambda: kafka_lag(settings) == 0, 90, "every message committed")
        time.sleep(1)
        assert worker.guard is not None and worker.guard.blocked == {}
    got = board_seqs(cclient, settings, ALL_BOARDS)
    lost = {b: model.seq.get(b, 0) - got[b] for b in ALL_BOARDS if got[b] != model.seq.get(b, 0)}
    print(f"\n{failover}\nlost events per board {lost}")
    assert lost, "nothing was lost"
    assert set(lost) <= set(failover.boards) and all(n > 0 for n in lost.values())
    assert applied_so_far(cclient, settings) < target
