"""One board's data copied from its shards of one count to its shards of another, for `rankstream
reshard-board` (rankstream/reshard.py), with the workers stopped.

Each member's state in each window instance is written to the member's new shard by apply.lua
itself (op `restore`: the state as read, tie and all, outside the fence and the seq), so each
new shard's tie index, packed layout and max_members split are what the worker would have
written. The rest is copied as it is, split by member where it is per member:

- seq: every new shard starts at the old shards' sum + 1 (an answer's seq, their sum, only grows);
- fence: per source the furthest position any old shard reached (the caller checked that the
  group committed past each: nothing before it is delivered again), and the epoch;
- id window: every id any old shard remembers, with the second it was applied, in every new
  shard (an id names no member: a producer's retry lands where its member now lives);
- meta and rolling buckets: each member's fields in its new shard, with the keys' expiries;
- period markers (a rolling period prepared ahead, a period result sealed or sent): a new shard
  has one when every old shard that counts has one (rules in `_markers`).
What is not copied: tie index keys (rebuilt by the writes), reset marks (only a redelivered reset
reads one, and nothing is redelivered), hot board flags (the workers backfill the new shards at
start)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from common.boards import BoardsConfig, BoardType, WindowKind
from common.errors import ConfigError
from common.periods import parse_period
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript, ForeignEpoch, Instance, PromotionChanged
from common.store.encoding import Packing, text, tie_mode
from common.store.keys import BUCKET_PREFIX, BoardKeys
from common.store.scan import SCAN_COUNT, instance_packing, state_pages
from common.store.shards import count_of, shard_index, shard_names
from common.store.topology import Store

RESTORE = "restore"  # apply.lua's op
EVENTS_PER_CALL = 500
CALLS_PER_TRIP = 16
DONE, SEALED = "done", "sealed"  # worker/rolling.py, worker/results.py
BUSY = "busy:"


@dataclass(frozen=True, slots=True)
class Context:
    """What every board's copy needs."""

    client: Store
    prefix: str
    boards: BoardsConfig
    board_type: BoardType
    id_window_s: int
    listpack_cap: int
    updates_topic: str
    updates_topic_id: str
    now_s: int  # Redis' clock: ids applied a window before it are not copied


@dataclass
class Copied:
    members: int = 0  # member states written (over instances)
    ids: int = 0
    skipped: list[str] = field(default_factory=list)  # instances of windows the config no longer has


def suffixes(prefix: str, name: str, keys: Sequence[str]) -> list[str]:
    """The keys of shard `name`, without its tag and the `:` after it."""
    cut = len(BoardKeys(prefix, name).tag) + 1
    return [k[cut:] for k in keys]


def copy_board(
    ctx: Context, board: str, old: Mapping[str, Sequence[str]], shards: int, markers: Markers
) -> Copied:
    """Copy `board` from its names in `old` (name -> its keys) to its `shards` new shards, with
    the period markers `markers` (`plan_markers`)."""
    client, out = ctx.client, Copied()
    olds = {name: BoardKeys(ctx.prefix, name) for name in old}
    news = [BoardKeys(ctx.prefix, name) for name in shard_names(board, shards)]
    parts = {name: suffixes(ctx.prefix, name, keys) for name, keys in old.items()}
    seq = sum(int(client.get(k.seq) or 0) for k in olds.values()) + 1
    for keys in news:  # first: an interrupted move's new shards are found by their seq
        client.set(keys.seq, seq)
    fence = merged_fence(ctx, [_hash(client, k.fence) for k in olds.values()])
    if fence:
        for keys in news:
            client.hset(keys.fence, mapping=fence)  # type: ignore[arg-type]  # Mapping is invariant
    epoch = fence.get("e", "")

    def member_shard(member: str) -> BoardKeys:
        return news[shard_index(member, shards)]

    _copy_hash_split(client, [k.meta for k in olds.values()], lambda m: member_shard(m).meta)
    buckets = sorted({BUCKET_PREFIX + s[2:] for sfx in parts.values() for s in sfx if s.startswith("b:")})
    for bucket in buckets:  # a rolling window's: member -> "<value>|<latest event ms>"
        _copy_hash_split(
            client, [k.bucket(bucket) for k in olds.values()], partial(_bucket_of, member_shard, bucket)
        )
    _copy_instances(ctx, olds=olds, parts=parts, epoch=epoch, member_shard=member_shard, out=out)
    ids = _ids(ctx, parts)
    out.ids = len(ids)
    restore_ids = [ApplyEvent(RESTORE, "", 0.0, at, "", 0, 0, 0, fp) for fp, at in ids]
    _run(client, [r for keys in news for r in _requests(ctx, keys, [], restore_ids, epoch)])
    for inst, (values, expire) in markers.write.items():
        for keys, value in zip(news, values, strict=True):
            client.set(keys.prepared(inst), value)
            if expire > 0:
                client.pexpireat(keys.prepared(inst), expire)
    return out


