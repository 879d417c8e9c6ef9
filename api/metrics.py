"""The API's Prometheus metrics, and a middleware that times every request by route."""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "rankstream_api_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "rankstream_api_request_seconds",
            "Request latency by route",
            ["route"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.cache = Counter("rankstream_api_top_cache", "Top-page cache lookups", ["result"], registry=r)
        self.redis_errors = Counter("rankstream_api_redis_errors", "Requests failed by Redis", registry=r)
        self.hot_reads = Counter(
            "rankstream_api_hot_reads", "Reads answered from memory", ["board"], registry=r
        )
        self.replayed = Gauge(
            "rankstream_api_hot_records_replayed",
            "update_cache records applied per hot board",
            ["board"],
            registry=r,
        )
        self.hot_lag = Gauge(
            "rankstream_api_hot_lag_seq",
            "Redis seq minus the seq memory reflects, per hot board",
            ["board"],
            registry=r,
        )
        self.hot_ready = Gauge("rankstream_api_hot_ready", "1 once every hot board is in memory", registry=r)

    def middleware(self) -> web.middleware:  # type: ignore[valid-type]  # aiohttp's decorator type
        @web.middleware
        async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
            started = time.perf_counter()
            response = await handler(request)
            info = request.match_info.route.resource
            route = info.canonical if info is not None else "unmatched"
            self.latency.labels(route).observe(time.perf_counter() - started)
            self.requests.labels(route, str(response.status)).inc()
            return response

        return timed
