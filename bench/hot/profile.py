"""The API's replay of hot boards under cProfile, in a process of its own
(`python -m bench.hot profile ...`): where the replay's time went."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, Result
from bench.harness.kafka import QUIET_KAFKA
from bench.harness.processes import child_json
from common.boards import load_boards
from common.settings import Settings, load_settings


def profile_replay(settings: Settings) -> Result:
    """The API's replay (HotBoards, in a child process of its own) under cProfile."""
    argv = [sys.executable, "-m", "bench.hot", "profile", "--bootstrap", settings.kafka_bootstrap]
    argv += ["--redis", settings.redis_url.get_secret_value(), "--boards", str(settings.boards)]
    argv += ["--prefix", settings.key_prefix, "--topic", settings.topic_cache]
    return child_json(argv, "replay profile", timeout=300)


def profile(args: argparse.Namespace) -> Result:
    from api.hotboards import HotBoards  # noqa: PLC0415 - the helper process only

    settings = load_settings(
        {},
        kafka_bootstrap=args.bootstrap,
        redis_url=args.redis,
        boards=Path(args.boards),
        key_prefix=args.prefix,
        topic_cache=args.topic,
        kafka=QUIET_KAFKA,
    )
    hot = HotBoards(settings, load_boards(settings.boards))

    def stop_when_ready() -> None:
        while not hot.ready and not hot._stop.is_set():
            time.sleep(0.005)
        hot._stop.set()  # the follow loop ends within one consume timeout

    threading.Thread(target=stop_when_ready, daemon=True).start()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    hot._run()  # the replay thread's body, on this thread so cProfile sees it
    profiler.disable()
    wall = time.perf_counter() - started
    # pstats.Stats keeps its table in an attribute typeshed does not declare
    stats: dict[Any, tuple[int, int, float, float, Any]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in stats.values())

    def name(func: tuple[str, int, str]) -> str:
        path, line, fn = func
        short = path.replace(str(REPO) + "/", "") if path.startswith(str(REPO)) else Path(path).name
        return f"{short}:{line}({fn})" if line else fn

    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]

    def ours(func: tuple[str, int, str]) -> bool:
        path, _, fn = func
        if path == "~":  # builtins: the Kafka consume call, sorting
            return "consume" in fn or "sort" in fn
        return any(part in path for part in ("hotboards", "hotwindow", "cache_records", "sortedlist"))

    by_cum = sorted((kv for kv in stats.items() if ours(kv[0])), key=lambda kv: kv[1][3], reverse=True)[:15]
    return {
        "ready_after_s_profiled": None if hot.ready_after_s is None else round(hot.ready_after_s, 3),
        "wall_s_profiled": round(wall, 3),
        "records_replayed": sum(b.replayed for b in hot.boards.values()),
        "profiled_cpu_s": round(total, 3),
        "top_tottime": [
            {"function": name(f), "calls": nc, "tottime_s": round(tt, 3), "share": round(tt / total, 3)}
            for f, (_, nc, tt, _, _) in ranked
        ],
        "top_cumulative_s": {name(f): round(ct, 3) for f, (_, _, _, ct, _) in by_cum},
    }
