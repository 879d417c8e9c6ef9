"""The memory order is Redis' order, for every board order and tie mode (common/store/encoding.py).

Hypothesis draws members (ids that are prefixes of each other, non-ASCII, digits that sort
unlike numbers), scores (equal ones, -0.0 and 0.0, the exact range's ends, fractions) and tie
times (equal ones, the range's ends). They are written to real Redis by apply.lua (op `set`,
the tie time as the event time) and into a HotWindow; then every page, both directions, every
member's position and strictly-better count, and the equal/better counts of every score must
be the same from Redis (common/store/reads.py) and from memory."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.hotwindow import HotWindow
from common.idwindow import fingerprint
from common.store import reads
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript
from common.store.encoding import EXACT_MAX, TIE_MAX, TieMode
from common.store.keys import BoardKeys

pytestmark = pytest.mark.integration

MEMBERS = st.text(alphabet="ab0129é€", min_size=1, max_size=4)
SCORES = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.5, -3.0, 10.0, float(EXACT_MAX), -float(EXACT_MAX), 1e-300])
TIES = st.sampled_from([0, 1, 2, 1_795_327_200_000, 1_795_327_200_001, 253_402_300_799_999, TIE_MAX])
ROWS = st.dictionaries(MEMBERS, st.tuples(SCORES, TIES), min_size=1, max_size=25)
_ids = itertools.count()


def write_redis(
    client: object, keys: BoardKeys, rows: dict[str, tuple[float, int]], mode: TieMode, desc: bool
) -> None:
    events = [
        ApplyEvent("set", member, score, tie, "", 1, 0, 0, fingerprint(f"o{next(_ids)}"))
        for member, (score, tie) in rows.items()
    ]
    request = ApplyRequest(keys, [("total", 0)], mode, desc, 0, False, "e", 60, 128, 0, [], events)
    (reply,) = ApplyScript().run_many(client, [request])  # type: ignore[arg-type]
    assert not isinstance(reply, Exception)


async def compare(
    url: str, keys: BoardKeys, rows: dict[str, tuple[float, int]], mode: TieMode, desc: bool
) -> None:
    memory = HotWindow(desc, mode)
    for seq, (member, (score, tie)) in enumerate(rows.items()):
        memory.put(member, score, tie, seq)
    memory.finish_loading()
    ref = reads.WindowRef(keys, "total", desc, mode)
    client = aioredis.Redis.from_url(url)
    try:
        n = len(rows)
        for reverse in (False, True):
            page = await reads.top(client, ref, 0, n, reverse)
            assert [(r.member, r.score) for r in page.entries] == memory.page(0, n, reverse)
            located = await reads.locate(client, ref, list(rows), reverse)
            for member, placed in zip(rows, located.found, strict=True):
                assert placed is not None
                assert (placed.entry.score, placed.position, placed.better) == memory.locate(member, reverse)
            for score in {s for s, _ in rows.values()}:
                better, equal, _ = await reads.better_and_equal(client, ref, score, reverse)
                assert (better, equal) == memory.better_and_equal(score, reverse)
    finally:
        await client.aclose()


@pytest.mark.parametrize("desc", [True, False], ids=["desc", "asc"])
@pytest.mark.parametrize("mode", list(TieMode))
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS)
def test_memory_order_is_redis_order(rclient, settings, desc, mode, rows):
    keys = BoardKeys(settings.key_prefix, f"order:{uuid.uuid4().hex[:8]}")
    write_redis(rclient, keys, rows, mode, desc)
    asyncio.run(compare(settings.redis_url.get_secret_value(), keys, rows, mode, desc))
    rclient.delete(keys.rank("total"), keys.state("total"), keys.seq, keys.fence, keys.id_window)
