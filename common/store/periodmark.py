"""periodmark.lua's typed wrapper: the state of a period's result, in the period's marker
`<board>:rp:<period>` (common/store/keys.py), moved only by compare-and-set.

    (none) | done | busy:<owner>   the result not begun (a rolling period's preparation's marks)
    sealed                         apply.lua leaves the period alone: the result is final
    sending:<partition>:<offset>   being produced; a record at or after that offset may be it
    sent:<partition>:<offset>:<seq>:<emitted ms>   produced and committed, at that offset
The marker expires with its period."""

from __future__ import annotations

from dataclasses import dataclass

from common.store.encoding import text
from common.store.keys import BoardKeys
from common.store.scripts import load_script
from common.store.topology import Store

MARK_KEYS, MARK_ARGS = ("MARK",), ("OP", "EXPIRE", "EXPECTED", "NEW")
_SCRIPT = load_script("periodmark", (("K", MARK_KEYS), ("A", MARK_ARGS)))


@dataclass(frozen=True, slots=True)
class Mark:
    raw: str  # as stored ('' = none)
    state: str  # none | done | busy | sealed | sending | sent
    partition: int = -1  # sending, sent: the record's partition
    offset: int = -1  # sending: where to look from; sent: the record's offset
    seq: int = 0  # sent: the record's seq
    emitted_ms: int = 0  # sent: when it was committed

    @property
    def sealed(self) -> bool:
        return self.state in {"sealed", "sending", "sent"}


def parse_mark(raw: str) -> Mark:
    state, _, rest = raw.partition(":")
    if raw == "":
        return Mark(raw, "none")
    if state == "sending":
        partition, offset = rest.split(":")
        return Mark(raw, state, int(partition), int(offset))
    if state == "sent":
        partition, offset, seq, emitted = rest.split(":")
        return Mark(raw, state, int(partition), int(offset), int(seq), int(emitted))
    return Mark(raw, state)


def sending(partition: int, offset: int) -> str:
    return f"sending:{partition}:{offset}"


def sent(partition: int, offset: int, seq: int, emitted_ms: int) -> str:
    return f"sent:{partition}:{offset}:{seq}:{emitted_ms}"


def read_mark(client: Store, keys: BoardKeys, instance: str) -> Mark:
    raw = client.get(keys.prepared(instance))
    return parse_mark("" if raw is None else text(raw))


def seal(client: Store, keys: BoardKeys, instance: str, expire_ms: int) -> Mark:
    """Seal the period (unless its result is past that already); the marker after."""
    return parse_mark(text(_SCRIPT.run(client, [keys.prepared(instance)], ["seal", expire_ms, "", ""])))


def swap(client: Store, keys: BoardKeys, instance: str, expected: Mark, new: str, *, expire_ms: int) -> Mark:
    """Write `new` if the marker is still `expected`; the marker after (compare it with `new`)."""
    args: list[str | int] = ["swap", expire_ms, expected.raw, new]
    return parse_mark(text(_SCRIPT.run(client, [keys.prepared(instance)], args)))
