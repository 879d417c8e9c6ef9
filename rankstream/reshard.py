"""`rankstream reshard-board <type> --shards K`: give a board type's boards another shard count
(docs/boards.md#shards), offline: the workers stopped, the type's data moved, then every process
restarted with the new count in its config.

1. It refuses unless the worker group has no running member and, for every board of the type,
   the group committed past every event the board applied (a worker stopped between applying and
   committing left events that would be delivered again: start the workers until they commit).
2. It copies each board to its new shards (rankstream/reshard_copy.py), records the new count
   (the `{shards}` hash: workers and API nodes with the old count now refuse to start), and
   drops the old shards' keys, unless `--keep-old`: then API nodes still running the old config
   keep answering from the old layout until they restart, and running the command again drops
   it. For a hot board it deletes the old shards' update_cache records (tombstones); the
   workers backfill the new shards when they start.
3. Interrupted, it is run again: shards of the type of another count than the recorded one are
   what a move left, and are dropped first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import cast

from confluent_kafka.admin import AdminClient

from common.boards import BoardsConfig, load_boards, split_board
from common.clients import redis_client
from common.errors import ConfigError
from common.idwindow import LISTPACK_CAP
from common.settings import Settings
from common.store import shardcount
from common.store.encoding import text
from common.store.keys import BoardKeys, hot_flagged, shard_counts, shard_moves
from common.store.shardcount import literal_glob
from common.store.shards import MAX_SHARDS, SHARD_MARK, board_of, count_of, shard_names
from common.store.topology import Store, masters
from rankstream.admin import UsageError
from rankstream.recover import committed_group, require_stopped
from rankstream.reshard_cache import delete_records
from rankstream.reshard_copy import Context, copy_board, plan_markers, suffixes
from worker.sources import describe_topic

SCAN_COUNT = 2_000
DELIVERY_TIMEOUT_S = 30.0
LEGACY = ("id:",)  # the per-event dedupe records of a build before 0.1.0 (common/store/keys.py)


def reshard_board(settings: Settings, type_name: str, shards: int, *, keep_old: bool = False) -> list[str]:
    """Move `type_name`'s boards to `shards` shards; the lines to print."""
    boards = load_boards(settings.boards)
    board_type = boards.types.get(type_name)
    if board_type is None:
        raise UsageError(f"{settings.boards}: no board type {type_name!r}")
    if not 1 <= shards <= MAX_SHARDS:
        raise UsageError(f"--shards must be 1 to {MAX_SHARDS}, not {shards}")
    client = redis_client(settings)
    prefix = settings.key_prefix
    found = names_of_type(client, prefix, boards, type_name)
    moving = text(client.hget(shard_moves(prefix), type_name))
    held = int(moving.split()[0]) if moving else _held(client, prefix, type_name, found, str(settings.boards))
    if held == shards and not moving:  # nothing to move; what a move left is finished off
        lines = _finish(settings, client, boards, found, held, keep_old=False)
        return [*lines, f"{type_name}: its boards already have shards: {shards}; nothing to move"]
    admin = AdminClient(settings.librdkafka())
    require_stopped(settings, admin, "reshard-board")
    group = committed_group(settings, admin)
    # an interrupted move's new shards (not yet recorded, never registered nor published)
    lines = _drop(client, prefix, found, keep={held}, what="of an earlier layout")
    old = {b: {n: k for n, k in names.items() if count_of(n) == held} for b, names in found.items()}
    old = {b: names for b, names in old.items() if names}
    ctx = Context(
        client=client,
        prefix=prefix,
        boards=boards,
        board_type=board_type,
        id_window_s=settings.id_window_s,
        listpack_cap=LISTPACK_CAP,
        updates_topic=settings.topic_updates,
        updates_topic_id=group.topic_id,
        now_s=int(client.time()[0]),
    )
    markers = {}
    for board, names in sorted(old.items()):  # every refusal before the first write
        _check(client, settings, board, names=names, topic_id=group.topic_id, committed=group.committed)
        markers[board] = plan_markers(ctx, board, names, shards)
    client.hset(shard_moves(prefix), type_name, f"{held} {shards}")
    members = ids = 0
    skipped: set[str] = set()
    for board, names in sorted(old.items()):
        copied = copy_board(ctx, board, names, shards, markers[board])
        members, ids = members + copied.members, ids + copied.ids
        skipped.update(copied.skipped)
    recorded = client.pipeline(transaction=True)  # one slot: {shards}
    recorded.hset(shard_counts(prefix), type_name, shards)
    recorded.hdel(shard_moves(prefix), type_name)
    recorded.execute()
    lines.append(
        f"{type_name}: {len(old)} boards moved from shards: {held} to shards: {shards} "
        f"({members} member states, {ids} remembered ids); recorded shards: {shards}"
    )
    if skipped:
        lines.append(
            f"  left out {len(skipped)} periods of windows the config no longer has: "
            + ", ".join(sorted(skipped))
        )
    lines += _finish(settings, client, boards, old, shards, keep_old=keep_old)
    if keep_old:
        lines.append(
            f"  the old layout is kept: `rankstream reshard-board {type_name} --shards {shards}` drops it"
        )
    lines.append(
        f"now set `shards: {shards}` for type {type_name} in {settings.boards}, start the workers "
        "and restart the API nodes"
    )
    return lines


