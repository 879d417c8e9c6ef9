"""Boards a node makes hot by itself (its read rate passed RANKSTREAM_HOT_PROMOTE_READS_PER_S:
api/readrates.py): how one is loaded while Redis keeps answering, and kept current.

The hot-board thread (api/hotboards.py) does it, between its reads of update_cache:
1. It notes where the board's update_cache partition ends (its last stable offset) and follows
   the partition from there, unless it follows it already.
2. It registers the board in Redis (common/store/promotion.py), then reads each shard's seq
   (seq0). From the registration on, every write to the board is published with its states
   (worker/promotions.py), so every change after seq0 reaches update_cache past that offset.
3. It reads the board's states page by page (common/store/scan.py), each taken at seq0, while
   the board's records go on arriving: a record's state or delete, newer than seq0, wins over a
   page's whatever the order they come in; a page's state wins over a record older than seq0.
4. Once read, each shard's seq again (seq1): memory is exact once every change up to seq1 has
   been applied, which a marker at seq1 or later says (none is needed if seq1 is seq0).
5. Then the node serves the board from memory, and keeps its registration alive (a TTL of
   REGISTRATION_TTL_MS, renewed every KEEP_ALIVE_S). A registration found lapsed (another token:
   writes made meanwhile were not published), or not renewed for too long (Redis away), drops
   the board from memory: Redis answers again, and the board may be loaded again.

What is loaded: every window of the board's type; of each periodic window, the current and the
previous period and any later one (events may be ahead of the clock), computed from the config
and the clock, never by scanning Redis' keys. Those periods, and any that begin later, are
served from memory; older ones from Redis (`HotBoard.since`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from common.boards import BoardsConfig, BoardType, WindowKind
from common.events import ts_ceiling
from common.periods import recent_periods
from common.store import promotion, scan
from common.store.encoding import tie_mode
from common.store.keys import TOTAL_INSTANCE, BoardKeys, window_instance
from common.store.scan import StateRow, instance_packing
from common.store.shards import shard_names
from common.store.topology import Store

if TYPE_CHECKING:
    from api.hotboards import HotBoard

REGISTRATION_TTL_MS = 30_000
KEEP_ALIVE_S = 10.0  # renewed this often: a renewal can fail twice before the TTL runs out
UNCONFIRMED_S = 20.0  # no renewal for this long (Redis away): the board leaves memory
PAGES_PER_STEP = 4  # pages of states read between two reads of update_cache


def coverage(
    board_type: BoardType, now_ms: int, skew_s: int, tz: ZoneInfo
) -> tuple[dict[str, int], list[str]]:
    """(per periodic window, the start of the first period served from memory; the instances to
    load): the current and the previous period of each, and any later one an event may reach."""
    latest = ts_ceiling(skew_s, now_ms)
    since: dict[str, int] = {}
    load: list[str] = []
    for window in board_type.promotable_windows():
        if window.kind is WindowKind.TOTAL:
            load.append(TOTAL_INSTANCE)
            continue
        periods = [
            p for p, _ in recent_periods(window, board_type.retention[window.name], now_ms, latest, tz)
        ]
        started = [p for p in periods if p.start_ms <= now_ms][:2]  # newest first: current, previous
        since[window.name] = min((p.start_ms for p in started), default=now_ms)
        load += [window_instance(window.name, p.id) for p in periods if p.start_ms >= since[window.name]]
    return since, load


@dataclass
class Loading:
    """A board being loaded: records of it are applied to `hot` as they come."""

    hot: HotBoard
    tokens: dict[str, str]  # per name in Redis (each shard's): the registration's token
    seq0: dict[str, int]
    pages: Iterator[tuple[str, str, list[StateRow]]]  # (name in Redis, instance, rows)
    members: int = 0  # states read so far
    scanned: bool = False


def start(
    client: Store, boards: BoardsConfig, prefix: str, hot: HotBoard, *, now_ms: int, skew_s: int
) -> Loading:
    """Register the board `hot` (empty, loading, every window of its type) stands for and begin
    reading it."""
    board_type = boards.type_for(hot.board.split(":", 1)[0])
    assert board_type is not None  # the caller checked
    since, instances = coverage(board_type, now_ms, skew_s, boards.timezone)
    names = shard_names(hot.board, board_type.shards)
    tokens = {
        name: promotion.register(client, BoardKeys(prefix, name), REGISTRATION_TTL_MS) for name in names
    }
    seq0 = {name: int(client.get(BoardKeys(prefix, name).seq) or 0) for name in names}  # after registering
    hot.since = since
    for name, seq in seq0.items():
        hot.seqs[name] = seq
        hot.markers[name] = seq  # memory will hold the board as Redis held it at seq0, and later
    return Loading(
        hot, tokens, seq0, _pages(client, boards, board_type, prefix, names=names, instances=instances)
    )


def _pages(
    client: Store,
    boards: BoardsConfig,
    board_type: BoardType,
    prefix: str,
    *,
    names: tuple[str, ...],
    instances: list[str],
) -> Iterator[tuple[str, str, list[StateRow]]]:
    mode = tie_mode(board_type)
    for instance in instances:
        window = board_type.window(instance.split(":", 1)[0])
        packing = instance_packing(boards, board_type, window, instance)
        for name in names:
            for page in scan.state_pages(client, BoardKeys(prefix, name), instance, packing, mode):
                yield name, instance, page


def step(loading: Loading, limit: int) -> bool:
    """Read up to PAGES_PER_STEP pages into memory; True once every page is read. Raises
    TooBig past `limit` members."""
    hot = loading.hot
    for _ in range(PAGES_PER_STEP):
        got = next(loading.pages, None)
        if got is None:
            loading.scanned = True
            return True
        name, instance, rows = got
        seq = loading.seq0[name]
        window = hot.window(instance)
        meta = hot.meta
        for row in rows:
            window.put(row.member, row.state.score, row.state.tie_ms, seq)
            if row.meta is not None or row.member in meta:  # none, when memory knows of one
                meta.claim(row.member, seq, row.meta)
        loading.members += len(rows)
        if loading.members > limit:
            raise TooBig(f"{hot.board} holds more than {limit} members")
    return False


class TooBig(Exception):
    """A board too big to make hot by itself (RANKSTREAM_HOT_PROMOTE_MAX_MEMBERS)."""


def targets(client: Store, prefix: str, loading: Loading) -> None:
    """After the last page: the seq each shard must be caught up to (none where it stayed seq0)."""
    for name, seq0 in loading.seq0.items():
        seq1 = int(client.get(BoardKeys(prefix, name).seq) or 0)
        loading.hot.targets[name] = seq1 if seq1 > seq0 else 0


@dataclass
class Kept:
    """A promoted board in memory: its registration's tokens and when it was last renewed."""

    tokens: dict[str, str]
    renewed: float
    due: float = 0.0  # when it is renewed next


def renew(client: Store, prefix: str, kept: Kept, ttl_ms: int = REGISTRATION_TTL_MS) -> bool:
    """Keep the registration alive; False if it lapsed meanwhile (another token: writes were made
    unpublished), so memory can't be trusted."""
    for name, token in kept.tokens.items():
        if promotion.register(client, BoardKeys(prefix, name), ttl_ms) != token:
            return False
    return True
