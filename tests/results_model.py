"""What each period result of tests/integration/test_period_results.py must be, and the checks of
what the workers made against it. The results topic must hold exactly one record per (board,
window, period) of a declared window in which an event counted (a delete adds no member: it
registers no result), each equal to the final standing of that period in the independent models
(tests/period_model.py for hour and day, tests/rolling_model.py for last_3h), fed with every event
of the stream (tests/results_stream.py): its member count and its top 5 (rank, member, score, meta)
in the board's order, closed_at its end; its seq no older than the period's last counted event and
no newer than the board's last. Each period's marker says `sent` at that record's partition and
offset. The boards' total windows count every event, late ones too."""

from __future__ import annotations

import itertools
from typing import Any, cast
from zoneinfo import ZoneInfo

import orjson
import redis

from chaos.traffic import Record
from common.settings import Settings
from tests.period_model import BoardType, Calendar, Span
from tests.period_model import Model as PeriodModel
from tests.redis_layout import read_general
from tests.results_stream import (
    DECLARED,
    GIFT,
    GIFT_WINDOWS,
    GRACE,
    META_BOARD,
    PLAIN,
    PLAIN_WINDOWS,
    RETENTION,
    SETTLE_MS,
    SKEW,
    TOP,
    ZONE,
)
from tests.rolling_model import DAY
from tests.rolling_model import BoardType as RollingType
from tests.rolling_model import Model as RollingModel


def result_key(board: str, window: str, period: str) -> str:
    return f"{board}|{window}|{period}"


class Expect:
    """Both models fed with every event, and what they say each result must be."""

    def __init__(self, start: int) -> None:
        tz = ZoneInfo(ZONE)
        calendar = Calendar(tz, start - 3 * DAY, start + 40 * DAY, {})
        types = {
            "gift": BoardType("gift", GIFT_WINDOWS[:-1], RETENTION, GRACE),
            "plain": BoardType("plain", PLAIN_WINDOWS, {"hour": 72}, GRACE),
        }
        self.periods = PeriodModel(calendar, types, SKEW)
        self.rolling = RollingModel(
            tz, start - 70 * DAY, start + 70 * DAY, {"gift": RollingType("gift", GIFT_WINDOWS)}, SKEW
        )
        self.due: dict[str, int] = {}  # result key -> when it is due: a result must come
        self.closed_at: dict[str, int] = {}
        self.last_seq: dict[str, int] = {}  # result key -> its board's seq after its last counted event
        self.snapshots: dict[str, dict[str, Any]] = {}  # result key -> the result when its period ended
        self.beyond = 0  # events late beyond the grace of their hour
        self.log: list[tuple[int, int, dict[str, Any]]] = []

    def span(self, window: str, period: str) -> Span:
        calendar = self.periods.calendar
        return calendar.spans[window][calendar.by_id[window][period]]

    def apply(self, event: dict[str, Any], now: int, raw: bytes) -> None:
        board, ts, op = event["board"], event["ts"], event.get("op", "incr")
        self.periods.apply(event, ts, now, raw)
        self.log.append((now, self.periods.boards[board].seq, event))
        assert not self.periods.dead, self.periods.dead
        seq = self.periods.boards[board].seq
        if not board.startswith("gift:"):
            return
        assert self.rolling.apply(event, ts, now)
        assert self.rolling.seq(board) == seq
        spec = self.periods.types["gift"]
        for window in ("hour", "day"):
            span = self.periods.calendar.at("gift", window, ts)
            assert span is not None
            if now >= min(span.end + GRACE, self.periods.expiry(spec, window, span)):
                self.beyond += window == "hour"
                continue
            self._counted(result_key(board, window, span.id), span.end, seq, op)
        if op == "delete":  # it takes the member out of the window, wherever it is: no result due
            return
        hours = self.rolling.buckets["h"]
        for q in range(hours.at(ts), hours.at(ts) + 3):  # the periods summing its bucket
            period = hours[q]
            if now < self.rolling.limit(board, "last_3h", period.id):
                self._counted(result_key(board, "last_3h", period.id), period.end, seq, op)

    def _counted(self, key: str, end: int, seq: int, op: str) -> None:
        self.last_seq[key] = seq
        if op != "delete":  # a delete adds no member: it registers no result (worker/apply.py)
            self.due.setdefault(key, end + GRACE + SETTLE_MS)
            self.closed_at[key] = end

    def snapshot(self, now: int) -> None:
        """Each result as it stands when its period ends (late events may change it still)."""
        for key, end in self.closed_at.items():
            if end <= now and key not in self.snapshots:
                self.snapshots[key] = self.result(key)

    def expiry(self, key: str) -> int:
        board, window, period = key.split("|")
        if window == "last_3h":
            return self.rolling.expiry(board, window, period)
        assert window in DECLARED, f"a result is due for {key}, whose window declares none"
        return self.periods.expiry(self.periods.types["gift"], window, self.span(window, period))

    def result(self, key: str) -> dict[str, Any]:
        """The record's body without its seq."""
        board, window, period = key.split("|")
        if window == "last_3h":
            ranking: list[tuple[str, float]] = [
                (item.member, item.score) for item in self.rolling.ranking(board, window, period)
            ]
            end = self.rolling.span(window, period).end
        else:
            ranking = [(m, float(s)) for m, s in self.periods.ranking(board, f"{window}:{period}")]
            end = self.span(window, period).end
        top: list[dict[str, Any]] = []
        for rank, (member, score) in enumerate(ranking[:TOP], 1):
            top.append({"rank": rank, "member": member, "score": score})
            if board == META_BOARD:
                top[-1]["meta"] = {"name": f"Member {member}"}
        return {"board": board, "window": window, "period": period, "closed_at": end,
                "members": len(ranking), "top": top}  # fmt: skip


