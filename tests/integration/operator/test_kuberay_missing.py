"""A cluster without KubeRay: the job says so in a condition instead of failing every pass on the RayJob list.

This module runs its own API server holding only the RLJob CRD (the session's has the KubeRay stand-ins),
and one reconcile pass (the same `Reconciler` the operator runs) against it; the KubeRay stand-in CRD is
then installed and the next pass creates the RayJob.
"""

from collections.abc import Iterator

import pytest

from kuberl.operator import names
from kuberl.operator.decide import KUBERAY_RETRY_SECONDS
from kuberl.operator.kube import Kube
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import Reconciler
from kuberl.operator.settings import OperatorSettings
from tests.integration.envtest import FAKE_KUBERAY_CRDS, RLJOB_CRD, ControlPlane
from tests.integration.operator.conftest import own_api_server, rljob_manifest, tiny_spec
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare_cluster() -> Iterator[tuple[ControlPlane, Kube]]:
    with own_api_server([RLJOB_CRD]) as cluster:
        yield cluster


def test_without_kuberay_the_job_waits_with_a_condition_saying_what_to_install(bare_cluster: tuple[ControlPlane, Kube]):
    cp, kube = bare_cluster
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "no-kuberay"}}
    cp.request("POST", "/api/v1/namespaces", namespace)
    kube.create(names.rljob_path("no-kuberay"), rljob_manifest("waiting", "no-kuberay", tiny_spec()))
    reconciler = Reconciler(kube, OperatorSettings(kuberay=KUBERAY), OperatorMetrics())

    decision = reconciler.run_pass("no-kuberay", "waiting")
    assert decision is not None and decision.requeue_after == KUBERAY_RETRY_SECONDS
    status = (kube.get(names.rljob_path("no-kuberay", "waiting")) or {})["status"]
    (created,) = status["conditions"]
    assert (created["type"], created["status"], created["reason"]) == ("Created", "False", "KubeRayMissing")
    assert "install KubeRay" in created["message"]
    assert status["phase"] == "Pending"

    cp.install_crds(FAKE_KUBERAY_CRDS)  # KubeRay installed meanwhile
    reconciler.run_pass("no-kuberay", "waiting")
    assert kube.get(names.rayjob_path("no-kuberay", "waiting-0")) is not None
