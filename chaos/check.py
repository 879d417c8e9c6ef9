"""The checker: the model fed with the stream read back from the broker, compared exactly with
Redis, with every API node's answers (a hot board's from its memory, the rest from Redis), with
the dead-letter topic and with the period-result topic. It counts what users would call lost,
doubled and wrong, and names the first differences."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis

from chaos.config import HOT, TIERS, kind
from chaos.model import Board, DeadLetter, Model, ranking
from chaos.servers import PREFIX, ApiNode, Servers
from chaos.stream import BAD_HEADER, parse_bad
from chaos.traffic import Record, read_topic
from tests.redis_layout import read_general

RESULTS_SETTLE_MS = 5_000  # the emitter's turn after a period's grace has passed
SHOWN = 40
PAGE = 500  # the most a page holds


@dataclass
class Verdict:
    """What one comparison found: counts users care about, and the first differences."""

    events: int = 0
    applied: int = 0
    dead_letters: int = 0
    results: int = 0
    answers: int = 0
    lost: int = 0
    doubled: int = 0
    wrong: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < SHOWN:
            self.problems.append(text)

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.wrong or self.problems)


def _seq(v: Verdict, where: str, seq: int, b: Board) -> None:
    """A board's seq (events applied) against the model's: what it lacks was lost, what it has
    over was doubled."""
    if seq != b.seq:
        v.lost += max(0, b.seq - seq)
        v.doubled += max(0, seq - b.seq)
        v.problem(f"{where} {b.name}: seq {seq}, the model's {b.seq}")


def build_model(records: Iterable[Record], start_ms: int) -> Model:
    """The model fed with `records` in their order: one partition after another, each in offset
    order."""
    model = Model(start_ms)
    for r in records:
        bad = parse_bad(r.headers.get(BAD_HEADER))
        whole = [reason for index, reason in bad if index is None]
        if whole:
            model.dead_letter(r.partition, r.offset, None, whole[0])
            continue
        assert r.value is not None
        doc = orjson.loads(r.value)
        items, indexes = (doc, list(range(len(doc)))) if isinstance(doc, list) else ([doc], [None])
        refused = dict(bad)
        for event, index in zip(items, indexes, strict=True):
            if index in refused:
                model.dead_letter(r.partition, r.offset, index, refused[index])
            else:
                model.apply(event, r.timestamp, r.partition, r.offset, index)
    return model


def _query(inst: str) -> str:
    if inst == "total":
        return "window=total"
    window, pid = inst.split(":", 1)
    return f"window={window}&period={pid}"


def _page(node: ApiNode, path: str) -> dict[str, Any]:
    status, body = node.get(path)
    if status != 200:
        raise AssertionError(f"{node.base}{path}: {status} {body}")
    return cast(dict[str, Any], body)


def _pages(node: ApiNode, path: str, size: int) -> dict[str, Any]:
    """Every page of a ranking of `size` members: the first page's answer, its items all of them."""
    first = _page(node, f"{path}&limit={PAGE}")
    for offset in range(PAGE, size, PAGE):
        first["items"] += _page(node, f"{path}&limit={PAGE}&offset={offset}")["items"]
    return first


def _compare(v: Verdict, what: str, want: list[tuple[str, float]], body: dict[str, Any], *,
             meta: dict[str, Any] | None, total_key: str = "total") -> None:  # fmt: skip
    v.answers += 1
    got = [(item["member"], float(item["score"]), item["rank"]) for item in body["items"]]
    expected = [(m, float(s), r) for r, (m, s) in enumerate(want, 1)]
    if got != expected:
        wrong = sum(a != b for a, b in zip(got, expected, strict=False)) + abs(len(got) - len(expected))
        v.wrong += wrong
        first = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
            min(len(got), len(expected)),
        )
        v.problem(
            f"{what}: {wrong} entries differ, first at {first}: got {got[first : first + 2]} want {expected[first : first + 2]}"
        )
    if body.get(total_key) != len(want):
        v.wrong += 1
        v.problem(f"{what}: {total_key} {body.get(total_key)} != {len(want)}")
    if meta is not None:
        for item in body["items"]:
            if item.get("meta") != meta.get(item["member"]):
                v.wrong += 1
                v.problem(
                    f"{what}: meta of {item['member']} {item.get('meta')} != {meta.get(item['member'])}"
                )


