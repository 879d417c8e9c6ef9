"""HTTP errors as JSON `{"error": {"code", "message"}}`; nothing leaves as a stack trace."""

from __future__ import annotations

import logging

import orjson
import redis
from aiohttp import web
from aiohttp.typedefs import Handler

_log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(status: int, code: str, message: str) -> web.Response:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return web.Response(status=status, body=body, content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        from api.state import APP_STATE  # noqa: PLC0415 - state imports the cache; keep this module a leaf

        request.app[APP_STATE].metrics.redis_errors.inc()
        _log.warning("redis unavailable", extra={"path": request.path, "error": str(exc)})
        return error_response(503, "redis_unavailable", "the leaderboard store is unreachable; retry")
    except Exception:  # noqa: BLE001 - the last line of defence: a JSON 500, never a trace
        _log.exception("unhandled error", extra={"path": request.path})
        return error_response(500, "internal", "internal error")
