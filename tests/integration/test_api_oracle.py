"""Every read route against an independent model, on boards written through the worker's own
apply path: both orders, both tie modes, asc boards, empty boards, last pages, `me` outside
the page, around at both ends, past periods via `period` and via `at`."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from common.boards import load_boards
from common.events import parse_message, ts_ceiling
from tests.helpers import BOTH_TOPOLOGIES
from tests.oracle import (
    ASC,
    BOARDS,
    ORACLE_BOARDS_RANGED,
    RANGED_BOARDS,
    SHARDED_BOARDS,
    TIE,
    TZ,
    Model,
    compare_redis,
    generate,
    now_ms,
    run_model,
)
from worker.apply import Applier

pytestmark = [pytest.mark.integration, pytest.mark.slow, BOTH_TOPOLOGIES]


@pytest.fixture
def written(make_settings, tmp_path, rclient):
    """20k events applied through the worker's Applier; the model of the same stream."""
    path = tmp_path / "boards.yaml"
    path.write_text(ORACLE_BOARDS_RANGED)
    settings = make_settings(boards=path)
    boards = load_boards(path)
    start = now_ms()
    messages = list(
        generate(seed=21, total=20_000, now_ms=start, boards=[*BOARDS, *RANGED_BOARDS, *SHARDED_BOARDS])
    )
    applier = Applier(rclient, boards, settings.key_prefix, 600_000)
    for i in range(0, len(messages), 500):
        pairs = []
        for msg in messages[i : i + 500]:
            result = parse_message(msg.value, boards, ts_ceiling(86_400))
            pairs += [(event, event.ts or 0) for event in result.events]
        applier.apply(pairs)
    model = run_model(messages, start)
    compare_redis(rclient, settings.key_prefix, model)  # the data under the API is the model's
    return settings, model


def view(model: Model, board: str, inst: str, reverse: bool) -> list[tuple[str, float]]:
    members = model.state.get(board, {}).get(inst, {})
    order = model.ranking(board, inst)
    rows = [(m, members[m][0]) for m in order]
    return rows[::-1] if reverse else rows


def shared_rank(rows: list[tuple[str, float]], index: int, reverse_asc: bool) -> int:
    """1 + members strictly better in the view: higher first unless the view is ascending."""
    score = rows[index][1]
    return 1 + sum(1 for _, s in rows if (s < score if reverse_asc else s > score))


def expected_items(rows, start, stop, *, ties, ascending, metas) -> list[dict[str, Any]]:
    out = []
    for i in range(start, min(stop, len(rows))):
        member, score = rows[i]
        rank = i + 1 if ties == "ordinal" else shared_rank(rows, i, ascending)
        item: dict[str, Any] = {"rank": rank, "member": member, "score": score}
        if member in metas:
            item["meta"] = orjson.loads(metas[member])
        out.append(item)
    return out


def query_for(inst: str, rng: random.Random) -> str:
    """window/period or window/at for an instance, the period found independently."""
    if inst == "total":
        return "window=total"
    window, pid = inst.split(":", 1)
    if rng.random() < 0.5:
        return f"window={window}&period={pid}"
    if window == "hour":
        start = datetime.strptime(pid, "%Y-%m-%dT%H").replace(tzinfo=TZ)
    elif window == "week":
        start = datetime.strptime(pid + "-1", "%G-W%V-%u").replace(tzinfo=TZ)
    else:
        fmt = {"day": "%Y-%m-%d", "month": "%Y-%m", "year": "%Y"}[window]
        start = datetime.strptime(pid, fmt).replace(tzinfo=TZ)
    return f"window={window}&at={int(start.timestamp() * 1000) + rng.randrange(3_600_000)}"


def normalise(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**i, "score": float(i["score"]) if i["score"] is not None else None} for i in items]


