"""`rankstream dlq replay`: produce selected dead letters to update_rank again, fixed, with their
ids, each exactly once.

1. Register the transactional id `rankstream-dlq-replay.<ledger topic>`. Every replay uses it, so
   this fences any other replay still running: from here on, only this one can commit.
2. Read the whole ledger (ledger.py), read_committed: every replay committed before step 1.
3. Read the dead letters up to the topic's end at the start; plan each (plan.py).
4. Produce each event (keyed by its board, as any producer keys it) and its ledger record in one
   transaction, CHUNK dead letters per transaction; a crash leaves both or neither.

`--dry-run` does 2 and 3, and prints what it would send. Refused dead letters don't stop the
others: each is said in one line on stderr, and the command exits 1 when any was refused."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from confluent_kafka import KafkaError, KafkaException, Producer

from common.boards import load_boards
from common.errors import InfrastructureError
from common.events import ts_ceiling
from common.settings import Settings, env_name
from rankstream.dlq.clients import producer, topic_partitions, unanswered
from rankstream.dlq.fix import load_fix
from rankstream.dlq.ledger import ledger_record, read_ledger
from rankstream.dlq.plan import Leave, Send, plan
from rankstream.dlq.records import iso_ms, printable
from rankstream.dlq.report import dead_letters

CHUNK = 100  # dead letters per transaction
INIT_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
COMMIT_BUDGET_S = 60.0
HEADER_REPLAYED_FROM = "rankstream.replayed_from"  # on the event sent: <dlq topic>:<partition>:<offset>


@dataclass(frozen=True, slots=True)
class Options:
    reason: str | None = None
    fix_path: Path | None = None
    dry_run: bool = False
    force: bool = False
    limit: int | None = None


def transactional_id(settings: Settings) -> str:
    return f"rankstream-dlq-replay.{settings.topic_dlq_replayed}"


def replay(settings: Settings, options: Options, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Replay what `options` select; the exit status (1 if any dead letter was refused)."""
    fix = None if options.fix_path is None else load_fix(options.fix_path)
    boards = load_boards(settings.boards)
    report = _Report(settings, options, out, err)
    sender = None if options.dry_run else Sender(settings, options)
    try:
        ledger = read_ledger(settings)
        max_ts = ts_ceiling(settings.max_future_skew_s)
        with closing(dead_letters(settings, options.reason)) as letters:
            for letter in letters:
                if options.limit is not None and report.sent >= options.limit:
                    break
                step = plan(
                    letter, ledger=ledger, fix=fix, boards=boards, max_ts_ms=max_ts, force=options.force
                )
                report.add(step)
                if report.held_sends == CHUNK:
                    report.flush(sender)
        report.flush(sender)
    except Exception:
        if report.counts:  # what was replayed before it stays replayed
            report.say(f"stopped: {report.summary()}")
        raise
    finally:
        if sender is not None:
            sender.close()
    report.say(report.summary())
    return 1 if report.counts["refused"] else 0


class _Report:
    """One line per dead letter, in their order: those of a chunk once its transaction committed
    (a refusal on stderr), and the counts."""

    def __init__(self, settings: Settings, options: Options, out: TextIO, err: TextIO) -> None:
        self._settings, self._options, self._out, self._err = settings, options, out, err
        self.counts: Counter[str] = Counter()
        self._held: list[Send | Leave] = []  # in order, until the chunk's transaction commits
        self.held_sends = 0

    @property
    def sent(self) -> int:
        """Replayed so far, the chunk in the making included (what --limit counts)."""
        return self.counts["replayed"] + self.held_sends

    def add(self, step: Send | Leave) -> None:
        self._held.append(step)
        if isinstance(step, Send):
            self.held_sends += 1
        if self._options.dry_run or not self.held_sends:  # nothing to wait for
            self.flush(None)

    def flush(self, sender: Sender | None) -> None:
        """Send the held chunk (unless a dry run), then say each of its lines: a Send's only once
        its transaction committed, a Leave's in any case."""
        held, self._held, self.held_sends = self._held, [], 0
        sends = [step for step in held if isinstance(step, Send)]
        committed = False
        try:
            if sender is not None and sends:
                sender.send(sends)
            committed = True
        finally:
            for step in held:
                if committed or isinstance(step, Leave):
                    self._say_step(step)

    def _say_step(self, step: Send | Leave) -> None:
        what = step.letter.label
        if isinstance(step, Send):
            self.counts["replayed"] += 1
            before = (
                ""
                if step.before is None
                else f" again (--force; replayed before at {iso_ms(step.before.replayed_at_ms)})"
            )
            sent = (
                f"{what}{before} -> {self._settings.topic_updates} key {printable(step.key.decode())}: "
                f"{printable(step.value.decode())}"
            )
            self.say(f"{'would replay' if self._options.dry_run else 'replayed'} {sent}")
            return
        self.counts[step.outcome] += 1
        why = printable(step.why)
        if step.outcome == "refused":
            self.say(f"rankstream: refused {what}: {why}", self._err)
        elif step.outcome == "already":
            self.say(f"already replayed {what}: {why}")
        else:
            self.say(f"skipped {what}: {why}")

    def say(self, line: str, to: TextIO | None = None) -> None:
        print(line, file=to or self._out, flush=True)

    def summary(self) -> str:
        done = "dry run, nothing sent: would replay" if self._options.dry_run else "replayed"
        n = self.counts
        return (
            f"{done} {n['replayed']}, already replayed {n['already']}, skipped {n['skipped']}, "
            f"refused {n['refused']}"
        )


