"""Where apply.lua's time goes, phase by phase (part of the Redis cost report): apply.lua marks
its phases with `--! phase <name>` comment lines; here they become timers (Redis' TIME) charged
to a counter hash, in a copy of the script that replaces the Applier's own. Wall time inside
Redis, commands included; the marks add ~8 TIME calls per script call (~1 µs each, per 500
events)."""

from __future__ import annotations

from typing import cast

import redis

from bench.common import Result
from common.store.apply import LAYOUTS
from common.store.scripts import LuaScript, load_script
from worker.apply import Applier

PHASE = "--! phase "
COUNTERS = "bench:apply-phases"
_TIMER = f"""local __phase_t = redis.call('TIME')
local __phase_prev, __phase_acc = __phase_t[1] * 1e6 + __phase_t[2], {{}}
local function __phase(name)
  local t = redis.call('TIME')
  local now = t[1] * 1e6 + t[2]
  __phase_acc[#__phase_acc + 1] = name
  __phase_acc[#__phase_acc + 1] = now - __phase_prev
  __phase_prev = now
end
local function __phase_flush()
  for k = 1, #__phase_acc, 2 do redis.call('HINCRBY', '{COUNTERS}', __phase_acc[k], __phase_acc[k + 1]) end
end
"""


def timed_apply() -> LuaScript:
    """apply.lua with a timer at each phase mark; the last mark also writes the counters."""
    lines = load_script("apply", LAYOUTS).source.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(PHASE)]
    if not marks:
        raise RuntimeError("apply.lua has no `--! phase` marks")
    for i in marks:
        name = lines[i][len(PHASE) :].strip()
        lines[i] = f"__phase('{name}')" + ("; __phase_flush()" if i == marks[-1] else "")
    return LuaScript("apply-phases", _TIMER + "\n".join(lines))


def time_phases(applier: Applier) -> None:
    """From now on `applier` runs the timed script."""
    applier._script.lua = timed_apply()  # a bench-only swap of the script it runs


def read_phases(client: redis.Redis, n: int) -> Result:
    """µs per event in each phase since the last read (and reset)."""
    raw = cast("dict[bytes, bytes]", client.hgetall(COUNTERS))
    client.delete(COUNTERS)
    return {k.decode(): round(int(v) / n, 2) for k, v in raw.items()}
