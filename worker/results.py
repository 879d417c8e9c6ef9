"""Emits each closed period's result to rank_period_closed exactly once (docs/period-results.md).

Who: one worker at a time, the holder of the lease `{results}:emitter` (renewed every pass, so a
dead holder's lapses within LEASE_MS). It produces with one transactional id for every holder,
`<group>-results`: a new holder's init_transactions fences the previous one (a zombie that still
believes it holds the lease can no longer commit) and aborts whatever transaction it left open.
The lease only keeps the others idle; correctness rests on that fence and on the marker below.

What: `{results}:due` names every period whose result is due, and when (worker/apply.py adds each
period of a declared window an event counts in). For each one due, in order:
 1. seal it (its marker `<board>:rp:<period>`, in the board's slot; periodmark.lua): apply.lua
    leaves a sealed period alone, so what is read next is final (a sharded board: each shard's
    marker, the first shard's last; the first shard's carries the steps below);
 2. read its top and member count, a page per call (common/results.py: none blocks Redis 1 ms);
 3. note the partition's end offset in the marker (`sending:<p>:<offset>`), produce the record in
    a transaction and commit it;
 4. mark it `sent` and drop it from the due set.
A holder that finds `sending` (its predecessor died between 3 and 4) reads that partition from the
noted offset, read_committed, after its own init_transactions fenced the predecessor: if the key
is there, the result went out; if not, it did not (an aborted record is never read) and it is sent
now, under the same noted offset: a noted offset never moves, so whoever checks the log later still
starts before every attempt. Every marker move is a compare-and-set, and a period leaves the due
set only once its marker says `sent`. So never twice (a key's one committed record is found or
made, once) and never zero (a period stays due until its commit is marked, and the lease passes on
when its holder dies). A period that expired before anyone sent its result is logged and counted
(only a worker outage longer than its retention does that). A period this worker can't emit (its
config does not declare it, or Kafka refuses its record) is retried alone a minute later."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import orjson
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from common.boards import BoardsConfig, BoardType, Window, split_board
from common.cache_records import partition_for
from common.clock import Clock
from common.errors import InfrastructureError
from common.league_results import season_end
from common.periods import Period, expire_at_ms, parse_period
from common.results import MAX_RESULT_BYTES, read_result, split_result_key
from common.store import lease, periodmark
from common.store.encoding import text
from common.store.keys import BoardKeys, results_due, results_emitter, window_instance
from common.store.shards import shard_names
from common.store.topology import Store
from common.windows import SEASON_WINDOW, parse_window
from worker.faults import is_infrastructure
from worker.metrics import WorkerMetrics
from worker.passes import PassThread

_log = logging.getLogger(__name__)
LEASE_MS = 15_000
BATCH = 100  # due periods read per pass: at most this many records per transaction
KAFKA_TIMEOUT_S = 30.0
RETRY_MS = 60_000  # a period this worker can't emit now is due again this much later
UNDECLARED_MS = 600_000  # and one its config does not declare
FORGET_MS = 7 * 86_400_000  # dropped once its period ended this long ago


@dataclass(frozen=True, slots=True)
class Due:
    """A due period, resolved against the config."""

    key: str  # `<board>|<window>|<period>`
    board_type: BoardType
    keys: BoardKeys  # where its marker is: the board's, or a sharded board's first shard's
    window: Window
    period: Period
    expire_ms: int
    others: tuple[BoardKeys, ...] = ()  # a sharded board's other shards: sealed before the first
    league: bool = False  # a league's season: its divisions' records (common/league_results.py)

    @property
    def instance(self) -> str:
        return window_instance(self.window.name, self.period.id)


@dataclass(slots=True)
class _Pending:
    """A sealed period in this pass' transaction: its record, or a league season's records."""

    due: Due
    mark: periodmark.Mark  # its marker once `sending`
    seq: int  # the board's, as read
    members: int
    records: list[tuple[str, bytes]]  # (key, value), all to one partition
    partition: int
    offset: int = -1  # the first record's, once delivered

    @property
    def size(self) -> int:
        return sum(len(value) for _, value in self.records)


class ResultEmitter:
    def __init__(
        self,
        client: Store,
        boards: BoardsConfig,
        *,
        prefix: str,
        topic: str,
        owner: str,
        producer: Callable[[], Producer],
        reader: Callable[[], Consumer],
        clock: Clock,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._client = client
        self._boards = boards
        self._prefix = prefix
        self._topic = topic
        self._owner = owner  # the lease's holder name (the worker's transactional id)
        self._make_producer = producer  # transactional, `<group>-results`
        self._make_reader = reader  # read_committed, partition EOF on, no group commits
        self._clock = clock
        self.metrics = metrics
        self._producer: Producer | None = None
        self._reader: Consumer | None = None
        self._partitions = 0
        self.sent = 0
        self.settled = 0  # due periods dropped from the due set
        self._warned: set[str] = set()  # undeclared due periods already logged

    @property
    def leading(self) -> bool:
        return self._producer is not None

    def step(self) -> int:
        """One pass: hold the lease, then emit what is due, in one transaction per up to BATCH
        periods (MAX_RESULT_BYTES of records). Returns how many due periods it settled (sent,
        found sent, or dropped): BATCH means more may be waiting."""
        if not self._lead():
            return 0
        now = self._clock()
        due: list[bytes] = self._client.zrangebyscore(
            results_due(self._prefix), "-inf", now, start=0, num=BATCH
        )  # type: ignore[assignment]
        settled = self.settled
        batch: list[_Pending] = []
        ends: dict[int, int] = {}  # partition -> its end offset, asked once per transaction
        for raw in due:
            pending = self._isolated(text(raw), now, ends)
            if pending is not None:
                batch.append(pending)
            if sum(p.size for p in batch) >= MAX_RESULT_BYTES:
                self._commit(batch)
                batch, ends = [], {}
        if batch:
            self._commit(batch)
        return self.settled - settled

    def emit(self, key: str, now: int) -> int:
        """Steps 1-4 for one due period; 1 if this call sent its record."""
        pending = self._prepare(key, now, {})
        if pending is None:
            return 0
        self._commit([pending])
        return 1

    def close(self) -> None:
        """Give the lease back (the next holder's init_transactions would fence us anyway)."""
        if self._producer is not None:
            self._drop()
            lease.release(self._client, results_emitter(self._prefix), self._owner)

    def _drop(self) -> None:
        self._producer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _lead(self) -> bool:
        """Take or renew the lease; on taking it, fence every previous holder's producer."""
        if not lease.hold(self._client, results_emitter(self._prefix), self._owner, LEASE_MS):
            self._drop()
            return False
        if self._producer is None:
            try:
                self._start()
            except BaseException:  # a worker that can't emit must not keep the others idle
                lease.release(self._client, results_emitter(self._prefix), self._owner)
                raise
        return True

    def _start(self) -> None:
        producer = self._make_producer()
        producer.init_transactions(KAFKA_TIMEOUT_S)
        topic = producer.list_topics(self._topic, timeout=KAFKA_TIMEOUT_S).topics.get(self._topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise InfrastructureError(f"topic {self._topic} is missing: run `rankstream topics`")
        self._partitions = len(topic.partitions)
        self._reader = self._make_reader()
        self._producer = producer
        _log.info("emitting period results", extra={"topic": self._topic})

    def resolve(self, key: str) -> Due | None:
        """The due period named `key`, or None if this worker's config does not emit it."""
        board, window_name, period_id = split_result_key(key)
        parts = split_board(board)
        board_type = None if parts is None else self._boards.type_for(parts[0])
        league = board_type is not None and board_type.league is not None and window_name == SEASON_WINDOW
        declared = (
            board_type is not None
            and board_type.results is not None
            and window_name in board_type.results.windows
        )
        if board_type is None or not (league or declared):
            return None
        window = board_type.window(window_name)
        tz = self._boards.timezone
        try:
            period = parse_period(window, period_id, tz)
        except ValueError:  # not a period of the window (written by hand?)
            return None
        expire = expire_at_ms(window, period, board_type.retention[window_name], tz)
        lead, *others = (BoardKeys(self._prefix, name) for name in shard_names(board, board_type.shards))
        return Due(key, board_type, lead, window, period, expire, tuple(others), league)

    def _isolated(self, key: str, now: int, ends: dict[int, int]) -> _Pending | None:
        """_prepare, a failure of this period's own (not Redis' nor Kafka's) postponed alone, so
        one bad period never stalls the others."""
        try:
            return self._prepare(key, now, ends)
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            _log.exception("a period result failed; retried later", extra={"result": key})
            self._postpone(key, now)
            return None

    def _prepare(self, key: str, now: int, ends: dict[int, int]) -> _Pending | None:
        """Steps 1 and 2 for one due period, and the first half of 3 (its marker says `sending`):
        what to produce, or None if it is settled already (or moved by another holder)."""
        due = self.resolve(key)
        if due is None:
            self._undeclared(key, now)
            return None
        if now >= due.expire_ms:
            self._expired(due)
            return None
        for keys in due.others:  # a sharded board: every shard sealed before the first says so
            periodmark.seal(self._client, keys, due.instance, due.expire_ms)
        mark = periodmark.seal(self._client, due.keys, due.instance, due.expire_ms)
        if self._settled(due, mark):
            return None
        read = self._read(due)
        if mark.state == "sending":  # kept: a record since its offset (a live holder's) is found
            return replace(read, mark=mark, partition=mark.partition)
        partition = partition_for(due.key, self._partitions)
        if partition not in ends:
            assert self._reader is not None
            tp = TopicPartition(self._topic, partition)
            ends[partition] = self._reader.get_watermark_offsets(tp, KAFKA_TIMEOUT_S)[1]
        new = periodmark.sending(partition, ends[partition])
        claimed = self._swap(due, mark, new)
        if claimed.raw != new:  # moved by another holder meanwhile: the next pass sees where it is
            return None
        return replace(read, mark=claimed, partition=partition)

    def _read(self, due: Due) -> _Pending:
        """What the sealed period's records say (its marker and partition filled in by the caller)."""
        board = split_result_key(due.key)[0]
        if due.league:
            end = season_end(self._client, self._prefix, due.board_type, board, due.period)
            return _Pending(due, periodmark.parse_mark(""), end.seq, end.members, end.records, -1)
        result = read_result(
            self._client, self._prefix, due.board_type, board, window=due.window, period=due.period
        )
        return _Pending(
            due, periodmark.parse_mark(""), result.seq, result.members, [(due.key, result.encode())], -1
        )

    def _settled(self, due: Due, mark: periodmark.Mark) -> bool:
        """Is the result out already: marked sent, or `sending` and its record in the topic?"""
        if mark.state == "sent":
            self._done(due.key)
            return True
        if mark.state != "sending":
            return False
        found = self._find(due.key, mark.partition, mark.offset)
        if found is None:
            return False
        offset, seq = found
        new = periodmark.sent(mark.partition, offset, seq, self._clock())
        if self._swap(due, mark, new).raw == new:
            _log.info(
                "period result found sent by a predecessor", extra={"result": due.key, "offset": offset}
            )
            self._count("found")
            self._done(due.key)
        return True

    def _commit(self, batch: list[_Pending]) -> None:
        """The second half of step 3, and step 4: one transaction for the batch's records. If
        Kafka refuses a record, each goes alone, and the one it refuses waits for a later pass."""
        try:
            self._transaction(batch)
        except (KafkaException, BufferError) as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if (err is not None and err.fatal()) or not self._abort():
                self._drop()  # fenced, or in doubt: a fresh producer (and fence) next pass
                raise
            if len(batch) == 1:  # this record alone: it waits, the others go on
                _log.error("Kafka refused a period result; retried later",
                           extra={"result": batch[0].due.key, "error": repr(exc)})  # fmt: skip
                self._postpone(batch[0].due.key, self._clock())
                return
            for pending in batch:
                self._commit([pending])
            return
        emitted = self._clock()
        for p in batch:
            done = periodmark.sent(p.partition, max(p.offset, p.mark.offset), p.seq, emitted)
            if self._swap(p.due, p.mark, done).raw != done:
                # moved meanwhile (a successor found this record and marked it sent, or a holder
                # fenced since); a later pass checks the log from the noted offset
                continue
            self._done(p.due.key)
            self._count("sent")
            self.sent += 1
            _log.info("period result sent", extra={"result": p.due.key, "members": p.members,
                                                   "records": len(p.records)})  # fmt: skip

    def _abort(self) -> bool:
        """Abort the open transaction (none committed: its records are never read); False if
        that failed too (the next producer's init_transactions settles it)."""
        producer = self._producer
        if producer is None:
            return False
        try:
            producer.abort_transaction(KAFKA_TIMEOUT_S)
        except KafkaException:
            return False
        return True

    def _transaction(self, batch: list[_Pending]) -> None:
        producer = self._producer
        assert producer is not None
        if not lease.hold(self._client, results_emitter(self._prefix), self._owner, LEASE_MS):
            self._drop()
            raise InfrastructureError("the results lease passed to another worker mid-pass")

        def delivered(pending: _Pending) -> Callable[[KafkaError | None, Message], None]:
            def report(err: KafkaError | None, msg: Message) -> None:
                if err is None and (pending.offset < 0 or (msg.offset() or 0) < pending.offset):
                    pending.offset = msg.offset() or 0  # the first record's

            return report

        producer.begin_transaction()
        for p in batch:
            report = delivered(p)
            for key, value in p.records:
                producer.produce(self._topic, value, key.encode(), p.partition, on_delivery=report)
                producer.poll(0)  # a league season's many records: deliveries served as they come
        producer.commit_transaction(KAFKA_TIMEOUT_S)

    def _swap(self, due: Due, mark: periodmark.Mark, new: str) -> periodmark.Mark:
        return periodmark.swap(self._client, due.keys, due.instance, mark, new, expire_ms=due.expire_ms)

    def _find(self, key: str, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, seq) of the committed record of `key` (or of a league season's record:
        `key|<division>`; one is there if all are) at or after `offset`, if any."""
        reader = self._reader
        assert reader is not None
        tp = TopicPartition(self._topic, partition)
        _, end = reader.get_watermark_offsets(tp, KAFKA_TIMEOUT_S)
        if offset >= end:
            return None
        reader.assign([TopicPartition(self._topic, partition, offset)])
        try:
            wanted, division = key.encode(), key.encode() + b"|"
            while True:
                msg = reader.poll(KAFKA_TIMEOUT_S)
                if msg is None:
                    raise InfrastructureError(f"reading {self._topic} [{partition}] timed out")
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return None
                    raise KafkaException(err)
                found = msg.key() or b""
                if found == wanted or found.startswith(division):
                    value = orjson.loads(msg.value() or b"{}")
                    return msg.offset() or 0, int(value.get("seq", 0) if isinstance(value, dict) else 0)
        finally:
            reader.unassign()

    def _expired(self, due: Due) -> None:
        """The period expired (retention) before its result was settled: every worker was down
        that long. Its marker goes with it: logged and counted, never sent."""
        if periodmark.read_mark(self._client, due.keys, due.instance).state == "sent":
            self._done(due.key)  # sent, its settling cut short: nothing lost
            return
        _log.error("a period expired before its result was sent (its retention is shorter than the "
                   "workers' outage): no record", extra={"result": due.key})  # fmt: skip
        self._count("expired")
        self._done(due.key)

    def _undeclared(self, key: str, now: int) -> None:
        """A due period this worker's config does not emit: another worker's does (a rolling
        deploy under way), or none does any more. It waits UNDECLARED_MS at a time for a worker
        that emits it, until its period ended FORGET_MS ago (by its window's name alone) or at
        once if its name names no period without the config (a season): then it is dropped."""
        _, window_name, period_id = split_result_key(key)
        try:
            ended = parse_period(parse_window(window_name), period_id, self._boards.timezone).end_ms
        except ValueError:
            ended = 0
        if now - ended > FORGET_MS:
            _log.warning("a due result no worker's config emits: dropped", extra={"result": key})
            self._done(key)
            return
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("a due result this worker's config does not emit: waiting for one that does",
                         extra={"result": key})  # fmt: skip
        self._client.zadd(results_due(self._prefix), {key: now + UNDECLARED_MS}, xx=True)

    def _postpone(self, key: str, now: int) -> None:
        self._client.zadd(results_due(self._prefix), {key: now + RETRY_MS}, xx=True)

    def _done(self, key: str) -> None:
        self._client.zrem(results_due(self._prefix), key)
        self.settled += 1

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.results.labels(outcome=outcome).inc()


class ResultsThread(PassThread):
    """Runs the emitter beside the worker loop: a pass every `interval_s`, the next at once while
    a pass settled a whole BATCH; the lease given back on stop."""

    def __init__(self, emitter: ResultEmitter, interval_s: float = 1.0) -> None:
        self.emitter = emitter

        def failed() -> None:
            if emitter.metrics is not None:
                emitter.metrics.results_failures.inc()

        super().__init__("period-results", lambda: emitter.step() >= BATCH, failed, interval_s)

    def stop(self, timeout: float = 10.0) -> bool:
        stopped = super().stop(timeout)
        if stopped:
            with contextlib.suppress(redis.RedisError):  # else the lease lapses by itself
                self.emitter.close()
        return stopped