class Sender:
    """The transactional producer: each chunk's events and ledger records commit together."""

    def __init__(self, settings: Settings, options: Options) -> None:
        self._settings = settings
        self._options = options
        self._producer: Producer = producer(
            settings,
            {
                "transactional.id": transactional_id(settings),
                "enable.idempotence": True,
                "acks": "all",
                # a board's events on the partition the Java client and franz-go put them on
                "partitioner": "murmur2_random",
            },
            # an open transaction holds the workers' read_committed reads of the partitions it
            # wrote: a replay that dies is aborted by the broker after this, or by the next replay
            defaults={"linger.ms": 5, "transaction.timeout.ms": 10_000},
        )
        # Kafka answers, and update_rank is there, before the wait for a transaction coordinator
        topic_partitions(self._producer, settings, settings.topic_updates, env_name("topic_updates"))
        self._call("registering the transactional id (init_transactions)", self._producer.init_transactions,
                   INIT_TIMEOUT_S)  # fmt: skip

    def send(self, chunk: list[Send]) -> None:
        """The chunk's events and their ledger records, in one transaction; InfrastructureError
        (nothing of the chunk sent, or its outcome said unknown) if it does not commit."""
        settings, fix = self._settings, self._options.fix_path
        self._call("begin_transaction", self._producer.begin_transaction)
        now = int(time.time() * 1000)
        try:
            for step in chunk:
                where = f"{settings.topic_dlq}:{step.letter.place}".encode()
                self._producer.produce(settings.topic_updates, value=step.value, key=step.key,
                                       headers=[(HEADER_REPLAYED_FROM, where)])  # fmt: skip
                key, value = ledger_record(
                    step.letter, step.event, dlq_topic=settings.topic_dlq, now_ms=now,
                    forced=step.before is not None, fix=None if fix is None else fix.name,
                )  # fmt: skip
                self._producer.produce(settings.topic_dlq_replayed, value=value, key=key)
                self._producer.poll(0)
        except (KafkaException, BufferError) as exc:
            self._abort()
            raise InfrastructureError(
                f"producing failed, none of the last {len(chunk)} sent: {exc}"
            ) from None
        self._commit(chunk)

    def _commit(self, chunk: list[Send]) -> None:
        first, last = chunk[0].letter.place, chunk[-1].letter.place
        give_up = time.monotonic() + COMMIT_BUDGET_S
        while True:
            try:
                self._producer.commit_transaction(CALL_TIMEOUT_S)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and time.monotonic() < give_up:
                    continue
                if error.txn_requires_abort():
                    self._abort()
                    raise InfrastructureError(
                        f"the transaction of dead letters {first}..{last} was aborted, none of them sent: "
                        f"{error.str()}"
                    ) from None
                if error.fatal():  # fenced: another replay registered the same id meanwhile
                    raise InfrastructureError(
                        f"stopped, dead letters {first}..{last} not sent: {error.str()} "
                        "(another `rankstream dlq replay` started meanwhile?)"
                    ) from None
                raise InfrastructureError(
                    f"the transaction of dead letters {first}..{last} did not finish ({error.str()}): each "
                    "event was sent with its ledger record or not at all; run the command again with "
                    "--dry-run to see which"
                ) from None
            else:
                return

    def _abort(self) -> None:
        # failing, the broker aborts it after transaction.timeout.ms, and the next replay's init at once
        with suppress(KafkaException):
            self._producer.abort_transaction(CALL_TIMEOUT_S)

    def _call(self, what: str, call: Callable[..., None], *args: float) -> None:
        try:
            call(*args)
        except KafkaException as exc:
            error = exc.args[0]
            if unanswered(error):
                raise InfrastructureError(
                    f"Kafka at {self._settings.kafka_bootstrap} did not answer ({what}): {error.str()}"
                ) from None
            raise  # refused (an ACL), ...: the command says it as Kafka's refusal

    def close(self) -> None:
        self._producer.flush(CALL_TIMEOUT_S)
