"""A KubeRay too old for Ray's token authentication: the job says so and no unauthenticated Ray cluster is made.

KubeRay's RayJob CRD knows `rayClusterSpec.authOptions` from 1.5.1; with an older one the API server drops it
from every RayJob, and KubeRay would start the job's Ray cluster without authentication. This module runs its
own API server with a stand-in of KubeRay 1.4.2's RayJob CRD (crds/kuberay-1.4.2-rayjob-fields.yaml: 1.4.2's
fields, so the real API server prunes what 1.4.2's schema prunes) and one reconcile pass (the operator's own
`Reconciler`) against it; then "upgrades KubeRay" (the stand-in CRD of the session's tests, which keeps every
field) and the next pass creates the RayJob with its authOptions.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.operator import names
from kuberl.operator.kube import Kube
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import ApplyFailed, Reconciler
from kuberl.operator.settings import OperatorSettings
from tests.integration.envtest import FAKE_KUBERAY_CRDS, RLJOB_CRD, ControlPlane, wait_until
from tests.integration.operator.conftest import own_api_server, rljob_manifest, tiny_spec
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration

KUBERAY_1_4_RAYJOB_CRD = Path(__file__).parent / "crds" / "kuberay-1.4.2-rayjob-fields.yaml"
NAMESPACE = "old-kuberay"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def old_kuberay() -> Iterator[tuple[ControlPlane, Kube]]:
    with own_api_server([RLJOB_CRD, KUBERAY_1_4_RAYJOB_CRD]) as cluster:
        yield cluster


def crd_names(cp: ControlPlane) -> set[str]:
    return {crd["metadata"]["name"] for crd in cp.request("GET", CRDS)["items"]}


def upgrade_kuberay(cp: ControlPlane) -> None:
    """Replace the 1.4.2 stand-in CRD with the one that keeps every field (KubeRay 1.6's knows authOptions)."""
    cp.request("DELETE", f"{CRDS}/rayjobs.ray.io")
    wait_until(lambda: "rayjobs.ray.io" not in crd_names(cp), timeout=30, what="the old RayJob CRD to go")
    cp.install_crds([path for path in FAKE_KUBERAY_CRDS if "rayjob" in path.name])


def test_with_kuberay_1_4_the_job_says_kuberay_is_too_old_and_nothing_runs_without_authentication(
    old_kuberay: tuple[ControlPlane, Kube],
):
    cp, kube = old_kuberay
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kube.create(names.rljob_path(NAMESPACE), rljob_manifest("tiny", NAMESPACE, tiny_spec()))
    reconciler = Reconciler(kube, OperatorSettings(kuberay=KUBERAY), OperatorMetrics())

    with pytest.raises(ApplyFailed):  # the queue retries it with a growing delay
        reconciler.run_pass(NAMESPACE, "tiny")
    assert kube.call("GET", names.rayjob_path(NAMESPACE))["items"] == []  # no RayJob, so no Ray cluster at all
    status = (kube.get(names.rljob_path(NAMESPACE, "tiny")) or {})["status"]
    (created,) = [c for c in status["conditions"] if c["type"] == "Created"]
    assert (created["status"], created["reason"]) == ("False", "KubeRayTooOld")
    assert created["message"].startswith("KubeRay too old for token auth: the API server drops")
    events = kube.call("GET", names.events_path(NAMESPACE))["items"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "KubeRayTooOld")]

    upgrade_kuberay(cp)
    reconciler.run_pass(NAMESPACE, "tiny")
    rayjob = kube.get(names.rayjob_path(NAMESPACE, "tiny-0"))
    assert rayjob is not None
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": "tiny-ray-token"}
