"""What every request handler needs, stored on the aiohttp application."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from aiohttp import web

from common.boards import BoardsConfig


@dataclass
class ApiState:
    boards: BoardsConfig
    redis: aioredis.Redis
    key_prefix: str


APP_STATE: web.AppKey[ApiState] = web.AppKey("rankstream_state", ApiState)