def _bucket_of(member_shard: Callable[[str], BoardKeys], bucket: str, member: str) -> str:
    return member_shard(member).bucket(bucket)


def _copy_instances(
    ctx: Context,
    *,
    olds: Mapping[str, BoardKeys],
    parts: Mapping[str, Sequence[str]],
    epoch: str,
    member_shard: Callable[[str], BoardKeys],
    out: Copied,
) -> None:
    """Every member's state in every window instance, written to its new shard by apply.lua."""
    for inst in sorted({s[2:] for sfx in parts.values() for s in sfx if s[:2] in ("z:", "p:")}):
        known, packing = _packing(ctx, inst)
        if not known:
            out.skipped.append(inst)
            continue
        expire = max(_expire_at(ctx.client, k.rank(inst, packing is not None)) for k in olds.values())
        instance = Instance(inst, expire, packing)
        per_shard: dict[str, tuple[BoardKeys, list[ApplyEvent]]] = {}
        for keys in olds.values():
            for page in state_pages(ctx.client, keys, inst, packing, tie_mode(ctx.board_type)):
                for row in page:
                    target = member_shard(row.member)
                    per_shard.setdefault(target.board, (target, []))[1].append(
                        ApplyEvent(RESTORE, row.member, row.state.score, row.state.tie_ms, "", 1, 0, 0, b"")
                    )
        writes: list[ApplyRequest] = []
        for target, events in per_shard.values():
            out.members += len(events)
            writes += _requests(ctx, target, [instance], events, epoch)
        _run(ctx.client, writes)


def merged_fence(ctx: Context, fences: Sequence[dict[str, str]]) -> dict[str, str]:
    """Per source field the furthest position of any old shard ("<topic id>|<offset>|<where>":
    one of this topic's id over a recreated topic's), the epoch; no rejection records (each is at
    or before a committed offset, so forgotten)."""
    out: dict[str, str] = {}
    best: dict[str, tuple[bool, int, int]] = {}
    for fence in fences:
        for f, value in fence.items():
            if f == "e":
                out["e"] = value
                continue
            if f.endswith("!r"):
                continue
            topic_id, offset, where = value.split("|")
            current = f.partition(":")[0] != ctx.updates_topic or topic_id == ctx.updates_topic_id
            rank = (current, int(offset), int(where))
            if f not in best or rank > best[f]:
                best[f], out[f] = rank, value
    return out


def _packing(ctx: Context, inst: str) -> tuple[bool, Packing | None]:
    """(the config still has the instance's window and period, how the instance packs)."""
    try:
        window = ctx.board_type.window(inst.split(":", 1)[0])
        return True, instance_packing(ctx.boards, ctx.board_type, window, inst)
    except (KeyError, ValueError):
        return False, None


@dataclass
class Markers:
    write: dict[str, tuple[list[str], int]] = field(default_factory=dict)  # instance -> per new shard, expiry


def plan_markers(ctx: Context, board: str, old: Mapping[str, Sequence[str]], shards: int) -> Markers:
    """The new shards' period markers. A period result's (sealed, sending, sent): when every old
    shard is sealed, the new lead shard (shard 0: worker/results.py) takes the old lead's state
    and the others `sealed`; else none (the result is sealed again, as it is still due). A
    rolling period's `done` (prepared from the one before it): for a period under way or past,
    on every new shard if an old one has it (it steers only a next period's writes); for the
    next period, when every old shard with data of the window has it, and none when none has
    (the workers prepare the new shards); a preparation under way (`busy:`), or a next period
    some shards have and others have not, is refused (run the workers until it is over)."""
    client, out = ctx.client, Markers()
    parts = {name: suffixes(ctx.prefix, name, keys) for name, keys in old.items()}
    old_names = shard_names(board, count_of(next(iter(parts))))
    for inst in sorted({s[3:] for sfx in parts.values() for s in sfx if s.startswith("rp:")}):
        window_name, _, period_id = inst.partition(":")
        try:
            window = ctx.board_type.window(window_name)
            start = parse_period(window, period_id, ctx.boards.timezone).start_ms
        except (KeyError, ValueError):
            continue  # a window or period the config no longer has: not copied
        keys = [BoardKeys(ctx.prefix, n).prepared(inst) for n in old_names]
        values = [text(v) for v in cast(list[bytes | None], [client.get(k) for k in keys])]
        if any(v is not None and v.startswith(BUSY) for v in values):
            raise ConfigError(_half(board, inst))
        levels = [_level(v) for v in values]
        expire = max(_expire_at(client, k) for k in keys)
        if min(levels) == 2:
            out.write[inst] = ([values[0] or SEALED] + [SEALED] * (shards - 1), expire)
        elif window.kind is not WindowKind.ROLLING or max(levels) == 0:
            continue
        elif start <= ctx.now_s * 1000:
            out.write[inst] = ([DONE] * shards, expire)
        else:  # the next period: each shard with buckets of the window is prepared, or none is
            has_data = {n for n, sfx in parts.items() if any(s.startswith(f"b:{window_name}:") for s in sfx)}
            counted = [lv for n, lv in zip(old_names, levels, strict=True) if n in has_data or lv > 0]
            if min(counted) == 0:
                raise ConfigError(_half(board, inst))
            out.write[inst] = ([DONE] * shards, expire)
    return out