async def check_board(http: TestClient[Any, Any], model: Model, board: str, rng: random.Random) -> int:
    kind = board.split(":", maxsplit=1)[0]
    natural_asc = kind in ASC
    metas = model.meta.get(board, {})
    instances = [i for i, m in model.state.get(board, {}).items() if m] or ["total"]
    checked = 0
    for inst in instances:
        where = query_for(inst, rng)
        for reverse in (False, True):
            order = ("desc" if natural_asc else "asc") if reverse else ("asc" if natural_asc else "desc")
            ascending = order == "asc"
            rows = view(model, board, inst, reverse)
            rows = [(m, float(s)) for m, s in rows]
            for ties in ("ordinal", "shared"):
                q = f"{where}&order={order}&ties={ties}"
                last = max(len(rows) - 7, 0)
                opts = {"ties": ties, "ascending": ascending, "metas": metas}
                for offset, limit in ((0, 10), (5, 20), (last, 7), (len(rows), 5)):
                    me = rows[-1][0] if rows else "nobody"
                    resp = await http.get(f"/v1/boards/{board}/top?{q}&offset={offset}&limit={limit}&me={me}")
                    body = await resp.json()
                    assert resp.status == 200, body
                    assert body["total"] == len(rows)
                    assert body["seq"] == model.seq.get(board, 0) and body["source"] == "redis"
                    want = expected_items(rows, offset, offset + limit, **opts)
                    assert normalise(body["items"]) == normalise(want), (board, inst, q, offset)
                    want_me = expected_items(rows, len(rows) - 1, len(rows), **opts) if rows else []
                    assert normalise([body["me"]] if body["me"] else []) == normalise(want_me)
                    checked += 1
                for index in sorted({0, len(rows) - 1, len(rows) // 2} if rows else set()):
                    member = rows[index][0]
                    resp = await http.get(f"/v1/boards/{board}/members/{member}?{q}")
                    body = await resp.json()
                    one = expected_items(rows, index, index + 1, **opts)[0]
                    assert normalise([{k: body[k] for k in one}]) == normalise([one])
                    resp = await http.get(f"/v1/boards/{board}/members/{member}/around?{q}&n=3")
                    body = await resp.json()
                    want_around = expected_items(rows, max(index - 3, 0), index + 4, **opts)
                    assert normalise(body["items"]) == normalise(want_around), (board, inst, "around", index)
                    checked += 2
                asked = [m for m, _ in rng.sample(rows, min(len(rows), 5))] + ["ghost"]
                resp = await http.post(f"/v1/boards/{board}/members/lookup?{q}", json={"members": asked})
                body = await resp.json()
                index_of = {m: i for i, (m, _) in enumerate(rows)}
                want_lookup = [
                    expected_items(rows, index_of[m], index_of[m] + 1, **opts)[0]
                    if m in index_of
                    else {"rank": None, "member": m, "score": None}
                    for m in asked
                ]
                assert normalise(body["items"]) == normalise(want_lookup)
                checked += 1
                probe = rows[len(rows) // 3][1] if rows else 0.0
                resp = await http.get(f"/v1/boards/{board}/rank?{q}&score={probe}")
                body = await resp.json()
                better = sum(1 for _, s in rows if (s < probe if ascending else s > probe))
                equal = sum(1 for _, s in rows if s == probe)
                first = TIE[kind] == "first" and ties == "ordinal"
                assert body["rank"] == better + (equal if first else 0) + 1, (board, inst, q, probe)
                checked += 1
        scores = sorted(s for _, s in view(model, board, inst, False))
        low, high = (scores[len(scores) // 4], scores[3 * len(scores) // 4]) if scores else (0, 1)
        resp = await http.get(f"/v1/boards/{board}/count?{where}&min={low}&max={high}")
        body = await resp.json()
        assert body["count"] == sum(1 for s in scores if low <= s <= high)
        checked += 1
    return checked


def test_every_route_matches_the_model(written):
    settings, model = written
    rng = random.Random(5)

    async def go() -> int:
        app = create_app(settings, load_boards(settings.boards))
        async with TestClient(TestServer(app)) as http:
            total = 0
            for board in [*BOARDS, *RANGED_BOARDS, *SHARDED_BOARDS, "gift:empty-room"]:
                total += await check_board(http, model, board, rng)
            resp = await http.get("/v1/boards/gift:empty-room/members/nobody")
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "member_not_found"
            return total

    checked = asyncio.run(go())
    assert checked > 3000
