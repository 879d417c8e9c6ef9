"""The producer examples users copy (examples/: Python, Go, Java) on the real broker: each is built
by its own project files, sends one event and one array for three boards, and the API answers
the applied scores. Idempotence is checked where it takes effect, on the broker; a missing
toolchain fails the test with one line saying what to install."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from common.errors import StackError
from common.settings import Settings
from rankstream.stack import cache_dir, ensure_java, ensure_kafka_jars, free_port
from tests.conftest import unique
from tests.helpers import api_env, http_status, running_worker, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BUILT = ROOT / ".stack" / "examples"  # git-ignored; kept across runs
# what each example prints first: the settings in effect, read back from its client where the
# client can tell (kafka-clients' ProducerConfig, franz-go's OptValue)
IN_EFFECT = "producer: enable.idempotence=true acks=all"
SENT = re.compile(r"sent (\S+) to (\S+)\[(\d+)\]@(\d+)")
STATE = re.compile(r"partition=(\d+) producerId=(-?\d+) epoch=(-?\d+) lastSequence=(-?\d+)")


def _tool(name: str, hint: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(hint, pytrace=False)
    return found


def _build(argv: list[str], folder: Path, what: str) -> None:
    proc = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr)[-3000:]
        pytest.fail(f"{what} failed (exit {proc.returncode}): {said}", pytrace=False)


def python_example() -> list[str]:
    """confluent-kafka is the project's own Kafka client: the virtualenv's Python runs it."""
    return [sys.executable, str(EXAMPLES / "python" / "produce.py")]


def go_example() -> list[str]:
    """`go build` of examples/go into .stack/examples (Go's build cache makes a rebuild ~1 s; the
    first one downloads the modules go.sum pins)."""
    folder = EXAMPLES / "go"
    wanted = re.search(r"^go (\d+)\.(\d+)", (folder / "go.mod").read_text(), re.M)
    assert wanted is not None
    hint = f"install Go >= {wanted[1]}.{wanted[2]} to run the Go producer example (examples/go)"
    go = _tool("go", hint)
    # in the module's folder: the version that builds it (an older Go may switch to a newer one)
    proc = subprocess.run([go, "env", "GOVERSION"], cwd=folder, capture_output=True, text=True, check=False)
    found = re.match(r"go(\d+)\.(\d+)", proc.stdout.strip())
    if found is None or (int(found[1]), int(found[2])) < (int(wanted[1]), int(wanted[2])):
        said = (proc.stdout + proc.stderr).strip().splitlines()
        pytest.fail(f"{hint}; found: {said[-1] if said else 'nothing'}", pytrace=False)
    binary = BUILT / "produce-go"
    _build([go, "build", "-buildvcs=false", "-o", str(binary), "."], folder, "go build in examples/go")
    return [str(binary)]


def java_example() -> list[str]:
    """`mvn package` of examples/java (a runnable jar with kafka-clients inside), kept in the
    user cache under the digest of its sources: Maven takes ~10 s even with nothing to do, and
    a fresh clone (CI) would otherwise build it every run."""
    folder = EXAMPLES / "java"
    try:
        java = ensure_java()
    except StackError as exc:
        pytest.fail(
            f"install Java >= 17 to run the Java producer example (examples/java): {exc}", pytrace=False
        )
    mvn = _tool("mvn", "install Maven to build the Java producer example (examples/java)")
    sources = sorted([folder / "pom.xml", *(p for p in (folder / "src").rglob("*") if p.is_file())])
    digest = hashlib.sha256()
    for path in sources:
        digest.update(f"{path.relative_to(folder)}\0".encode() + path.read_bytes() + b"\0")
    jar = cache_dir() / "examples" / f"java-{digest.hexdigest()[:16]}.jar"
    if not jar.exists():
        _build([mvn, "-q", "-B", "-Dstyle.color=never", "package"], folder, "mvn package in examples/java")
        jar.parent.mkdir(parents=True, exist_ok=True)
        partial = jar.with_suffix(f".{os.getpid()}.part")
        shutil.copyfile(folder / "target" / "rankstream-producer.jar", partial)
        partial.replace(jar)  # whole or absent, also for a run stopped mid-copy
    return [java, "-jar", str(jar)]


EXAMPLE_PROGRAMS: dict[str, Callable[[], list[str]]] = {
    "python": python_example,
    "go": go_example,
    "java": java_example,
}


@contextmanager
def api_process(settings: Settings) -> Iterator[str]:
    """A real `rankstream api` process over the test's Redis keys; its base URL once ready."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankstream.cli", "api"], env=api_env(settings, port), cwd=ROOT
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(f"{base}/readyz") == 200, 60, "the API ready")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def top(base: str, board: str) -> list[tuple[str, float, str | None]]:
    """(member, score, meta name) of a board's total window, in rank order; [] before its first event."""
    with urllib.request.urlopen(f"{base}/v1/boards/{board}/top?limit=10", timeout=5) as resp:  # noqa: S310 - loopback
        body = orjson.loads(resp.read())
    return [(i["member"], i["score"], (i.get("meta") or {}).get("name")) for i in body["items"]]


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client (and franz-go) picks for a key: murmur2, as in its
    Utils.murmur2 and BuiltInPartitioner.partitionForKey."""
    m, length = 0x5BD1E995, len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = key[length - length % 4 :]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def partition_count(settings: Settings) -> int:
    topic = settings.topic_updates
    found = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(topic, timeout=30)
    return len(found.topics[topic].partitions)


def producer_states(settings: Settings) -> list[tuple[int, int, int, int]]:
    """(partition, producer id, epoch, last sequence) of every producer the broker tracks on the
    updates topic: Admin DescribeProducers, by tests/integration/DescribeProducers.java run as a
    single-file Java program on Kafka's own jars (the same on any broker: local, container, env)."""
    classpath = f"{ensure_kafka_jars()}/*"
    program = Path(__file__).with_name("DescribeProducers.java")
    argv = [ensure_java(), "-cp", classpath, str(program), settings.kafka_bootstrap, settings.topic_updates]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [STATE.fullmatch(line) for line in proc.stdout.splitlines()]
    assert all(found), proc.stdout
    return [(int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in found if m]


@pytest.mark.parametrize("language", list(EXAMPLE_PROGRAMS))
def test_the_example_producer_sends_idempotently_and_the_api_answers_its_scores(language, topics):
    settings = topics
    argv = EXAMPLE_PROGRAMS[language]()  # built first: a missing toolchain fails here, in one line
    room = unique(language)
    board = f"gift:{room}"
    env = {**os.environ, "BOOTSTRAP": settings.kafka_bootstrap, "TOPIC": settings.topic_updates}
    expected = {
        board: [("alice", 50, "Alice"), ("bob", 10, "Bob")],  # the single event, the array's first
        f"{board}-zone": [("bob", 10, "Bob")],
        f"{board}-global": [("bob", 10, "Bob")],
    }
    with running_worker(settings), api_process(settings) as base:
        proc = subprocess.run(
            [*argv, room], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        first, *sent_lines = proc.stdout.splitlines()
        # acks=all: each of these clients refuses idempotence with any other acks (librdkafka and
        # kafka-clients: a configuration error; franz-go: NewClient's "idempotency requires
        # acks=all"), so idempotence seen on the broker below implies it; and the program says so
        assert first == IN_EFFECT, proc.stdout
        sent = [SENT.fullmatch(line) for line in sent_lines]
        # both messages keyed by the room's board: one partition, in order, one line each
        assert len(sent) == 2 and all(sent), proc.stdout
        assert {(m[1], m[2]) for m in sent if m} == {(board, settings.topic_updates)}
        partitions = {int(m[3]) for m in sent if m}
        assert len(partitions) == 1 and [int(m[4]) for m in sent if m] == [0, 1], proc.stdout
        # the partition Java's client picks for the key: a board's messages share one whichever
        # language produced them (librdkafka only with partitioner=murmur2_random)
        assert partitions == {kafka_partition(board.encode(), partition_count(settings))}, proc.stdout

        wait_for(
            lambda: all(top(base, b) == items for b, items in expected.items()),
            60,
            f"the API to answer the scores {language}'s producer sent",
        )
        assert {b: top(base, b) for b in expected} == expected

    # Idempotence in effect: the broker tracks a producer (id >= 0) on the partition, whose two
    # records carried sequence numbers 0 and 1. A producer without idempotence leaves no state.
    states = producer_states(settings)
    assert len(states) == 1, states
    partition, producer_id, epoch, last_sequence = states[0]
    assert (partition, last_sequence) == (partitions.pop(), 1), states
    assert producer_id >= 0 and epoch >= 0, states
