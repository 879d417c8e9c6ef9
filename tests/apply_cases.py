"""Hypothesis strategies for tests/integration/test_apply_properties.py: every event the
contract accepts, on board types of every shape, in zones with and without DST."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

from tests.apply_model import (
    BASE_NOW,
    CALENDAR,
    DAY_MS,
    EXACT,
    GRACES,
    HOUR_MS,
    MAX_ID,
    MAX_MEMBER,
    MAX_META,
    MEMBER_CHARS,
    MIN_TS,
    RETENTIONS,
    SCOPES,
    SKEW_S,
    WINDOWS,
    ZONES,
    Case,
    Message,
    TypeSpec,
    offset_changes,
    period_end,
)

EDGE_SCORES = (
    EXACT,
    -EXACT,
    EXACT - 1,
    -(EXACT - 1),
    2**52,
    -(2**52),
    2**52 - 0.5,
    1,
    -1,
    0,
    0.5,
    -0.5,
    0.1,
    -0.0,
    5e-324,
    1e-300,
    1e15 + 0.25,
)
SCORES = st.one_of(
    st.integers(-1000, 1000),
    st.sampled_from(EDGE_SCORES),
    st.integers(-EXACT, EXACT),
    st.floats(-1000, 1000, allow_nan=False, allow_infinity=False),
    st.floats(-EXACT, EXACT, allow_nan=False, allow_infinity=False),
)
LIMIT_SCORES = st.one_of(st.sampled_from(EDGE_SCORES), st.integers(-3, 3), st.integers(-EXACT, EXACT))

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63) + 1, 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def compact_size(document: object) -> int:
    return len(json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode())


def _padded_meta(name: str) -> dict[str, Any]:
    """A profile of exactly MAX_META bytes as compact JSON."""
    bare = {"name": name, "pad": ""}
    return {"name": name, "pad": "x" * (MAX_META - compact_size(bare))}


METAS = st.one_of(
    st.dictionaries(st.text(max_size=10), _json_value, max_size=5).filter(
        lambda m: compact_size(m) <= MAX_META
    ),
    st.text(max_size=8).map(_padded_meta),
)
ABSENT = object()


def _type_specs(name: str) -> st.SearchStrategy[TypeSpec]:
    @st.composite
    def build(draw: st.DrawFn) -> TypeSpec:
        windows = draw(
            st.one_of(
                st.just(WINDOWS),
                st.lists(st.sampled_from(WINDOWS), min_size=1, max_size=len(WINDOWS), unique=True).map(tuple),
            )
        )
        retention = {w: draw(st.sampled_from(RETENTIONS)) for w in windows if w != "total"}
        return TypeSpec(
            name=name,
            order=draw(st.sampled_from(("desc", "asc"))),
            tie=draw(st.sampled_from(("first", "last", "none"))),
            windows=windows,
            retention=retention,
            max_members=draw(st.one_of(st.none(), st.integers(1, 4))),
            grace=draw(st.sampled_from(list(GRACES))),
        )

    return build()


def _now_anchors(zone: str) -> list[int]:
    """Instants `now` is drawn near: a plain one, the next two offset changes, period boundaries."""
    tz = ZoneInfo(zone)
    anchors = [BASE_NOW, *[t for t in offset_changes(zone) if t > BASE_NOW][:2]]
    anchors += [period_end(tz, window, BASE_NOW) for window in ("hour", "day", "year")]
    return anchors


def _ts_anchors(zone: str, now: int, graces: Sequence[int]) -> list[int]:
    """Instants events are drawn near: the bounds, now, offset changes, boundaries near now."""
    tz = ZoneInfo(zone)
    ceiling = now + SKEW_S * 1000  # the latest accepted ts (inclusive)
    points = {MIN_TS, ceiling, now, *offset_changes(zone)}
    for window in CALENDAR:
        for back in (0, HOUR_MS, DAY_MS, 8 * DAY_MS, 40 * DAY_MS, 400 * DAY_MS, *graces):
            points.add(period_end(tz, window, now - back))
            points.add(period_end(tz, window, now - back - 1))
    return sorted(p for p in points if MIN_TS <= p <= ceiling)


_DELTAS = (0, -1, 1, -60_000, 60_000, -HOUR_MS, HOUR_MS, -1_800_000, 1_800_000)


def _timestamps(zone: str, now: int, graces: Sequence[int]) -> st.SearchStrategy[int]:
    ceiling = now + SKEW_S * 1000  # the latest accepted ts (inclusive)
    anchors = _ts_anchors(zone, now, graces)

    def near(anchor: int, delta: int) -> int:
        return min(max(anchor + delta, MIN_TS), ceiling)

    return st.one_of(
        st.integers(MIN_TS, ceiling),
        st.builds(near, st.sampled_from(anchors), st.sampled_from(_DELTAS)),
        st.integers(max(MIN_TS, now - 3 * DAY_MS), ceiling),  # open periods
    )


def _ids(n: int) -> st.SearchStrategy[str]:
    # "<n>" and "<n>~..." never collide for different n: a repeated id is always on purpose
    return st.one_of(
        st.just(str(n)),
        st.text(max_size=MAX_ID).map(lambda s: f"{n}~{s}"[:MAX_ID]),
        st.just(f"{n}~".ljust(MAX_ID, "\u00e9")),
    )


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    max_messages: int = 6,
    max_array: int = 12,
    array_sizes: st.SearchStrategy[int] | None = None,
    scores: st.SearchStrategy[float] = SCORES,
    max_types: int = 3,
    max_pool: int = 5,
) -> Case:
    zone = draw(st.sampled_from(ZONES))
    types = [draw(_type_specs(f"t{i}")) for i in range(draw(st.integers(1, max_types)))]
    graces = sorted({GRACES[spec.grace] for spec in types})
    offsets = [0, -1, 1, 1_800_000, HOUR_MS + 1, *graces, *(g - 1 for g in graces), *(g + 1 for g in graces)]
    now = draw(st.sampled_from(_now_anchors(zone))) + draw(st.sampled_from(offsets))
    boards: list[str] = []
    for spec in types:
        boards += [
            spec.name + s
            for s in draw(st.lists(st.sampled_from(SCOPES), min_size=1, max_size=2, unique=True))
        ]
    hot = draw(st.one_of(st.none(), st.sampled_from(boards)))
    fixed = ("m", "alice", "Zo\u00eb \U0001f642", "b" * MAX_MEMBER, "\u4e2d\u6587")
    members = st.one_of(st.sampled_from(fixed), st.text(MEMBER_CHARS, min_size=1, max_size=MAX_MEMBER))
    pool = draw(st.lists(members, min_size=1, max_size=max_pool, unique=True))
    timestamps = _timestamps(zone, now, graces)
    sizes = array_sizes if array_sizes is not None else st.integers(1, max_array)

    produced: list[dict[str, Any]] = []
    counter = itertools.count()

    def new_event() -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": draw(_ids(next(counter))),
            "board": draw(st.sampled_from(boards)),
            "member": draw(st.sampled_from(pool)),
        }
        op = draw(st.sampled_from((None, "incr", "set", "best", "delete")))
        if op is not None:
            event["op"] = op
        if op != "delete" or draw(st.booleans()):
            event["score"] = draw(scores)
        if draw(st.integers(0, 7)) < 7:
            event["ts"] = draw(timestamps)
        meta = draw(st.one_of(st.just(ABSENT), st.just(ABSENT), st.none(), METAS))
        if meta is not ABSENT:
            event["meta"] = meta
        return event

    def next_event() -> dict[str, Any]:
        kind = draw(st.sampled_from(("new", "new", "new", "resend", "same_id", "id_elsewhere")))
        if kind == "new" or not produced:
            event = new_event()
        elif kind == "resend":  # the same event again: a redelivery or a producer retry
            event = dict(draw(st.sampled_from(produced)))
        else:
            earlier = draw(st.sampled_from(produced))
            event = new_event()
            event["id"] = earlier["id"]
            if kind == "same_id":  # the same id on the same board, other content: still a duplicate
                event["board"] = earlier["board"]
        produced.append(event)
        return event

    messages: list[Message] = []
    for _ in range(draw(st.integers(1, max_messages))):
        array = draw(st.booleans()) if array_sizes is None else True
        size = draw(sizes) if array else 1
        if size <= 50:
            events = [next_event() for _ in range(size)]
        else:
            # every choice of a 500-event array drawn one by one overflows Hypothesis' buffer:
            # draw pools of each part, then fill the array from them with a seeded Random
            events = _filled(
                draw(st.randoms(use_true_random=True)),
                size,
                templates=[new_event() for _ in range(draw(st.integers(1, 8)))],
                scores=draw(st.lists(scores, min_size=1, max_size=12)),
                timestamps=draw(st.lists(timestamps, min_size=1, max_size=40)),
                metas=draw(st.lists(METAS, max_size=3)),
            )
        messages.append(Message(draw(timestamps), events, array))
    batches: list[list[Message]] = [[messages[0]]]
    for message in messages[1:]:
        if draw(st.booleans()):
            batches.append([])
        batches[-1].append(message)
    return Case(zone, now, types, hot, batches)


def _filled(
    rnd: random.Random,
    size: int,
    *,
    templates: list[dict[str, Any]],
    scores: list[float],
    timestamps: list[int],
    metas: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """`size` events varied from `templates` (which give boards and members): every op, scores
    and times from the pools, some metas, and about 10% repeated ids."""
    events: list[dict[str, Any]] = []
    for n in range(size):
        if events and rnd.random() < 0.1:
            events.append(dict(rnd.choice(events)))
            continue
        template = rnd.choice(templates)
        event = {"id": f"f{n}", "board": template["board"], "member": template["member"]}
        op = rnd.choice((None, "incr", "set", "best", "delete"))
        if op is not None:
            event["op"] = op
        if op != "delete":
            event["score"] = rnd.choice(scores)
        if rnd.random() < 0.9:
            event["ts"] = rnd.choice(timestamps)
        if metas and rnd.random() < 0.2:
            event["meta"] = rnd.choice(metas)
        events.append(event)
    return events