def _half(board: str, inst: str) -> str:
    return (
        f"board {board}: period {inst} is being prepared (or sealed) by the workers: start them until "
        "it is done, stop them, and run reshard-board again"
    )


def _level(value: str | None) -> int:
    if value is None:
        return 0
    return 1 if value == DONE else 2


def _ids(ctx: Context, parts: Mapping[str, Sequence[str]]) -> list[tuple[bytes, int]]:
    """Every id fingerprint the old shards remember applied within the window, with its second."""
    found: dict[bytes, int] = {}
    for name, sfx in parts.items():
        keys = BoardKeys(ctx.prefix, name)
        for s in sfx:
            if not s.startswith("i:"):
                continue
            rows = ctx.client.zrange(f"{keys.tag}:{s}", 0, -1, withscores=True)
            for fp, at in cast(list[tuple[bytes, float]], rows):
                if at > ctx.now_s - ctx.id_window_s:
                    found[fp] = max(found.get(fp, 0), int(at))
    return sorted(found.items())


def _requests(
    ctx: Context, keys: BoardKeys, instances: list[Instance], events: list[ApplyEvent], epoch: str
) -> list[ApplyRequest]:
    bt = ctx.board_type
    return [
        ApplyRequest(
            keys=keys,
            instances=instances,
            mode=tie_mode(bt),
            desc=bt.order.value == "desc",
            max_members=bt.max_members or 0,
            want_state=False,
            epoch=epoch,
            id_window_s=ctx.id_window_s,
            listpack_cap=ctx.listpack_cap,
            legacy_ttl_ms=0,
            sources=(),
            events=events[k : k + EVENTS_PER_CALL],
        )
        for k in range(0, len(events), EVENTS_PER_CALL)
    ]


_SCRIPT = ApplyScript()


def _run(client: Store, requests: list[ApplyRequest]) -> None:
    for k in range(0, len(requests), CALLS_PER_TRIP):
        batch = requests[k : k + CALLS_PER_TRIP]
        for req, reply in zip(batch, _SCRIPT.run_many(client, batch), strict=True):
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, ForeignEpoch):
                found = f"its fence is of epoch {reply.found!r}, not {req.epoch!r}"
                raise ConfigError(f"{req.keys.board}: {found}")
            if isinstance(reply, PromotionChanged):  # a new shard no API node can have registered
                raise ConfigError(f"{req.keys.board}: registered by an API node while it is being copied")


def _copy_hash_split(client: Store, sources: Sequence[str], target: Callable[[str], str]) -> None:
    """Copy the fields of hashes `sources` (member -> value) to `target(member)`'s hash, with
    the latest expiry of the sources."""
    expire = max(_expire_at(client, k) for k in sources)
    for key in sources:
        cursor = 0
        while True:
            cursor, fields = client.hscan(key, cursor, count=SCAN_COUNT)
            split: dict[str, dict[bytes, bytes]] = defaultdict(dict)
            for member, value in cast(dict[bytes, bytes], fields).items():
                split[target(text(member))][member] = value
            for dest, mapping in split.items():
                client.hset(dest, mapping=mapping)  # type: ignore[arg-type]  # Mapping is invariant
                if expire > 0:
                    client.pexpireat(dest, expire)
            if cursor == 0:
                break


def _hash(client: Store, key: str) -> dict[str, str]:
    raw = cast(dict[bytes, bytes], client.hgetall(key))
    return {text(k): text(v) for k, v in raw.items()}


def _expire_at(client: Store, key: str) -> int:
    """The key's expiry in Unix ms; 0 when it has none or does not exist."""
    at = int(client.pexpiretime(key))
    return max(at, 0)