def check_node(v: Verdict, node: ApiNode, model: Model, name: str) -> None:
    """Every window instance of every board the model holds, over HTTP."""
    for board, b in sorted(model.boards.items()):
        seqs: set[int] = set()
        for inst in sorted(b.instances):
            if "@" in inst:
                season, division = inst.split(":", 1)[1].split("@")
                body = _page(
                    node, f"/v1/boards/{board}/league/divisions/{division}/top?season={season}&limit={PAGE}"
                )
                _compare(
                    v,
                    f"{name} {board} {inst}",
                    model.ranked(board, inst),
                    body,
                    meta=None,
                    total_key="members",
                )
                continue
            if inst.startswith("season:") and kind(board) == "arena":
                continue
            body = _pages(node, f"/v1/boards/{board}/top?{_query(inst)}", len(b.instances[inst]))
            _compare(v, f"{name} {board} {inst}", model.ranked(board, inst), body, meta=b.meta)
            seqs.add(int(body["seq"]))
            hot_window = inst.split(":", 1)[0] in HOT.get(board, ())
            if hot_window and body.get("source") != "memory":
                v.problem(f"{name} {board} {inst}: hot, answered from {body.get('source')}")
        if "last_2h" in b.spec.windows:
            _rolling(v, node, model, b, name)
        if kind(board) == "arena":
            _seats(v, node, b, name)
        for seq in seqs:
            _seq(v, name, seq, b)


def _rolling(v: Verdict, node: ApiNode, model: Model, b: Board, name: str) -> None:
    for _ in range(3):  # a bucket boundary between the clock's reading and the answer: again
        before = int(time.time() * 1000)
        pid, members = model.rolling(b, before)
        body = _page(node, f"/v1/boards/{b.name}/top?window=last_2h&limit={PAGE}")
        if model.rolling(b, int(time.time() * 1000))[0] == pid:
            _compare(v, f"{name} {b.name} last_2h:{pid}", ranking(b.spec, members), body, meta=b.meta)
            return
    v.problem(f"{name} {b.name} last_2h: the hour kept turning")


def _seats(v: Verdict, node: ApiNode, b: Board, name: str) -> None:
    """Each seated member's seat (a sample), and each tier's seats taken."""
    for member, order in sorted(b.seats.items())[:10]:
        body = _page(node, f"/v1/boards/{b.name}/league/members/{member}?season=s1&limit=0&n=0")
        v.answers += 1
        if body.get("joined") != order:
            v.wrong += 1
            v.problem(f"{name} {b.name}: {member} joined {body.get('joined')}, the model's {order}")
    body = _page(node, f"/v1/boards/{b.name}/league/tiers/{TIERS[0]}/divisions?season=s1")
    v.answers += 1
    seats = sum(int(d.get("seats", 0)) for d in body.get("divisions", []))
    if seats != len(b.seats):
        v.wrong += 1
        v.problem(f"{name} {b.name}: {seats} seats in the tier listing, the model's {len(b.seats)}")


def check_redis(v: Verdict, client: redis.Redis, model: Model) -> None:
    """Each unsharded board's seq and its total ranking, read from its keys (tests/redis_layout)."""
    for board, b in sorted(model.boards.items()):
        if kind(board) == "split":
            continue
        tag = f"{PREFIX}{{{board}}}"
        _seq(v, "redis", int(cast(bytes, client.get(f"{tag}:seq")) or 0), b)
        got = read_general(client, tag, "total", b.spec.order == "asc", b.spec.tie)
        want = b.instances.get("total", {})
        v.answers += 1
        for member in set(got) | set(want):
            g, w = got.get(member), want.get(member)
            if g is None or w is None or g[0] != w[0] or (b.spec.tie != "none" and g[1] != w[1]):
                v.wrong += 1
                v.problem(f"redis {board} total: {member} {g} != {w}")


