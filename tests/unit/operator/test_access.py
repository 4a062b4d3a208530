"""What fences a job in: Pod Security `restricted` pods, the job's own narrow identity, Ray's token, a NetworkPolicy.

The objects are checked here as built; tests/integration/chart creates them on the real API server with
the chart's RBAC and uses the runtime's token against it, and tests/integration/runtime/test_ray_auth.py
starts real Ray with what they configure.
"""

import copy
from typing import Any

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.api.contract import METRICS_PORT, RAY_DASHBOARD_PORT
from kuberl.operator import names
from kuberl.operator.access import (
    CREATE_ONLY,
    KubeRayPeer,
    build_access,
    build_network_policy,
    build_runtime_identity,
)
from kuberl.operator.builders import Owner, build_rayjob
from tests.conftest import REPO
from tests.unit.operator.conftest import KUBERAY, UID, base_spec, make_rljob
from tests.unit.operator.pod_security import violations

OWNER = Owner(name="tiny-grpo", namespace="team-a", uid=UID)
RESTRICTED_CONTAINER = {
    "name": "main",
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    },
}
RESTRICTED_POD = {
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [RESTRICTED_CONTAINER],
    }
}


def rayjob_of(spec: dict[str, Any]) -> dict[str, Any]:
    return build_rayjob(parse_rljob(make_rljob(spec)), OWNER, 0, default_image="i:1", generation=1)


def pods_of(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template in the RayJob, the head's with the autoscaler container KubeRay adds when elastic."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = copy.deepcopy(cluster["headGroupSpec"]["template"])
    if cluster.get("enableInTreeAutoscaling"):
        autoscaler = {"name": "autoscaler", **cluster.get("autoscalerOptions", {})}
        head["spec"]["containers"].append(autoscaler)
    return [head] + [group["template"] for group in cluster["workerGroupSpecs"]]


def example_specs() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text())["spec"] for path in sorted((REPO / "examples").glob("*.yaml"))]


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda pod: pod["spec"]["securityContext"].pop("runAsNonRoot"), "runAsNonRoot is not true"),
        (lambda pod: pod["spec"]["securityContext"].pop("seccompProfile"), "seccompProfile is not RuntimeDefault"),
        (lambda pod: pod["spec"]["containers"][0]["securityContext"].pop("capabilities"), "do not drop ALL"),
        (
            lambda pod: pod["spec"]["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
            "allowPrivilegeEscalation is not false",
        ),
        (lambda pod: pod["spec"].update(hostNetwork=True), "host namespaces"),
        (lambda pod: pod["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "hostPath"),
        (
            lambda pod: pod["spec"]["containers"][0]["securityContext"].update(
                capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}
            ),
            "SYS_ADMIN",
        ),
    ],
)
def test_the_restricted_check_refuses_each_rule_it_knows(change: Any, rule: str):
    assert violations(RESTRICTED_POD) == []
    pod = copy.deepcopy(RESTRICTED_POD)
    change(pod)
    assert any(rule in found for found in violations(pod)), violations(pod)


@pytest.mark.parametrize("spec", example_specs(), ids=lambda spec: spec["models"]["actor"]["path"])
def test_every_ray_pod_of_every_example_passes_pod_security_restricted(spec: dict[str, Any]):
    for pod in pods_of(rayjob_of(spec)):
        assert violations(pod) == [], pod["metadata"]["labels"]


def test_the_autoscaler_kuberay_adds_to_an_elastic_jobs_head_is_restricted_too():
    spec = base_spec()
    spec["resources"] = {"reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}}
    cluster = rayjob_of(spec)["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"]
    assert violations({"spec": {"containers": [{"name": "autoscaler", **cluster["autoscalerOptions"]}]}}) == []


def test_only_the_head_pod_gets_the_service_account_token():
    spec = base_spec()
    spec["resources"] = {"reward": {"replicas": 2}}
    head, *workers = pods_of(rayjob_of(spec))
    assert head["spec"]["automountServiceAccountToken"] is True  # the controller publishes from there
    assert [w["spec"]["automountServiceAccountToken"] for w in workers] == [False, False]  # reward code runs here
    assert [a for a in build_runtime_identity(OWNER) if a["kind"] == "ServiceAccount"][0][
        "automountServiceAccountToken"
    ] is False


def test_the_head_is_told_which_configmap_to_report_into():
    head, worker = pods_of(rayjob_of(base_spec()))
    env = {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}
    assert env["KUBERL_STATUS_CONFIGMAP"] == "tiny-grpo-progress"
    assert "KUBERL_STATUS_CONFIGMAP" not in {e["name"] for e in worker["spec"]["containers"][0]["env"]}


def test_the_jobs_account_may_patch_its_own_report_and_nothing_else():
    account, role, binding = build_runtime_identity(OWNER)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["tiny-grpo-progress"], "verbs": ["patch"]}
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-grpo-runtime"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "team-a"}
    ]


def test_ray_token_authentication_is_on_with_the_jobs_own_secret():
    rayjob = rayjob_of(base_spec())
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "tiny-grpo-ray-token"}
    assert cluster["rayVersion"] == "2.60.0"  # KubeRay refuses authOptions without a rayVersion of 2.52+
    assert rayjob["spec"]["submissionMode"] == "HTTPMode"  # no submitter pod: KubeRay's operator submits
    (secret,) = [child for child in build_access(OWNER, KUBERAY) if child["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "tiny-grpo-ray-token"
    assert "data" not in secret and "stringData" not in secret  # the token is made when it is created
    assert "Secret" in CREATE_ONLY  # and never overwritten


def test_the_network_policy_admits_the_jobs_own_pods_kuberay_on_the_dashboard_and_scrapers_on_the_metrics():
    policy = build_network_policy(OWNER, KubeRayPeer(namespace="ray-system"))
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {names.JOB_LABEL: "tiny-grpo"}}
    assert spec["policyTypes"] == ["Ingress"]
    own, kuberay, scrapers = spec["ingress"]
    assert scrapers == {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]}  # any source, that port only
    assert own == {"from": [{"podSelector": {"matchLabels": {names.JOB_LABEL: "tiny-grpo"}}}]}
    assert kuberay["ports"] == [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}]
    assert kuberay["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
        }
    ]


def test_kuberays_namespace_is_required_so_its_labels_are_admitted_from_there_only():
    """A pod labelled as KubeRay's operator in any other namespace (anyone who may create a pod can label it so)
    is not admitted to the dashboard: the policy always selects KubeRay's namespace by its name."""
    with pytest.raises(ValueError, match="KubeRay's namespace must be given"):
        KubeRayPeer(namespace="")
    (_, kuberay, _) = build_network_policy(OWNER, KUBERAY)["spec"]["ingress"]
    (peer,) = kuberay["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}


def test_every_ray_pod_carries_the_label_the_network_policy_selects():
    for pod in pods_of(rayjob_of(base_spec())):
        assert pod["metadata"]["labels"][names.JOB_LABEL] == "tiny-grpo"


def test_every_access_object_is_owned_by_the_rljob():
    for child in build_access(OWNER, KUBERAY):
        assert child["metadata"]["ownerReferences"][0]["uid"] == UID, child["kind"]
        assert child["metadata"]["labels"][names.JOB_LABEL] == "tiny-grpo"
