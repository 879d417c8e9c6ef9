"""`rankstream api`: the HTTP server, with a graceful shutdown that drains in-flight requests."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from api.app import create_app
from common.boards import load_boards
from common.settings import Settings

_log = logging.getLogger(__name__)


class _NoTraceForBadRequests(logging.Filter):
    """A malformed HTTP request is the client's problem: aiohttp already answered 400, so log
    one line instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BadHttpMessage):
            record.msg, record.args = "malformed HTTP request: %s", (record.exc_info[1],)
            record.exc_info, record.levelno, record.levelname = None, logging.INFO, "INFO"
        return True


def run_api(settings: Settings) -> int:
    logging.getLogger("aiohttp.server").addFilter(_NoTraceForBadRequests())
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
