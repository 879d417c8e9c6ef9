"""Send rankstream score events with confluent-kafka: one event for one board, then one gift
that counts on three boards as one message (an array).

    pip install confluent-kafka
    BOOTSTRAP=127.0.0.1:9092 TOPIC=update_rank python produce.py room42

A secured cluster: TLS_CA (the authority's PEM file: TLS), SASL_MECHANISM (SCRAM-SHA-512,
SCRAM-SHA-256 or PLAIN), SASL_USERNAME and SASL_PASSWORD.

The event's fields: docs/contract.md §2; how to produce well: docs/producing.md.
"""

from __future__ import annotations

import json
import os
import sys
import time

from confluent_kafka import KafkaError, Message, Producer

CONFIG = {
    # Idempotence: the broker drops the duplicates of the producer's own retries. It needs
    # acks=all (librdkafka refuses idempotence with anything else); both are spelled out.
    "enable.idempotence": True,
    "acks": "all",
    # The Java client's partitioning (and franz-go's): a board's messages share a partition
    # whichever language produced them. librdkafka's default hashes keys differently.
    "partitioner": "murmur2_random",
}


def security() -> dict[str, str]:
    """The login and TLS settings the environment asks for (none: plain TCP, no login)."""
    conf: dict[str, str] = {}
    tls, mechanism = os.environ.get("TLS_CA"), os.environ.get("SASL_MECHANISM")
    if tls:
        conf["ssl.ca.location"] = tls
    if mechanism:
        conf["sasl.mechanism"] = mechanism
        conf["sasl.username"] = os.environ.get("SASL_USERNAME", "")
        conf["sasl.password"] = os.environ.get("SASL_PASSWORD", "")
    protocol = {(True, True): "SASL_SSL", (True, False): "SSL", (False, True): "SASL_PLAINTEXT"}
    conf["security.protocol"] = protocol.get((bool(tls), bool(mechanism)), "PLAINTEXT")
    return conf


def main(argv: list[str]) -> int:
    room = argv[1] if len(argv) > 1 else "room42"
    topic = os.environ.get("TOPIC", "update_rank")
    producer = Producer(
        {"bootstrap.servers": os.environ.get("BOOTSTRAP", "127.0.0.1:9092"), **CONFIG, **security()}
    )
    print(f"producer: enable.idempotence={str(CONFIG['enable.idempotence']).lower()} acks={CONFIG['acks']}")

    # Ids name the thing counted (an order, a gift's transaction): here one per run.
    run = time.time_ns() // 1_000_000
    board = f"gift:{room}"

    # (a) One event: alice received a gift worth 50 in the room. Left out: "op" (default
    # "incr") and "ts" (default: the message's timestamp, the send time).
    single = {"id": f"order-{run}", "board": board, "member": "alice", "score": 50, "meta": {"name": "Alice"}}

    # (b) One gift that counts on the room, its zone and a global board: one message, an array
    # with one event per board. The same id on each is right: ids are per board. (A service
    # names its real zone and global boards, gift:zone-eu, gift:global; here they are named
    # after the room, so that every run has boards of its own.)
    batch = [
        {"id": f"gift-{run}", "board": b, "member": "bob", "score": 10, "meta": {"name": "Bob"}}
        for b in (board, f"{board}-zone", f"{board}-global")
    ]

    failed: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        key = (msg.key() or b"").decode()
        if err is not None:
            failed.append(key)
            print(f"not sent ({key}): {err}", file=sys.stderr)
        else:
            print(f"sent {key} to {msg.topic()}[{msg.partition()}]@{msg.offset()}")

    # The key is the board (for an array: its first board): one board's events stay in order.
    for value in (single, batch):
        producer.produce(topic, key=board, value=json.dumps(value), on_delivery=delivered)
    # produce() is asynchronous: wait for every message's answer before exiting.
    left = producer.flush(30)
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
