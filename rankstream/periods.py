"""`rankstream periods <board>`: the board's closed periods (of the windows whose results it emits)
and whether each result was published; `--republish P` re-emits one on purpose.

A republished record is the first one again: the same key (so a consumer that compacts the topic,
or dedupes by key, keeps one), the same partition, the same seq; its top is read from Redis again
(the period is sealed, so its members, scores and ranks change only by an erase since; each
member's meta is its current one, latest wins, as every read returns it). It carries the header
`rankstream-republished: 1`. Only a published result can be republished: one not yet sent will be,
by the workers, once it is due."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import KafkaError, Message

from common.boards import BoardsConfig, BoardType, Window, load_boards
from common.clients import kafka_producer, redis_client
from common.clock import service_clock
from common.errors import ConfigError, InfrastructureError, RankstreamError
from common.periods import Period, parse_period, recent_periods
from common.results import MAX_RESULT_BYTES, read_result, result_key
from common.settings import Settings
from common.store import periodmark
from common.store.keys import BoardKeys, results_due, window_instance
from common.store.shards import shard_names
from common.store.topology import Store
from common.windows import SEASON_WINDOW
from rankstream.admin import board_type_of
from rankstream.show import table

DELIVERY_TIMEOUT_S = 30.0
HEADER = ("rankstream-republished", b"1")


@dataclass(frozen=True, slots=True)
class Closed:
    window: str
    period: Period
    state: str  # published | publishing | sealed | pending
    detail: str


def _declared(board_type: BoardType, window: str | None) -> list[Window]:
    if board_type.league is not None and window == SEASON_WINDOW:
        raise ConfigError(f"board type {board_type.name!r} is a league: its seasons' records are not "
                          "listed nor republished by this command yet (docs/leagues.md)")  # fmt: skip
    if board_type.results is None:
        raise ConfigError(f"board type {board_type.name!r} declares no period_results: it emits no results")
    declared = sorted(board_type.results.windows)
    if window is not None:
        if window not in declared:
            raise ConfigError(f"board type {board_type.name!r} emits no results for window {window!r} "
                              f"(period_results: {', '.join(declared)})")  # fmt: skip
        declared = [window]
    return [board_type.window(name) for name in declared]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def closed_periods(
    settings: Settings, client: Store, board: str, window: str | None = None, now_ms: int | None = None
) -> list[Closed]:
    """Newest first per window: every closed period Redis still keeps that has a result (an
    event counted in it), and its result's state."""
    boards = load_boards(settings.boards)
    board_type = board_type_of(boards, board)
    now = service_clock(settings)() if now_ms is None else now_ms  # a test's clock file too
    keys = BoardKeys(settings.key_prefix, shard_names(board, board_type.shards)[0])  # its result's marker
    out: list[Closed] = []
    for win in _declared(board_type, window):
        kept = recent_periods(win, board_type.retention[win.name], now, now, boards.timezone)
        for period, _ in kept:
            if period.end_ms > now:
                continue
            mark = periodmark.read_mark(client, keys, window_instance(win.name, period.id))
            due = client.zscore(results_due(settings.key_prefix), result_key(board, win.name, period.id))
            if mark.sealed or due is not None:
                out.append(Closed(win.name, period, *_state(mark, due)))
    return out


def _state(mark: periodmark.Mark, due: float | None) -> tuple[str, str]:
    if mark.state == "sent":
        detail = f"partition {mark.partition} offset {mark.offset} seq {mark.seq} at {_iso(mark.emitted_ms)}"
        return "published", detail
    if mark.state == "sending":
        return "publishing", "being produced (a worker that took over checks the topic first)"
    if mark.state == "sealed":
        return "sealed", "final; being read"
    return "pending", f"due at {_iso(int(due or 0))}"


def show_periods(settings: Settings, board: str, window: str | None = None) -> str:
    rows = [
        [c.window, c.period.id, _iso(c.period.end_ms), c.state, c.detail]
        for c in closed_periods(settings, redis_client(settings), board, window)
    ]
    if not rows:
        return f"{board}: no closed period with a result (none kept, or nothing counted in them)"
    return table(rows, ["window", "period", "closed_at", "result", "detail"])


def _find_window(board_type: BoardType, period: str, window: str | None, tz_boards: BoardsConfig) -> Window:
    matches = []
    for win in _declared(board_type, window):
        try:
            parse_period(win, period, tz_boards.timezone)
        except ValueError:
            continue
        matches.append(win)
    if not matches:
        raise ConfigError(f"{period!r} names no period of a window with period_results")
    if len(matches) > 1:
        names = ", ".join(w.name for w in matches)
        raise ConfigError(f"{period!r} names a period of several windows ({names}): add --window")
    return matches[0]


def republish(settings: Settings, board: str, period: str, window: str | None = None) -> str:
    """Produce the period's published result again (same key, partition and seq)."""
    boards = load_boards(settings.boards)
    board_type = board_type_of(boards, board)
    win = _find_window(board_type, period, window, boards)
    named = parse_period(win, period, boards.timezone)
    client = redis_client(settings)
    lead = shard_names(board, board_type.shards)[0]  # a sharded board's first shard holds the marker
    mark = periodmark.read_mark(
        client, BoardKeys(settings.key_prefix, lead), window_instance(win.name, named.id)
    )
    if mark.state != "sent":
        raise RankstreamError(
            f"the result of {win.name} {named.id} is not published ({mark.state}): "
            "the workers publish it once it is due; nothing republished"
        )
    result = read_result(
        client, settings.key_prefix, board_type, board, window=win, period=named, seq=mark.seq
    )
    producer = kafka_producer(
        settings,
        {"enable.idempotence": True, "acks": "all", "message.max.bytes": MAX_RESULT_BYTES + 65_536},
        defaults={"compression.type": "zstd"},
    )
    name = settings.topic_results
    topic = producer.list_topics(name, timeout=DELIVERY_TIMEOUT_S).topics.get(name)
    if topic is None or topic.error is not None or mark.partition not in topic.partitions:
        raise InfrastructureError(f"topic {name} or its partition {mark.partition} is missing")
    partition = mark.partition  # the first record's, whatever the topic's partitions are now
    reports: list[tuple[KafkaError | None, int]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg.offset() or 0))

    producer.produce(settings.topic_results, result.encode(), result.key.encode(), partition,
                     on_delivery=delivered, headers=[HEADER])  # fmt: skip
    producer.flush(DELIVERY_TIMEOUT_S)
    if not reports or reports[0][0] is not None:
        raise InfrastructureError(
            f"republishing {result.key}: {reports[0][0] if reports else 'no delivery report'}"
        )
    return f"republished {result.key} to {settings.topic_results} [{partition}] at offset {reports[0][1]}"
