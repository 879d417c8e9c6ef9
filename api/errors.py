"""HTTP errors as JSON `{"error": {"code", "message"}}`; nothing leaves as a stack trace."""

from __future__ import annotations

import logging

import orjson
import redis
from aiohttp import web
from prometheus_client import Counter

_log = logging.getLogger(__name__)
# the store away or between states: a Redis Cluster failing over (CLUSTERDOWN, a slot nobody
# serves yet) or migrating a slot longer than a request waits (TRYAGAIN, ASK/MOVED past the
# client's redirects) is as unavailable as an unreachable server: 503, retry
_UNAVAILABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # and MovedError, its subclass
)

# the API's Redis user lacks a command or key right (docs/operations/requirements.md): to
# clients, the store is unavailable; to the operator, an error line naming what was refused
_REFUSED = (redis.exceptions.NoPermissionError, redis.exceptions.AuthenticationError)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def error_answer(request: web.Request, exc: Exception, redis_errors: Counter) -> web.Response:
    """The JSON answer to a request whose handler raised `exc` (an HTTPException below 400, a
    redirect, is raised again)."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.headers)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    if isinstance(exc, _REFUSED):  # a Redis user without a right it needs: the operator's to fix
        redis_errors.inc()
        _log.error("redis refused the call", extra={"path": request.path, "error": str(exc)})
        return error_response(503, "redis_unavailable", "the leaderboard store is unreachable; retry")
    if isinstance(exc, _UNAVAILABLE):
        redis_errors.inc()
        _log.warning("redis unavailable", extra={"path": request.path, "error": str(exc)})
        return error_response(503, "redis_unavailable", "the leaderboard store is unreachable; retry")
    # the last line of defence: a JSON 500, never a trace
    _log.error("unhandled error", exc_info=exc, extra={"path": request.path})
    return error_response(500, "internal", "internal error")
