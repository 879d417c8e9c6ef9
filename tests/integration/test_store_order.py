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
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.hotwindow import HotWindow
from common.idwindow import fingerprint
from common.store import reads
from common.store.apply import ApplyEvent, ApplyRequest, ApplyScript, Instance
from common.store.encoding import EXACT_MAX, TIE_MAX, Packing, Status, TieMode, format_score
from common.store.keys import BoardKeys
from common.store.pipe import RedisPipe

pytestmark = pytest.mark.integration

MEMBERS = st.text(alphabet="ab0129é€", min_size=1, max_size=4)
SCORES = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.5, -3.0, 10.0, float(EXACT_MAX), -float(EXACT_MAX), 1e-300])
TIES = st.sampled_from([0, 1, 2, 1_795_327_200_000, 1_795_327_200_001, 253_402_300_799_999, TIE_MAX])
ROWS = st.dictionaries(MEMBERS, st.tuples(SCORES, TIES), min_size=1, max_size=25)
_ids = itertools.count()
INF = float("inf")
TOTAL = Instance("total", 0)


def _bound(value: float) -> str:
    """A ZCOUNT bound, as the API writes it."""
    return "+inf" if value == INF else "-inf" if value == -INF else format_score(value)


def write_redis(
    client: object,
    keys: BoardKeys,
    rows: dict[str, tuple[float, int]],
    mode: TieMode,
    desc: bool,
    *,
    instance: Instance = TOTAL,
    score_range: tuple[int, int] | None = None,
) -> None:
    events = [
        ApplyEvent("set", member, score, tie, "", 1, 0, 0, fingerprint(f"o{next(_ids)}"))
        for member, (score, tie) in rows.items()
    ]
    request = ApplyRequest(
        keys, [instance], mode, desc, 0, False, "e", 60, 128, 0, [], events, score_range=score_range
    )
    (reply,) = ApplyScript().run_many(client, [request])  # type: ignore[arg-type]
    assert isinstance(reply, list)
    assert {r.status for r in reply} == {Status.APPLIED}


async def compare(url: str, ref: reads.WindowRef, rows: dict[str, tuple[float, int]]) -> None:
    memory = HotWindow(ref.desc, ref.mode)
    for seq, (member, (score, tie)) in enumerate(rows.items()):
        memory.put(member, score, tie, seq)
    memory.finish_loading()
    client = RedisPipe(url)
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
                for low, high in (
                    (score, INF),
                    (-INF, score),
                    (score - 0.5, score + 1),
                    (score + 0.5, score),
                ):
                    counted = await reads.count_between(client, ref, _bound(low), _bound(high))
                    assert counted.count == memory.count_between(low, high)
    finally:
        await client.aclose()


@pytest.mark.parametrize("desc", [True, False], ids=["desc", "asc"])
@pytest.mark.parametrize("mode", list(TieMode))
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS)
def test_memory_order_is_redis_order(rclient, settings, desc, mode, rows):
    keys = BoardKeys(settings.key_prefix, f"order:{uuid.uuid4().hex[:8]}")
    write_redis(rclient, keys, rows, mode, desc)
    ref = reads.WindowRef(keys, "total", desc, mode)
    asyncio.run(compare(settings.redis_url.get_secret_value(), ref, rows))
    rclient.delete(keys.rank("total"), keys.state("total"), keys.seq, keys.fence, keys.id_window)


# --- packed windows (common/store/packing.py): the tie inside an integer score ---------------
DAY_START = 1_795_276_800_000  # 2026-11-22T00:00+08:00
DAY_BITS = 27
PACKED_LOW, PACKED_HIGH = -(2 ** (53 - DAY_BITS)), 2 ** (53 - DAY_BITS) - 1
PACKED_SCORES = st.sampled_from([0, 1, 2, -1, -3, 10, PACKED_LOW, PACKED_HIGH, PACKED_HIGH - 1])
PACKED_TIES = st.sampled_from([DAY_START, DAY_START + 1, DAY_START + 86_399_999, DAY_START + 2**DAY_BITS - 1])
PACKED_ROWS = st.dictionaries(MEMBERS, st.tuples(PACKED_SCORES, PACKED_TIES), min_size=1, max_size=25)


@pytest.mark.parametrize("desc", [True, False], ids=["desc", "asc"])
@pytest.mark.parametrize("mode", list(TieMode))
@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=PACKED_ROWS)
def test_memory_order_is_redis_order_in_packed_windows(rclient, settings, desc, mode, rows):
    """The widest range a day packs: its ends and both ends of the tie bits, in every mode."""
    bits = 0 if mode is TieMode.NONE else DAY_BITS
    packing = Packing(bits, DAY_START, mode is TieMode.INV)
    keys = BoardKeys(settings.key_prefix, f"order:{uuid.uuid4().hex[:8]}")
    instance = Instance("day:2026-11-22", 0, packing)
    write_redis(rclient, keys, rows, mode, desc, instance=instance, score_range=(PACKED_LOW, PACKED_HIGH))
    # memory holds what Redis reports: without tie bits a packed window keeps no tie
    held = rows if bits else {m: (score, 0) for m, (score, _) in rows.items()}
    ref = reads.WindowRef(keys, instance.name, desc, mode, packing)
    asyncio.run(compare(settings.redis_url.get_secret_value(), ref, held))
    assert rclient.exists(keys.state(instance.name)) == 0  # a packed window keeps no state hash
    rclient.delete(keys.rank(instance.name, True), keys.seq, keys.fence, keys.id_window)
