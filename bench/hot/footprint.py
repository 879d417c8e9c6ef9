"""Memory per member of a hot board, in a fresh process building what the API builds
(`python -m bench.hot memory N [--tracemalloc]`): RSS growth, or tracemalloc's count."""

from __future__ import annotations

import gc
import random
import sys
import time
import tracemalloc

from bench.common import Result
from bench.harness.processes import child_json, rss_bytes
from bench.hot.board import BOARD
from common.cache_records import decode


def footprint(members: int, use_tracemalloc: bool) -> Result:
    argv = [sys.executable, "-m", "bench.hot", "memory", str(members)]
    return child_json([*argv, "--tracemalloc"] if use_tracemalloc else argv, "memory child", timeout=600)


def build(members: int, use_tracemalloc: bool) -> Result:
    """What HotBoards holds for one `total` window: a HotBoard(desc, inv) replaying one format-2
    state record per member and a meta record for 5 % of them, as a node replays them, then
    finish_loading(): the window and the meta (each with its seq). Members and metas are the
    objects the API keeps: split from the records' keys and values."""
    from api.hotboards import HotBoard  # noqa: PLC0415 - the helper process only
    from common.cache_records import RecordWriter  # noqa: PLC0415
    from common.store.encoding import TieMode  # noqa: PLC0415

    rng = random.Random(20261124)
    now_ms = int(time.time() * 1000)
    writer = RecordWriter(2)
    gc.collect()
    before = rss_bytes()
    if use_tracemalloc:
        tracemalloc.start()
    started = time.perf_counter()
    hot = HotBoard(BOARD, ("total",), desc=True, mode=TieMode.INV)
    for i in range(members):
        member = f"u{i:07d}"
        score = float(int(100 * rng.paretovariate(1.2)))
        tie = now_ms - rng.randrange(86_400_000)
        key, value = writer.state(BOARD, "total", member, score=score, tie_ms=tie, seq=i + 1, meta=None)
        name, instance, encoded = key.split(b"\0")
        hot.stage(name, instance, encoded, value)
        if i % 20 == 0:
            meta = f'{{"name":"Player {i}","lvl":{i % 60}}}'.encode()
            record = writer.meta(BOARD, member, i + 1, meta)
            assert record is not None
            hot.apply(decode(*record))
    put_s = time.perf_counter() - started
    hot.finish_loading()
    window = hot.window("total")
    build_s = time.perf_counter() - started - put_s
    gc.collect()
    after = rss_bytes()
    out: Result = {
        "members": len(window),
        "meta_members": len(hot.meta),
        "put_s": round(put_s, 3),
        "finish_loading_s": round(build_s, 3),
    }
    if use_tracemalloc:
        current, peak = tracemalloc.get_traced_memory()
        out.update(traced_bytes=current, traced_peak_bytes=peak, bytes_per_member=round(current / members, 1))
    elif before is not None and after is not None:
        out.update(rss_before=before, rss_after=after, bytes_per_member=round((after - before) / members, 1))
    return out
