"""How many shards each board type's boards were written with, as Redis remembers it.

Changing `shards:` for a type whose boards hold data would leave their members under keys that
no process reads any more; so the worker records a sharded type's shard count at its boards'
first write (`{shards}`, a hash type -> K; HSETNX: the first writer's count stands), and the
worker and the API refuse at start a config whose count differs from the recorded one. A type
configured with more than one shard and no record was never written sharded: whether its boards
hold unsharded data, one SCAN of the board sequence keys tells (once: its first write records
it). An unsharded type records nothing: its keys name no shard count."""

from __future__ import annotations

from collections.abc import Mapping

from common.boards import BoardsConfig, split_board
from common.errors import ConfigError, InfrastructureError
from common.store.encoding import text
from common.store.keys import shard_counts
from common.store.shards import board_of, count_of
from common.store.topology import Store, masters

SCAN_COUNT = 2_000
DOC = "docs/boards.md#shards"


class ShardsChanged(InfrastructureError):
    """Another process wrote this type's boards with another shard count: its config differs."""

    def __init__(self, board_type: str, recorded: int, configured: int) -> None:
        super().__init__(
            f"board type {board_type!r} was first written with shards: {recorded}, this worker's "
            f"config says {configured}: run every worker with the same config ({DOC})"
        )


def record(client: Store, prefix: str, board_type: str, shards: int) -> None:
    """Record `board_type`'s shard count unless one is recorded; raise if that one differs."""
    key = shard_counts(prefix)
    client.hsetnx(key, board_type, shards)
    found = int(text(client.hget(key, board_type) or b"0"))
    if found != shards:
        raise ShardsChanged(board_type, found, shards)


def recorded(client: Store, prefix: str) -> dict[str, int]:
    raw: Mapping[bytes, bytes] = client.hgetall(shard_counts(prefix))  # type: ignore[assignment]  # redis-py's sync/async union
    return {text(k): int(text(v)) for k, v in raw.items()}


def check(client: Store, prefix: str, boards: BoardsConfig, source: str) -> None:
    """Raise ConfigError (one line naming the type) when `boards` gives a type another shard
    count than the one its boards hold data with."""
    found = recorded(client, prefix)
    for name, board_type in boards.types.items():
        held = found.get(name)
        if held is not None and held != board_type.shards:
            raise _changed(source, name, held, board_type.shards)
    unrecorded = {n for n, t in boards.types.items() if t.shards > 1 and n not in found}
    if not unrecorded:
        return
    for node in masters(client):
        for raw in node.scan_iter(match=f"{literal_glob(prefix)}{{*}}:seq", count=SCAN_COUNT):
            name = text(raw)[len(prefix) + 1 : -len("}:seq")]
            parts = split_board(board_of(name))
            if parts is None:
                continue
            of = boards.type_for(parts[0])  # a type not configured: `default`
            if of is not None and of.name in unrecorded:
                held = count_of(name)
                if held != of.shards:
                    raise _changed(source, of.name, held, of.shards)


def _changed(source: str, name: str, held: int, configured: int) -> ConfigError:
    return ConfigError(
        f"{source}: types.{name}.shards: its boards hold data written with shards: {held}, the config "
        f"says {configured}; keep {held} (changing a type's shards needs its data moved: {DOC})"
    )


def literal_glob(text_: str) -> str:
    """`text_` matched literally by a Redis SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text_)
