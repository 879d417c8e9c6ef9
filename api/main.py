"""`rankstream api`: the HTTP server, with a graceful shutdown that drains in-flight requests."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from aiohttp import web

from api.app import create_app
from common.boards import load_boards
from common.settings import Settings

_log = logging.getLogger(__name__)


def run_api(settings: Settings) -> int:
    boards = load_boards(settings.boards)
    client = aioredis.Redis.from_url(
        settings.redis_url.get_secret_value(), socket_timeout=2, socket_connect_timeout=1
    )
    app = create_app(settings, boards, client)
    _log.info("api starting", extra={"port": settings.api_port})
    web.run_app(
        app,
        host=settings.api_host,
        port=settings.api_port,
        shutdown_timeout=settings.shutdown_deadline_s,
        access_log=None,
        print=None,
        handle_signals=True,
    )
    return 0
