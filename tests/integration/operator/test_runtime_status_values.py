"""The runtime's status publisher against a real API server, with the values a diverging run produces.

JSON has no NaN: a report holding one would be refused (by the API server in a body, by the operator in
the report), so a NaN reward would also have kept the step and the last good checkpoint out of the status.
No operator runs here; the publisher writes its report ConfigMap with the admin's token (what it may do
with its own ServiceAccount, and the operator copying the report into the status, are
tests/integration/chart's).
"""

import json
import math
import ssl
from pathlib import Path

import pytest

from kuberl.api.status import REPORT_KEY
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher, status_metrics
from tests.integration.envtest import ControlPlane

pytestmark = pytest.mark.integration


def create_rljob(cp: ControlPlane, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "models": {"actor": {"path": "tiny://demo"}},
            "data": {"train": "/data/train.jsonl"},
            "reward": {"function": "tiny_task"},
            "checkpoint": {"pvcClaimName": "checkpoints"},  # the webhook asks for storage every pod shares
        },
    }
    cp.request("POST", f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs", body)


def test_a_step_with_non_finite_metrics_still_publishes_its_progress_and_checkpoint(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
):
    create_rljob(control_plane, namespace, "diverged")
    token = tmp_path / "token"
    token.write_text(control_plane.token)
    publisher = KubernetesStatusPublisher(
        "diverged",
        namespace,
        control_plane.server,
        token,
        ssl.create_default_context(cafile=str(control_plane.ca_file)),
        configmap="diverged-progress",
        min_interval=0.0,
    )
    metrics = status_metrics({"reward/mean": math.nan, "kl/mean": math.inf, "response/length_mean": 7.5})
    checkpoint = {"step": 2, "uri": "/checkpoints/step-000002", "time": "2026-01-01T00:00:00Z"}
    validation = {"step": 4, "samples": 8, "greedyMean": math.nan, "meanAtK": 0.5}
    publisher.publish({"step": 4, "totalSteps": 10, "etaSeconds": math.inf}, metrics, checkpoint, validation)
    publisher.close(timeout=10)
    configmap = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/diverged-progress")

    def refuse(constant: str) -> None:
        raise AssertionError(f"the report holds {constant}, which JSON does not have")

    status = json.loads(configmap["data"][REPORT_KEY], parse_constant=refuse)
    assert status["progress"] == {"step": 4, "totalSteps": 10, "epoch": 0}
    assert status["lastCheckpoint"]["uri"] == "/checkpoints/step-000002"
    assert status["metrics"] == {"responseLength": 7.5}
    assert "validation" not in status  # a validation with a NaN mean is not sent; the last good one would stay
