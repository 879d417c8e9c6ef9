"""What deploy/prometheus/alerts.yaml and deploy/grafana/rankstream.json ask Prometheus: every
expression, and the metric names they use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "rankstream.json"
METRIC = re.compile(r"\brankstream_[a-z_]+\b")


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = orjson.loads(DASHBOARD.read_bytes())
    return found


def expressions() -> dict[str, str]:
    """Where each expression is (an alert's name, a panel's title and target) -> the expression."""
    out = {f"alert {r['alert']}": str(r["expr"]) for r in alert_rules()}
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            out[f"panel {panel['title']!r} {target['refId']}"] = str(target["expr"])
    return out


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def exported(exposition: str) -> set[str]:
    """The names a /metrics text offers to queries: every sample's, and for each declared family
    (one with no sample yet, such as a labelled counter nothing has counted) its series' names."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names
