"""`rankstream api`: the HTTP server, and a shutdown that fits in one deadline.

SIGTERM (or SIGINT) starts the deadline (RANKSTREAM_SHUTDOWN_DEADLINE_S, common/deadline.py);
every step after it waits only within what is left of it:

1. stop accepting: the listening socket closes, idle keep-alive connections close (busy ones
   after their answer), and the hot-board replay thread is told to stop (so it has the drain to
   come back from a Kafka or Redis call);
2. drain: wait for the requests in flight, until the deadline less a reserve for the cleanup;
3. aiohttp's own shutdown: a request still in flight gets a short grace, is cancelled, and gets
   the grace again to unwind (its client sees the connection close unanswered);
4. the app's cleanup (api/app.py): the watch task, the replay thread's join, the Redis client.

A replay thread still blocked in librdkafka is abandoned (os._exit, as the worker does), and a
last-resort timer exits at the deadline whatever still runs: the process is gone before the
kubelet's SIGKILL (terminationGracePeriodSeconds, deploy/k8s/base/rankstream.yaml).

Why not `web.run_app(shutdown_timeout=deadline)`: aiohttp 3.14's runner cleanup waits, per
connection, up to shutdown_timeout for the handler, cancels it, waits up to shutdown_timeout again
(rounded up to a whole second above 5 s), and only then runs the app's cleanup with its own
timeouts: about twice the deadline plus the cleanup. Here the drain is ours, the runner's
shutdown_timeout is only the short grace of step 3, and the cleanup steps read the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import time

import redis
import uvloop
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from api.app import ADMIN_APP, IN_FLIGHT, MAX_HEADERS, MAX_LINE_BYTES, create_app
from api.state import APP_STATE
from common.boards import BoardsConfig, load_boards
from common.clients import redis_client
from common.clock import service_clock
from common.deadline import exit_at
from common.errors import InfrastructureError
from common.logs import flush_logs
from common.settings import Settings
from common.store import shardcount

_log = logging.getLogger(__name__)
ACCEPT_BACKLOG = 4096
# Of the deadline, what the drain leaves for the steps after it (cancelling what is still in
# flight, the watch task, the replay thread, Redis, the interpreter's exit): at most this, and at
# most a quarter of a small deadline.
CLEANUP_RESERVE_S = 2.0
# What a request still in flight after the drain gets before it is cancelled, and again to unwind
# (aiohttp's shutdown_timeout is used twice per connection); the drain already waited for it.
CANCEL_GRACE_S = 0.25


class _NoTraceForBadRequests(logging.Filter):
    """A malformed HTTP request is the client's problem: aiohttp already answered 400, so log
    one line instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BadHttpMessage):
            record.msg, record.args = "malformed HTTP request: %s", (record.exc_info[1],)
            record.exc_info, record.levelno, record.levelname = None, logging.INFO, "INFO"
        return True


async def _drain(runner: web.AppRunner, reserve: float) -> None:
    """Steps 1 and 2: stop accepting, then wait for the requests in flight until the deadline
    less `reserve`."""
    state, in_flight = runner.app[APP_STATE], runner.app[IN_FLIGHT]
    started = time.monotonic()
    for site in list(runner.sites):
        await site.stop()  # the listening socket closes: new connections are refused
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close, busy ones after their answer
    state.hot.request_stop()
    busy = in_flight.count
    if await in_flight.wait_idle(state.deadline.timeout(math.inf, reserve)):
        seconds = round(time.monotonic() - started, 3)
        _log.info("requests in flight drained", extra={"requests": busy, "seconds": seconds})
    else:
        _log.warning(
            "requests still in flight at the end of the drain: cancelling them",
            extra={"in_flight": in_flight.count, "seconds": round(time.monotonic() - started, 3)},
        )


async def _serve(app: web.Application, settings: Settings) -> None:
    deadline = app[APP_STATE].deadline
    reserve = min(CLEANUP_RESERVE_S, settings.shutdown_deadline_s / 4)
    stopping = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        if deadline.started.is_set():
            _log.info("already stopping", extra={"signal": signum.name})
            return  # a second signal does not extend (nor shorten) the deadline
        deadline.start(settings.shutdown_deadline_s)
        exit_at(deadline)
        _log.info(
            "stopping: draining requests in flight",
            extra={"signal": signum.name, "deadline_s": settings.shutdown_deadline_s},
        )
        stopping.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    runner = web.AppRunner(
        app,
        handle_signals=False,  # ours above: they start the deadline
        shutdown_timeout=min(CANCEL_GRACE_S, reserve / 8),
        keepalive_timeout=75.0,
        access_log=None,
        max_line_size=MAX_LINE_BYTES,
        max_field_size=MAX_LINE_BYTES,
        max_headers=MAX_HEADERS,
    )
    admin = web.AppRunner(app[ADMIN_APP], handle_signals=False, shutdown_timeout=0.1, access_log=None)
    try:
        await runner.setup()  # on_startup: the replay thread starts
        await admin.setup()
        # a deep accept queue: when a node stops, its event streams' browsers reconnect to the
        # others at once, thousands within a second (the kernel caps it at net.core.somaxconn)
        site = web.TCPSite(runner, settings.api_host, settings.api_port, backlog=ACCEPT_BACKLOG)
        await site.start()
        admin_site = web.TCPSite(admin, settings.api_host, settings.api_admin_port)
        await admin_site.start()
        _log.info("api listening", extra={"url": site.name, "admin": admin_site.name})
        await stopping.wait()
        await _drain(runner, reserve)
    finally:
        await admin.cleanup()  # the admin port closes with the public one's drain
        # step 3, then the app's cleanup (step 4): each bounded by what is left of the deadline
        await runner.cleanup()


def _check_shards(settings: Settings, boards: BoardsConfig) -> None:
    """Refuse a config whose types' shard counts differ from those their data was written with
    (ConfigError); a Redis away at start is the workers' to check (they can't start without it)."""
    try:
        client = redis_client(settings)
        try:
            shardcount.check(client, settings.key_prefix, boards, os.fspath(settings.boards))
        finally:
            client.close()
    except (InfrastructureError, redis.RedisError) as exc:
        if any(t.shards > 1 for t in boards.types.values()):  # else nothing to check but records
            _log.warning("shard counts not checked: Redis is away", extra={"error": str(exc)})


def run_api(settings: Settings) -> int:
    logging.getLogger("aiohttp.server").addFilter(_NoTraceForBadRequests())
    boards = load_boards(settings.boards)
    _check_shards(settings, boards)
    app = create_app(settings, boards, service_clock(settings))
    state = app[APP_STATE]
    _log.info("api starting", extra={"port": settings.api_port})
    uvloop.run(_serve(app, settings))  # about a third less CPU per request (docs/internals/read-path.md)
    seconds = None
    if state.deadline.started.is_set():
        seconds = round(settings.shutdown_deadline_s - state.deadline.remaining(), 3)
    if state.hot.running:
        # the replay thread is still blocked in librdkafka (or Redis): exit without waiting for it,
        # nor for the Kafka client's destructors at interpreter exit
        _log.info("api stopped", extra={"seconds": seconds, "abandoned": "hot-board replay thread"})
        flush_logs()
        os._exit(0)
    _log.info("api stopped", extra={"seconds": seconds})
    return 0
