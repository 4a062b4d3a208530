"""On a real API server: with an elastic pool, the token the head's Ray container mounts may write the job's report
and nothing else, while KubeRay's autoscaler Role (played here as KubeRay 1.6.2 makes it) is bound to an account
whose token only the autoscaler's container mounts (tests/unit/operator/test_autoscaler_account.py for the pod).

This module runs its own API server with Kubernetes' token controller (`serviceaccount-token`), which fills the
Secret `<job>-runtime-token` the Ray container mounts, as in any cluster; the session's runs without it (in 1.20
it would also make a token Secret for every ServiceAccount of every test).
"""

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from kuberl.operator import names
from kuberl.operator.kube import ApiError, Kube
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import Reconciler
from kuberl.operator.settings import OperatorSettings
from tests.integration.envtest import FAKE_KUBERAY_CRDS, RLJOB_CRD, ControlPlane, wait_until
from tests.integration.operator.conftest import own_api_server, rljob_manifest, tiny_spec
from tests.unit.operator.conftest import KUBERAY
from tests.unit.operator.kuberay_autoscaler import AUTOSCALER_CONTAINER, autoscaler_role_binding, head_pod

pytestmark = pytest.mark.integration

NS = "elastic"
RBAC = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + NS
ELASTIC = {"resources": {"reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ControlPlane, Kube]]:
    with own_api_server([RLJOB_CRD, *FAKE_KUBERAY_CRDS], controllers="serviceaccount-token") as made:
        yield made


def as_token(kube: Kube, token: str) -> Kube:
    """The operator's client of the same API server, authenticated with `token` alone."""
    configuration = kube.configuration.__class__()
    configuration.host, configuration.ssl_ca_cert = kube.configuration.host, kube.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return Kube(configuration)


def accepted(kube: Kube, whose: str) -> Kube:
    """`kube` once the API server authenticates its token. The server checks a Secret's token against its own
    cached copy of the Secret (1.20's legacy service-account authenticator reads an informer's lister first), which
    lags the token controller's write: until the cache has the filled Secret every call is 401 (a busy fresh-clone
    run failed so). A pod that mounts the token starts later than this test asks."""
    wait_until(lambda: review(kube, "get", "configmaps"), timeout=60, what=f"the API server to accept {whose} token")
    return kube


def review(kube: Kube, verb: str, resource: str, group: str = "") -> dict[str, Any]:
    """The API server's answer to whether `kube`'s token may `verb` `resource` (any authenticated caller may ask)."""
    question = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": NS, "verb": verb, "resource": resource, "group": group}},
    }
    return dict(kube.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=question)["status"])


def may(kube: Kube, verb: str, resource: str, group: str = "") -> bool:
    return bool(review(kube, verb, resource, group)["allowed"])


def play_kuberay(cp: ControlPlane, rayjob: dict[str, Any]) -> str:
    """KubeRay's Role and RoleBinding for the RayJob's cluster (common/rbac.go); the account it binds."""
    pod = head_pod(rayjob, cluster_name="tiny-0-x7k2p")
    rules, account = autoscaler_role_binding(pod)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "tiny-0-x7k2p"}}
    cp.request("POST", f"{RBAC}/roles", {**role, "rules": rules})
    binding = {
        **role,
        "kind": "RoleBinding",
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-0-x7k2p"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}],
    }
    cp.request("POST", f"{RBAC}/rolebindings", binding)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["ray-head", AUTOSCALER_CONTAINER]
    return account


def test_the_ray_containers_token_writes_the_report_and_the_autoscalers_rights_are_elsewhere(
    cluster: tuple[ControlPlane, Kube],
):
    cp, kube = cluster
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    kube.create(names.rljob_path(NS), rljob_manifest("tiny", NS, tiny_spec(**ELASTIC)))
    Reconciler(kube, OperatorSettings(kuberay=KUBERAY), OperatorMetrics()).run_pass(NS, "tiny")
    rayjob = kube.get(names.rayjob_path(NS, "tiny-0"))
    assert rayjob is not None
    autoscaler_account = play_kuberay(cp, rayjob)
    assert autoscaler_account == "tiny-autoscaler"

    secret = f"/api/v1/namespaces/{NS}/secrets/tiny-runtime-token"
    filled = wait_until(lambda: (kube.get(secret) or {}).get("data", {}).get("token"), timeout=30, what="its token")
    ray_container = accepted(as_token(kube, base64.b64decode(filled).decode()), "the Ray container's")  # it mounts this
    report = {"data": {"report.json": '{"progress": {"step": 1}}'}}
    ray_container.call(
        "PATCH", names.configmap_path(NS, "tiny-progress"), body=report, content_type="application/merge-patch+json"
    )
    assert not may(ray_container, "patch", "pods") and not may(ray_container, "list", "pods")
    assert not may(ray_container, "patch", "rayclusters", "ray.io")
    with pytest.raises(ApiError) as refused:
        ray_container.call("GET", f"/api/v1/namespaces/{NS}/pods")
    assert refused.value.status == 403

    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    answer = cp.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{autoscaler_account}/token", request)
    autoscaler = accepted(as_token(kube, answer["status"]["token"]), "the autoscaler's")  # only its container mounts it
    assert may(autoscaler, "patch", "pods") and may(autoscaler, "patch", "rayclusters", "ray.io")
    for client in (ray_container, autoscaler):
        client.close()