def check_records(records: list[Record], expect: Expect, client: redis.Redis, settings: Settings) -> None:
    by_key: dict[str, list[Record]] = {}
    for msg in records:
        by_key.setdefault((msg.key or b"").decode(), []).append(msg)
    twice = {k: len(v) for k, v in by_key.items() if len(v) > 1}
    assert not twice, f"results sent more than once: {twice}"
    assert not [k for k in by_key if k.startswith(f"{PLAIN}|")], "a type without period_results emitted"
    assert {k.split("|")[1] for k in by_key} <= set(DECLARED)
    missing, extra = sorted(set(expect.due) - set(by_key)), sorted(set(by_key) - set(expect.due))
    assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    assert len(by_key) > 300
    windows = {w: sum(1 for k in by_key if k.split("|")[1] == w) for w in DECLARED}
    assert windows["day"] >= 3 * len(GIFT), windows
    final_seq = {board: state.seq for board, state in expect.periods.boards.items()}
    for key, (msg,) in sorted(by_key.items()):
        body = orjson.loads(msg.value or b"")
        seq = body.pop("seq")
        board = body["board"]
        assert isinstance(seq, int) and expect.last_seq[key] <= seq <= final_seq[board], (key, seq)
        want = expect.result(key)
        assert body == want, diagnose(key, body, expect, client, settings.key_prefix)
        instance = f"{want['window']}:{want['period']}"
        marker = cast(bytes | None, client.get(f"{settings.key_prefix}{{{board}}}:rp:{instance}"))
        assert marker is not None, key
        state, partition, offset, marked_seq, _ = marker.decode().split(":")
        sent = (state, int(partition), int(offset), int(marked_seq))
        assert sent == ("sent", msg.partition, msg.offset, seq), (key, marker)


def check_totals(expect: Expect, client: redis.Redis, settings: Settings) -> None:
    """total counts every event, late ones too."""
    for board, state in expect.periods.boards.items():
        stored = read_general(client, f"{settings.key_prefix}{{{board}}}", "total", asc=False, tie="first")
        want = {member: (float(score), tie) for member, (score, tie) in state.instances["total"].items()}
        assert stored == want, board


def diagnose(key: str, body: dict[str, Any], expect: Expect, client: redis.Redis, prefix: str) -> str:
    """For a result that differs from the model's: the period in Redis (a calendar one) and the
    events of the members in question, with the clock when each was applied."""
    board, window, period = key.split("|")
    want = expect.result(key)
    members = {item["member"] for item in body["top"]} ^ {item["member"] for item in want["top"]}
    empty: dict[str, Any] = {}
    for got, wanted in itertools.zip_longest(body["top"], want["top"], fillvalue=empty):
        if got != wanted:
            members |= {item["member"] for item in (got, wanted) if item}
    lines = [f"{key}: got {body}", f"{key}: the model's {want}"]
    if window == "last_3h":
        hours = expect.rolling.buckets["h"]
        low, high = hours[hours.find(period) - 2].start, hours[hours.find(period)].end
    else:
        span = expect.span(window, period)
        low, high = span.start, span.end
        stored = read_general(client, f"{prefix}{{{board}}}", f"{window}:{period}", asc=False, tie="first")
        lines.append(f"in Redis: {stored}")
    for now, seq, event in expect.log:
        if event["board"] == board and event["member"] in members:
            where = "in" if low <= event["ts"] < high else "out"
            lines.append(f"applied at clock {now} (seq {seq}), ts {where}side the period: {event}")
    return "\n".join(lines)
