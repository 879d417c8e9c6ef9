"""What every request handler needs, stored on the aiohttp application."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from api.access import Access
from api.hotboards import HotBoards
from api.metrics import ApiMetrics
from api.warm import WarmCache
from common.boards import BoardsConfig
from common.clock import Clock, system_ms
from common.deadline import Deadline
from common.store.pipe import Pipe

if TYPE_CHECKING:  # it reads a Target, whose parsing reads this state
    from api.reader import BoardReader


@dataclass
class ApiState:
    boards: BoardsConfig
    redis: Pipe  # the API's pipelined Redis connection
    key_prefix: str
    warm: WarmCache  # answers of non-hot boards (api/warm.py)
    hot: HotBoards
    max_future_skew_s: int  # bounds at= and period= like event times (docs/contract.md §2)
    # Cache-Control of read answers, public and private (api/httpcache.py): from settings
    cache_public: str
    cache_private: str
    clock: Clock = system_ms  # the service's clock (common/clock.py)
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    # requests seen lately (path and query) -> their canonical form, what answers are kept by
    request_keys: dict[str, str] = field(default_factory=dict)
    # serialised answers from hot boards' memory by request's canonical form: (the board's
    # version, valid until (ms), body, HTTP headers): never stale (api/routes.py)
    hot_answers: dict[str, tuple[int, int, bytes, dict[str, str]]] = field(default_factory=dict)
    # a Redis reader per (board, window instance) read lately (api/routes.py reader_for)
    redis_readers: dict[tuple[str, str], BoardReader] = field(default_factory=dict)
    # started by SIGTERM/SIGINT (api/main.py): the drain and every cleanup step wait within it
    deadline: Deadline = field(default_factory=Deadline)
    access: Access | None = None  # tokens, CORS, rate limit (api/access.py); None: all off


APP_STATE: web.AppKey[ApiState] = web.AppKey("rankstream_state", ApiState)