def _held(
    client: Store, prefix: str, type_name: str, found: Mapping[str, Mapping[str, object]], source: str
) -> int:
    """The type's shard count as Redis records it, or as its boards' names tell when it has no
    record (an unsharded type's first write records none); refused when they disagree."""
    recorded = shardcount.recorded(client, prefix).get(type_name)
    if recorded is not None:
        return recorded
    counts = {count_of(name) for names in found.values() for name in names}
    if len(counts) > 1:
        raise ConfigError(
            f"{source}: types.{type_name}: Redis records no shard count for the type, and its boards "
            f"are held with shards: {', '.join(map(str, sorted(counts)))}: record the one the workers "
            f"write with (HSET {shard_counts(prefix)} {type_name} <K>) and run reshard-board again"
        )
    return counts.pop() if counts else 1


def _finish(
    settings: Settings,
    client: Store,
    boards: BoardsConfig,
    found: Mapping[str, Mapping[str, Sequence[str]]],
    shards: int,
    *,
    keep_old: bool,
) -> list[str]:
    """What follows the record of a move (`shards`), also when a run stopped midway does it
    again: names of another count leave the rolling windows' registrations and the hot boards'
    flag list, their update_cache records are deleted (hot boards), and, unless `keep_old`,
    their keys."""
    prefix, lines = settings.key_prefix, []
    stale = {b: [n for n in names if count_of(n) != shards] for b, names in found.items()}
    stale = {b: names for b, names in stale.items() if names}
    if not stale:
        return []
    _forget(client, prefix, [n for names in stale.values() for n in names], shards)
    hot = [n for b, names in stale.items() if boards.hot_windows(b) for n in names]
    if hot:
        _, partitions = describe_topic(AdminClient(settings.librdkafka()), settings.topic_cache)
        deleted = delete_records(settings, hot, len(partitions))
        if deleted:
            lines.append(f"  deleted {deleted} update_cache records of the old shards of hot boards")
    if not keep_old:
        lines += _drop(client, prefix, found, keep={shards}, what="of the old layout")
    return lines


