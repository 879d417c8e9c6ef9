"""advance.lua's typed wrapper: raise a consumer group's "applied up to" records (the hash
`keys.partition_sources`; worker/sources.py reads them), never lower them."""

from __future__ import annotations

from collections.abc import Mapping

from common.store.scripts import load_script
from common.store.topology import Store

ARGS = ("TOPIC_ID",)  # then (partition, last offset) pairs

_ADVANCE = load_script("advance", (("A", ARGS),))


def raise_applied(client: Store, key: str, topic_id: str, last: Mapping[int, int]) -> None:
    """The partitions' records become at least `last` (a record of another topic id, a
    recreated topic, is replaced)."""
    if last:
        args: list[str | int] = [topic_id]
        for partition, offset in sorted(last.items()):
            args += [partition, offset]
        _ADVANCE.run(client, [key], args)
