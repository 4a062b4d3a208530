"""The chart's monitoring of RLJobs: a PodMonitor on the Ray heads the operator builds, and a Grafana dashboard
whose queries use only metric names the runtime exports (runtime/report/telemetry.py)."""

import json
import re
from typing import Any

import pytest

from kuberl.api import parse_rljob
from kuberl.operator import names
from kuberl.operator.builders import METRICS_PORT_NAME, Owner, build_rayjob
from kuberl.runtime.report.telemetry import EXPORTS, metric_names
from tests.unit.chart.rendering import CHART, of_kind, one, render
from tests.unit.operator.conftest import UID, make_rljob

DASHBOARD = CHART / "dashboards" / "rljobs.json"
MONITORING_ON: dict[str, Any] = {"metrics": {"podMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}
#: A metric name inside a PromQL expression: kuberl_ and the name's characters.
METRIC_IN_QUERY = re.compile(r"\bkuberl_[a-zA-Z0-9_:]*")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict[str, Any]) -> list[str]:
    panels = [panel for row in board["panels"] for panel in [row, *row.get("panels", [])]]
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    variables = [variable["definition"] for variable in board["templating"]["list"] if "definition" in variable]
    return exprs + variables


def head_pod_labels() -> dict[str, str]:
    job = parse_rljob(make_rljob())
    rayjob = build_rayjob(job, Owner("tiny-grpo", "team-a", UID), 0, default_image="img", generation=1)
    return dict(rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"])


def test_monitoring_is_off_by_default():
    pytest.importorskip("helm_python")
    objects = render({})
    assert of_kind(objects, "PodMonitor") == []
    assert [cm for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"].endswith("-dashboard")] == []


def test_the_pod_monitor_selects_the_heads_the_operator_builds_on_their_metrics_port():
    pytest.importorskip("helm_python")
    monitor = one(render(MONITORING_ON), "PodMonitor")
    selector = monitor["spec"]["selector"]
    labels = head_pod_labels()
    assert all(labels.get(key) == value for key, value in selector["matchLabels"].items())
    assert all(expression["key"] in labels for expression in selector["matchExpressions"])
    assert labels[names.JOB_LABEL] == "tiny-grpo"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (METRICS_PORT_NAME, "/metrics")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_with_namespaced_rbac_the_pod_monitor_watches_the_job_namespaces_only():
    pytest.importorskip("helm_python")
    values = {**MONITORING_ON, "rbac": {"scope": "namespace"}, "watchNamespaces": ["team-a", "team-b"]}
    monitor = one(render(values), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar():
    pytest.importorskip("helm_python")
    (configmap,) = [
        cm for cm in of_kind(render(MONITORING_ON), "ConfigMap") if cm["metadata"]["name"] == "kuberl-dashboard"
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["kuberl-rljobs.json"]) == dashboard()


def test_the_dashboard_queries_only_metrics_the_runtime_exports():
    used = {name for query in queries(dashboard()) for name in METRIC_IN_QUERY.findall(query)}
    assert used, "the dashboard queries nothing"
    assert used <= metric_names(), f"not exported by the runtime: {sorted(used - metric_names())}"


def test_the_dashboard_shows_every_series_the_runtime_exports():
    used = {name for query in queries(dashboard()) for name in METRIC_IN_QUERY.findall(query)}
    missing = {export.metric for export in EXPORTS} - used - {"kuberl_training_epoch"}
    assert not missing, f"exported but on no panel: {sorted(missing)}"


def test_every_panel_is_filtered_by_the_namespace_and_rljob_variables():
    for query in queries(dashboard()):
        if query.startswith("label_values"):
            continue
        for name in METRIC_IN_QUERY.findall(query):
            assert re.search(name + r'\{namespace=~"\$namespace", rljob=~"\$rljob"\}', query), query