def check_dead_letters(v: Verdict, records: Iterable[Record], model: Model, source_topic: str) -> None:
    got: Counter[DeadLetter] = Counter()
    for r in records:
        h = r.headers
        index = h.get("rankstream.source.index")
        if h.get("rankstream.source.topic", b"").decode() != source_topic:
            v.problem(f"dead letter from {h.get('rankstream.source.topic')!r}")
        got[DeadLetter(int(h["rankstream.source.partition"]), int(h["rankstream.source.offset"]),
                       None if index is None else int(index), h["rankstream.reason"].decode())] += 1  # fmt: skip
    want = Counter(model.dead)
    v.dead_letters = sum(want.values())
    for letter in want.keys() | got.keys():
        have, should = got[letter], want[letter]
        if have < should:
            v.lost += should - have
            v.problem(f"dead letter missing: {letter}")
        elif have > should:
            v.doubled += have - should
            v.problem(f"dead letter {'doubled' if should else 'unexpected'}: {letter} x{have}")


def check_results(v: Verdict, records: Iterable[Record], model: Model, now: int) -> None:
    """Each period result due by `now`: once, equal to the model's; none other."""
    want = model.results(now, RESULTS_SETTLE_MS)
    seen: Counter[str] = Counter()
    for r in records:
        key = (r.key or b"").decode()
        seen[key] += 1
        body = {k: val for k, val in orjson.loads(r.value or b"{}").items() if k != "seq"}
        expected = want.get(key)
        if expected is None:
            if key not in model.result_keys():
                v.doubled += 1
                v.problem(f"a result no event registered: {key}")
            continue  # not due yet by the model's reckoning: checked by a later comparison
        for item in body.get("top", []):
            item["score"] = float(item["score"])
        if body != expected:
            v.wrong += 1
            v.problem(f"result {key}: {body} != {expected}")
    v.results = len(want)
    for key in want:
        if seen[key] == 0:
            v.lost += 1
            v.problem(f"result missing: {key}")
    for key, count in seen.items():
        if count > 1:
            v.doubled += count - 1
            v.problem(f"result {key} sent {count} times")


def compare(
    servers: Servers, nodes: dict[str, ApiNode], start_ms: int, settle_s: float = 90
) -> tuple[Verdict, Model]:
    """The whole comparison, retried while it differs, for up to `settle_s` (hot boards follow
    Redis within a bound; a result is due a little after its grace)."""
    settings = servers.settings()
    stream = read_topic(servers.kafka.bootstrap, settings.topic_updates, committed_only=False)
    model = build_model(stream, start_ms)
    first_due = model.first_result_due(RESULTS_SETTLE_MS)
    if first_due is not None:  # at least one period result is compared, however short the run
        time.sleep(max(0.0, (first_due - time.time() * 1000) / 1000))
    client = servers.redis()
    deadline = time.monotonic() + settle_s
    try:
        while True:
            v = Verdict(events=model.events, applied=sum(b.seq for b in model.boards.values()))
            check_redis(v, client, model)
            for name, node in sorted(nodes.items()):
                check_node(v, node, model, name)
            check_dead_letters(
                v, read_topic(servers.kafka.bootstrap, settings.topic_dlq), model, settings.topic_updates
            )
            check_results(
                v, read_topic(servers.kafka.bootstrap, settings.topic_results), model, int(time.time() * 1000)
            )
            if v.exact or time.monotonic() > deadline:
                return v, model
            time.sleep(2)
    finally:
        client.close()
