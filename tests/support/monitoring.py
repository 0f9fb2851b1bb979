"""The metric names the shipped Grafana dashboard queries, and those a ``/metrics`` page
exports, so a test can hold one against the other."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).parents[2] / "monitoring" / "traind-dashboard.json"
_NAME = re.compile(r"\btraind_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "info": ("_info",), "gauge": ("",), "summary": ("_sum", "_count", "")}


def dashboard_queries(path: Path = DASHBOARD) -> dict[str, list[str]]:
    """Each panel's title and the PromQL of its targets."""
    dashboard = json.loads(path.read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}


def names_in(expr: str) -> set[str]:
    """The traind metric names a PromQL expression reads."""
    return set(_NAME.findall(expr))


def exported(page: str) -> set[str]:
    """Every series name a Prometheus text page exports or declares (a labelled metric
    with no child yet still has its HELP and TYPE)."""
    found = set()
    for family in text_string_to_metric_families(page):
        found |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
        found |= {s.name for s in family.samples}
    return found
