"""The API's Prometheus metrics (api/front.py times every request by route)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from api.hotboards import HotBoards
from api.warm import ChangeFeed, WarmCache

if TYPE_CHECKING:  # api/live.py reads the state, which holds these metrics
    from api.live import LiveBoards

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # per request: plain counts on the event loop's thread, read when /metrics is scraped
        # (Prometheus' own counter and histogram take a lock each: ~1.5 us a request)
        self.request_counts: dict[tuple[str, int], int] = {}  # (route, status) -> requests
        self.latency_counts: dict[str, list[float]] = {}  # route -> per bucket, +Inf, then the sum
        r.register(_RequestsCollector(self.request_counts, self.latency_counts))
        self.redis_errors = Counter("rankstream_api_redis_errors", "Requests failed by Redis", registry=r)
        self.hot_read_counts: dict[str, int] = {}  # per board: reads answered from memory
        r.register(_HotReadsCollector(self.hot_read_counts))
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

    def hot_read(self, board: str) -> None:
        """One read answered from a hot board's memory: a plain count, read when /metrics is
        scraped (a Prometheus counter's lock and child would cost each read about 0.5 us)."""
        counts = self.hot_read_counts
        counts[board] = counts.get(board, 0) + 1

    def watch_hot(self, hot: HotBoards) -> None:
        """Boards in memory, and those made hot by themselves, read when /metrics is scraped."""
        self.registry.register(_HotCollector(hot))

    def watch_live(self, live: LiveBoards) -> None:
        """The live streams held and the pages pushed, read when /metrics is scraped."""
        self.registry.register(_LiveCollector(live))

    def watch_warm(self, cache: WarmCache, feed: ChangeFeed) -> None:
        """The warm cache's counters, read when /metrics is scraped (nothing per request)."""
        self.registry.register(_WarmCollector(cache, feed))

    def observe(self, route: str, status: int, seconds: float) -> None:
        """One request's latency and status, by route."""
        counts = self.request_counts
        counts[route, status] = counts.get((route, status), 0) + 1
        latency = self.latency_counts.get(route)
        if latency is None:
            latency = self.latency_counts[route] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # le: the first bucket >= seconds
        latency[-1] += seconds


class _RequestsCollector(Collector):
    def __init__(self, counts: dict[tuple[str, int], int], latency: dict[str, list[float]]) -> None:
        self._counts, self._latency = counts, latency

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "rankstream_api_requests", "HTTP requests by route and status", labels=["route", "status"]
        )
        for (route, status), count in list(self._counts.items()):
            requests.add_metric([route, str(status)], count)
        yield requests
        seconds = HistogramMetricFamily(
            "rankstream_api_request_seconds", "Request latency by route", labels=["route"]
        )
        for route, counts in list(self._latency.items()):
            cumulative = list(accumulate(counts[:-1]))
            bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
            seconds.add_metric([route], list(zip(bounds, cumulative, strict=True)), counts[-1])
        yield seconds


class _HotReadsCollector(Collector):
    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "rankstream_api_hot_reads", "Reads answered from memory", labels=["board"]
        )
        for board, count in list(self._counts.items()):
            family.add_metric([board], count)
        yield family


class _HotCollector(Collector):
    def __init__(self, hot: HotBoards) -> None:
        self._hot = hot

    def collect(self) -> Iterable[Metric]:
        hot = self._hot
        members = GaugeMetricFamily(
            "rankstream_api_hot_members",
            "Members held in memory per hot board, every window and period it holds",
            labels=["board", "source"],
        )
        for board, held in list(hot.boards.items()):
            members.add_metric([board, "config" if held.since is None else "promoted"], held.members())
        yield members
        yield CounterMetricFamily(
            "rankstream_api_hot_promotions", "Boards made hot by their read rate", value=hot.promotions
        )
        demotions = CounterMetricFamily(
            "rankstream_api_hot_demotions",
            "Boards made hot by themselves that left memory: idle, registration lapsed, behind Redis",
            labels=["reason"],
        )
        for reason, count in hot.demotions.items():
            demotions.add_metric([reason], count)
        yield demotions
        in_memory = sum(1 for board in hot.promoted if board in hot.boards)
        yield GaugeMetricFamily(
            "rankstream_api_hot_promoted_boards", "Boards made hot by themselves, in memory", value=in_memory
        )
        yield GaugeMetricFamily(
            "rankstream_api_hot_loading_boards",
            "Boards made hot by themselves, being loaded",
            value=len(hot.promoted) - in_memory,
        )


class _WarmCollector(Collector):
    def __init__(self, cache: WarmCache, feed: ChangeFeed) -> None:
        self._cache, self._feed = cache, feed

    def collect(self) -> Iterable[Metric]:
        cache = self._cache
        lookups = CounterMetricFamily(
            "rankstream_api_warm_cache",
            "Reads of non-hot boards: answered from memory (hit), read from Redis and kept (miss), "
            "or joined an identical read in flight (coalesced)",
            labels=["result"],
        )
        for result, value in (("hit", cache.hits), ("miss", cache.misses), ("coalesced", cache.coalesced)):
            lookups.add_metric([result], value)
        yield lookups
        yield GaugeMetricFamily("rankstream_api_warm_cache_entries", "Answers kept", value=cache.size)
        yield GaugeMetricFamily(
            "rankstream_api_warm_cache_bytes",
            "Bytes of answers kept (bodies and overhead)",
            value=cache.size_bytes,
        )
        yield GaugeMetricFamily(
            "rankstream_api_warm_cache_live", "1 while the change feed is subscribed", value=int(cache.live)
        )
        yield CounterMetricFamily(
            "rankstream_api_warm_subscriptions",
            "Change feed (re)subscriptions",
            value=self._feed.subscriptions,
        )
        yield CounterMetricFamily(
            "rankstream_api_warm_missed_changes",
            "Boards dropped by the seq check (a change notice lost) or seen with a gap in their notices",
            value=cache.checks_dropped + cache.gaps,
        )


class _LiveCollector(Collector):
    def __init__(self, live: LiveBoards) -> None:
        self._live = live

    def collect(self) -> Iterable[Metric]:
        live = self._live
        yield GaugeMetricFamily("rankstream_api_streams", "Live event streams open", value=live.streams)
        yield CounterMetricFamily(
            "rankstream_api_stream_pages", "Pages pushed to live event streams", value=live.pushes
        )
