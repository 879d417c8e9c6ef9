"""The alert rules and the dashboard: every expression parses as PromQL, every alert the
operations page explains, and they cover what an operator watches. (That they name only metrics
the processes export: tests/integration/test_monitoring_live.py.)"""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest

from tests.monitoring import alert_rules, dashboard, exported, expressions, metric_names

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations" / "alerts.md"


@pytest.mark.parametrize(("where", "expr"), sorted(expressions().items()))
def test_every_expression_parses(where: str, expr: str) -> None:
    promql_parser.parse(expr)  # raises ValueError on a bad expression
    assert metric_names(expr), where


def test_the_parser_does_refuse_a_bad_expression() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum(rate(rankstream_worker_events_total[5m])")


def test_the_alerts_an_operator_needs_each_with_its_runbook_section() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert names == [
        "RankstreamLagGrowing",
        "RankstreamDeadLetters",
        "RankstreamPartitionBlocked",
        "RankstreamReplayStuck",
        "RankstreamRedisErrors",
        "RankstreamServerErrors",
        "RankstreamWorkerNotReady",
    ]
    headings = {
        line[4:].strip().lower() for line in RUNBOOK.read_text().splitlines() if line.startswith("### ")
    }
    for rule in alert_rules():
        assert rule["alert"].lower() in headings, rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/operations/alerts.md#{rule['alert'].lower()}"
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["for"]


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    used = set().union(*(metric_names(e) for w, e in expressions().items() if w.startswith("panel ")))
    assert used >= {
        "rankstream_worker_events_total",  # ingest rate
        "rankstream_worker_consumer_lag",
        "rankstream_worker_apply_seconds_bucket",  # apply latency
        "rankstream_worker_dead_lettered_total",  # by reason
        "rankstream_worker_partition_blocked",
        "rankstream_api_hot_records_replayed",  # replay progress
        "rankstream_api_requests_total",  # reads by route and status
        "rankstream_api_warm_cache_total",  # cache hit ratio
        "rankstream_api_request_seconds_bucket",  # p99 latency
    }
    ids = [panel["id"] for panel in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_a_name_no_process_exports_is_found_missing() -> None:
    names = exported(
        "# TYPE rankstream_a_total counter\n# TYPE rankstream_h histogram\nrankstream_g 1.0\n"
        'rankstream_c_total{reason="x"} 2.0\n'
    )
    assert {"rankstream_a_total", "rankstream_h_bucket", "rankstream_g", "rankstream_c_total"} <= names
    assert "rankstream_nowhere_total" not in names and "rankstream_g_bucket" not in names
