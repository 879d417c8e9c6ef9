"""What every request goes through: counted for the shutdown's drain, admitted (a board read:
its token and its client's rate, api/access.py), what its handler raised turned into a JSON error
(api/errors.py), CORS headers for an allowed origin, timed by route for /metrics.

It wraps each handler where its route is added, rather than being an aiohttp middleware: with
any middleware aiohttp adds one of its own per request (the current app's bookkeeping) and looks
the chain up in a cache, and the two cost about 3 us of the ~30 us a warm answer takes (measured:
docs/internals/read-path.md). A path no route has, or a method its route does not take,
reaches the catch-all route, which answers the JSON 404 or 405 that aiohttp would answer in text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from api.access import Access
from api.errors import ApiError, error_answer
from api.metrics import ApiMetrics

CATCH_ALL = "/{unmatched:.*}"


class InFlight:
    """The requests being handled: the shutdown drains them."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None  # made by a drain that waits

    def begin(self) -> None:
        self.count += 1

    def end(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, seconds: float) -> bool:
        """True once no request is in flight; False if some still are after `seconds`."""
        if self.count == 0:
            return True
        self._idle = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), seconds)
        return self.count == 0


class Front:
    def __init__(self, metrics: ApiMetrics, tracker: InFlight, access: Access | None = None) -> None:
        self._metrics, self._tracker, self._access = metrics, tracker, access

    def wrap(self, route: str, handler: Handler, *, guarded: bool = False, page: bool = False) -> Handler:
        """`handler` behind the front, its requests timed as `route`; `guarded`: a board read,
        admitted by the access rules first; `page`: one a browser opens (a page, an event
        stream), whose token may come in the query."""
        metrics, tracker = self._metrics, self._tracker
        access = self._access
        admit = functools.partial(access.admit, in_query=page) if guarded and access is not None else None

        async def front(request: web.Request) -> web.StreamResponse:
            tracker.begin()
            started = time.perf_counter()
            try:
                try:
                    if admit is not None:
                        admit(request)
                    response = await handler(request)
                except Exception as exc:  # noqa: BLE001 - every error becomes a JSON answer
                    response = error_answer(request, exc, metrics.redis_errors)
                if access is not None:
                    access.cors(request, response)
                # an event stream's life is not a latency: counted, timed as 0
                streamed = not isinstance(response, web.Response)
                metrics.observe(route, response.status, 0.0 if streamed else time.perf_counter() - started)
                return response
            finally:
                tracker.end()

        return front

    def add(
        self,
        app: web.Application,
        method: str,
        path: str,
        handler: Handler,
        *,
        guarded: bool = False,
        page: bool = False,
    ) -> None:
        resource = app.router.add_resource(path)
        wrapped = self.wrap(resource.canonical, handler, guarded=guarded, page=page)
        resource.add_route(method, wrapped)
        if method == "GET":
            resource.add_route("HEAD", wrapped)  # as aiohttp's add_get does

    def catch_all(self, app: web.Application) -> None:
        """Last: the JSON 404 or 405 of a request no route takes (timed as `unmatched`)."""
        resource = app.router.add_resource(CATCH_ALL)

        async def unmatched(request: web.Request) -> web.StreamResponse:
            allowed: set[str] = set()
            for other in request.app.router.resources():
                if other is not resource:
                    allowed |= (await other.resolve(request))[1]
            preflight = None if self._access is None else self._access.preflight(request, allowed)
            if preflight is not None:  # a browser asking whether its page may read this route
                return preflight
            if allowed:
                error = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here")
                answer = error_answer(request, error, self._metrics.redis_errors)
                answer.headers["Allow"] = ",".join(sorted(allowed))
                return answer
            raise ApiError(404, "not_found", "Not Found")

        resource.add_route("*", self.wrap("unmatched", unmatched))
