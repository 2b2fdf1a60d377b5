"""docs/grafana-dashboard.json queries only what the gateway's /metrics serves.

The metric and label names come from one place each (vsqs/_core/metrics.py for
the queue gauges, vsqs/_gateway/metrics.py for the gateway's own); this test
renders a real exposition from those modules and checks every name the
dashboard's queries use against it, so renaming a metric without the dashboard
(or the other way round) fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import vsqs
from vsqs._gateway.metrics import GatewayMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
METRIC_NAME = re.compile(r"\bvsqs_[a-z0-9_]+\b")
MATCHERS = re.compile(r"\{([^}]*)\}")
LABEL_IN_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*vsqs_[a-z0-9_]+\s*,\s*(\w+)")  # a variable's query
HISTOGRAM_LABELS = {"le"}  # what histogram_quantile groups by: the buckets' bound


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in panels:
        found.append(panel)
        found += all_panels(panel.get("panels", []))
    return found


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables'."""
    exprs = [target["expr"] for panel in all_panels(board["panels"]) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """{sample name: its label names} of a real scrape: a spool with a queue
    and its dead-letter queue, a request observed, a sweep counted."""
    spool = vsqs.Spool(tmp_path_factory.mktemp("spool") / "spool", create=True)
    spool.create_queue("dead")
    spool.create_queue("work", dead_letter="dead", max_receives=1).publish(b"x")
    metrics = GatewayMetrics(spool)
    metrics.observe("publish", "ok", 0.01)
    metrics.gc_runs.inc()
    metrics.gc_removed.inc()
    metrics.gc_errors.inc()
    metrics.gc_last_run.set(1.0)
    metrics.long_polls.set(0)
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def test_the_dashboard_is_json_grafana_reads() -> None:
    board = dashboard()
    panels = all_panels(board["panels"])
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert {"datasource", "queue"} <= variables


def test_no_two_panels_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(dashboard()["panels"]):
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_metric_the_dashboard_queries_is_served(exposition: dict[str, set[str]]) -> None:
    used = {name for expr in queries(dashboard()) for name in METRIC_NAME.findall(expr)}
    assert used, "the dashboard queries no vsqs metric"
    missing = sorted(used - exposition.keys())
    assert not missing, f"the dashboard queries metrics /metrics does not serve: {missing}"


def test_every_label_the_dashboard_uses_is_served(exposition: dict[str, set[str]]) -> None:
    served = set().union(*exposition.values()) | HISTOGRAM_LABELS
    for expr in queries(dashboard()):
        used = {label for matcher in MATCHERS.findall(expr) for label in LABEL_IN_MATCHER.findall(matcher)}
        used |= {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        used |= set(LABEL_VALUES.findall(expr))
        assert used <= served, f"{expr}: labels {sorted(used - served)} are not served"


def test_the_dashboard_covers_what_the_console_shows(exposition: dict[str, set[str]]) -> None:
    """Depth by state, oldest age, dead letters, rate of change, requests and latency."""
    exprs = "\n".join(queries(dashboard()))
    for needle in ("vsqs_messages", "vsqs_oldest_message_age_seconds", "vsqs_dead_lettered_messages",
                   "deriv(vsqs_messages", "vsqs_gateway_requests_total", "vsqs_gateway_request_seconds_bucket"):
        assert needle in exprs, needle
