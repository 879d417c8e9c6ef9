"""The worker's Prometheus metrics: everything that can go wrong is counted."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from worker.boardstate import Stats
    from worker.sources import Blocked


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.consumed = Counter("rankstream_worker_messages_consumed", "Kafka messages consumed", registry=r)
        self.events = Counter(
            "rankstream_worker_events", "Valid events by outcome", ["outcome"], registry=r
        )  # applied | duplicate | redelivered
        self.dead_lettered = Counter(
            "rankstream_worker_dead_lettered",
            "Bad events sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.late_windows = Counter(
            "rankstream_worker_late_windows",
            "Calendar windows an event missed because its period closed beyond late_grace",
            registry=r,
        )
        self.batch_size = Histogram(
            "rankstream_worker_batch_messages",
            "Messages per consumed batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
            registry=r,
        )
        self.apply_seconds = Histogram(
            "rankstream_worker_apply_seconds",
            "Time to apply one batch in Redis",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.admin_ops = Counter(
            "rankstream_worker_admin_ops",
            "Erase and reset operations applied (rankstream erase | reset)",
            ["op"],
            registry=r,
        )  # erase | reset
        self.rolling_prepared = Counter(
            "rankstream_worker_rolling_periods_prepared",
            "Rolling periods this worker prepared whole ahead of their bucket (worker/rolling.py)",
            registry=r,
        )
        self.rolling_derived = Counter(
            "rankstream_worker_rolling_members_derived",
            "Members derived into prepared rolling periods",
            registry=r,
        )
        self.rolling_failures = Counter(
            "rankstream_worker_rolling_pass_failures", "Preparation passes that failed (retried)", registry=r
        )
        self.results = Counter(
            "rankstream_worker_period_results",
            "Period results this worker handled (worker/results.py): sent, found (a predecessor's, "
            "already in the topic), expired (its period expired before it was sent: no record)",
            ["outcome"],
            registry=r,
        )
        self.results_failures = Counter(
            "rankstream_worker_period_result_failures", "Result passes that failed (retried)", registry=r
        )
        self.retries = Counter(
            "rankstream_worker_batch_retries", "Batches rewound after a Redis or Kafka error", registry=r
        )
        self.lag = Gauge(
            "rankstream_worker_consumer_lag", "Messages behind the partition end", ["partition"], registry=r
        )
        self.producers_replaced = Gauge(
            "rankstream_worker_producers_replaced",
            "Transactional producers replaced because a call overstayed its timeout",
            registry=r,
        )
        self.predecessors_fenced = Gauge(
            "rankstream_worker_predecessors_fenced",
            "Transactional ids of workers that died holding partitions, fenced by this one",
            registry=r,
        )

        self.state_cells = Gauge(
            "rankstream_worker_state_cells",
            "(member, window period) states kept to decide events in the worker",
            registry=r,
        )
        self.state_boards = Gauge("rankstream_worker_state_boards", "Boards whose state is kept", registry=r)
        self.ready = Gauge(
            "rankstream_worker_ready",
            "1 when the worker's /readyz answers 200 (Redis answers, no partition blocked)",
            registry=r,
        )
        self._blocked_now: Callable[[], Mapping[int, Blocked]] = dict
        self._blocked_boards: dict[int, str] = {}
        r.register(_BlockedCollector(self))

    def watch_blocked(self, blocked: Callable[[], Mapping[int, Blocked]]) -> None:
        """The partitions blocked now (worker/sources.py), read when /metrics is scraped: the same
        state /readyz answers from."""
        self._blocked_now = blocked

    def name_boards(self, boards: Mapping[int, str]) -> None:
        """The board each blocked partition was met on, for the gauge's `board` label."""
        self._blocked_boards.update(boards)

    def watch_states(self, stats: Stats) -> None:
        """The board states' counts (worker/boardstate.py), read when /metrics is scraped."""
        self.state_cells.set_function(lambda: stats.cells)
        self.state_boards.set_function(lambda: stats.boards)
        self.registry.register(_StateChunksCollector(stats))

    def watch(self, producers_replaced: Callable[[], int], predecessors_fenced: Callable[[], int]) -> None:
        """Counts kept by the outputs and the fence, read when /metrics is scraped."""
        self.producers_replaced.set_function(producers_replaced)
        self.predecessors_fenced.set_function(predecessors_fenced)


class _BlockedCollector(Collector):
    """rankstream_worker_partition_blocked{partition,reason,board} = 1 per blocked partition."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "rankstream_worker_partition_blocked",
            "1 while a partition is not applied because Redis does not hold what its commits say"
            " (see the log line for what to do)",
            labels=["partition", "reason", "board"],
        )
        boards = self._metrics._blocked_boards
        for p, b in sorted(self._metrics._blocked_now().items()):
            family.add_metric([str(p), b.reason, boards.get(p, "")], 1)
        yield family


class _StateChunksCollector(Collector):
    """rankstream_worker_state_chunks_total{how}: the board states' counts (worker/boardstate.py)."""

    HOW = (
        ("hit", "hits"),
        ("miss", "misses"),
        ("stale", "stale"),
        ("conflict", "conflicts"),
        ("fallback", "fallbacks"),
    )

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "rankstream_worker_state_chunks",
            "Board chunks decided in the worker, by how: hit (from the kept state alone), miss (read"
            " some of the board first), stale (what was kept was found changed when read: read again),"
            " conflict (the write refused: someone else wrote the board; read and decided again),"
            " fallback (sent to Redis' script after all)",
            labels=["how"],
        )
        for how, count in self.HOW:
            family.add_metric([how], getattr(self._stats, count))
        yield family
        ways = CounterMetricFamily(
            "rankstream_worker_decided_writes",
            "Board writes the worker decided, by how they went: native (commands in a transaction),"
            " script (guarded.lua: an instance about to expire, or native writes turned off)",
            labels=["way"],
        )
        ways.add_metric(["native"], self._stats.natives)
        ways.add_metric(["script"], self._stats.scripted)
        yield ways
