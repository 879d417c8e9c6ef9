"""What every request handler needs, stored on the aiohttp application."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from cachetools import LRUCache

from api.cache import SingleFlightCache
from api.hotboards import HotBoards
from api.metrics import ApiMetrics
from common.boards import BoardsConfig
from common.clock import Clock, system_ms
from common.deadline import Deadline


@dataclass
class ApiState:
    boards: BoardsConfig
    redis: aioredis.Redis
    key_prefix: str
    top_cache: SingleFlightCache[Any]
    hot: HotBoards
    max_future_skew_s: int  # bounds at= and period= like event times (CONTRACT 2)
    clock: Clock = system_ms  # the service's clock (common/clock.py)
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    # serialised top pages of hot boards by (board, instance, view, page, seq): never stale
    hot_pages: LRUCache[Any, tuple[dict[str, Any], bytes]] = field(default_factory=lambda: LRUCache(4096))
    # started by SIGTERM/SIGINT (api/main.py): the drain and every cleanup step wait within it
    deadline: Deadline = field(default_factory=Deadline)


APP_STATE: web.AppKey[ApiState] = web.AppKey("rankstream_state", ApiState)