def names_of_type(
    client: Store, prefix: str, boards: BoardsConfig, type_name: str
) -> dict[str, dict[str, list[str]]]:
    """board -> its names in Redis (itself or its shards', of any count) -> their keys, for every
    board of the type: one SCAN of every master. A name counts once it has a seq (every board
    written has one, and a move writes its new shards' first); a shard's name, by its mark, also
    without (one that took no event may hold a sealed period's marker)."""
    type_of = boards.types[type_name]
    keys: dict[str, list[str]] = defaultdict(list)
    for node in masters(client):
        for raw in node.scan_iter(match=f"{literal_glob(prefix)}{{*}}:*", count=SCAN_COUNT):
            key = text(raw)
            close = key.find("}", len(prefix))
            if close > 0:
                keys[key[len(prefix) + 1 : close]].append(key)
    out: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for name, found in keys.items():
        parts = split_board(board_of(name))
        if parts is None or (SHARD_MARK not in name and f"{prefix}{{{name}}}:seq" not in found):
            continue
        if boards.type_for(parts[0]) is type_of:
            out[board_of(name)][name] = found
    return out


def _drop(
    client: Store, prefix: str, found: Mapping[str, Mapping[str, Sequence[str]]], *, keep: set[int], what: str
) -> list[str]:
    """Delete the keys of every name whose shard count is not in `keep` (its seq last)."""
    dropped = 0
    for names in found.values():
        for name, keys in names.items():
            if count_of(name) in keep:
                continue
            seq = BoardKeys(prefix, name).seq
            rest = [k for k in keys if k != seq]
            for k in range(0, len(rest), 500):
                client.unlink(*rest[k : k + 500])
            client.unlink(seq)
            dropped += 1
    return [f"  dropped the keys of {dropped} shards {what}"] if dropped else []


def _check(
    client: Store,
    settings: Settings,
    board: str,
    *,
    names: Mapping[str, Sequence[str]],
    topic_id: str,
    committed: Mapping[int, tuple[int, str | None]],
) -> None:
    """Refuse a board in a layout of the previous release, or one holding events the group did
    not commit (they would be delivered again, and the new shards' fences skip them)."""
    topic = settings.topic_updates
    for name, keys in names.items():
        if any(s.startswith(LEGACY) for s in suffixes(settings.key_prefix, name, keys)):
            raise ConfigError(
                f"board {board} still holds per-event dedupe records of a build before 0.1.0: run the "
                "workers until they expire (RANKSTREAM_DEDUPE_WINDOW_S after the upgrade), then reshard"
            )
        fence = cast(dict[bytes, bytes], client.hgetall(BoardKeys(settings.key_prefix, name).fence))
        for raw_field, raw in fence.items():
            field = text(raw_field)
            src_topic, _, part = field.rpartition(":")
            if src_topic != topic or field.endswith("!r") or not part.isdigit():
                continue
            found_id, offset, _ = text(raw).split("|")
            at = committed.get(int(part), (-1, None))[0]
            if found_id == topic_id and int(offset) >= at:
                raise ConfigError(
                    f"board {board}: a worker applied offset {offset} of {topic}[{part}] but the group "
                    f"committed only up to {at}: start the workers until they commit it, stop them, "
                    "and run reshard-board again"
                )


def _forget(client: Store, prefix: str, names: Sequence[str], shards: int) -> None:
    """The old shards leave what lists boards by name: the rolling windows' registrations (the
    new shards take their place) and the hot boards' flag list."""
    old = set(names)
    for node in masters(client):
        for raw in node.scan_iter(match=f"{literal_glob(prefix)}{{rolling}}:*", count=SCAN_COUNT):
            key = text(raw)
            kind = text(cast(bytes, client.type(key)))
            if kind == "set":
                members = {text(m) for m in cast(set[bytes], client.smembers(key))}
                moved = members & old
                if moved:
                    new = {n for m in moved for n in shard_names(board_of(m), shards)}
                    client.sadd(key, *new)
                    client.srem(key, *moved)
            elif kind == "zset":
                for name in old:
                    score = client.zscore(key, name)
                    if score is not None:
                        client.zadd(key, dict.fromkeys(shard_names(board_of(name), shards), score), gt=True)
                        client.zrem(key, name)
    if old:
        client.srem(hot_flagged(prefix), *old)
