"""With an elastic pool, KubeRay's autoscaler gets a Role over every pod and RayCluster of the namespace, bound to
the head pod's ServiceAccount (tests/unit/operator/kuberay_autoscaler.py, transcribed from KubeRay 1.6.2). User code
can run in the head's Ray container (the controller imports an environment's module; a reward without a pool runs
beside it), so that container must not hold the autoscaler's token: the head pod runs as `<job>-autoscaler`, whose
token only the autoscaler's container mounts, and the Ray container gets `<job>-runtime`'s (access.py, builders.py).
"""

import pytest

from tests.unit.operator.conftest import World, at, base_spec, make_rljob
from tests.unit.operator.kuberay_autoscaler import AUTOSCALER_CONTAINER, autoscaler_role_binding, head_pod, token_holder

REPORT_ONLY = [
    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["tiny-grpo-progress"], "verbs": ["patch"]}
]
ELASTIC = {
    # the case: an elastic rollout pool and no reward pool, so the reward's code runs on the head
    "rollout pool, reward on the head": {
        "rollout": {"placement": "separate"},
        "resources": {"rollout": {"replicas": 1, "minReplicas": 1, "maxReplicas": 3}},
    },
    "reward pool": {"resources": {"reward": {"replicas": 1, "minReplicas": 0, "maxReplicas": 4}}},
}


def started(changes: dict) -> World:
    world = World(rljob=make_rljob(base_spec() | changes))
    world.step(at(0))
    return world


def of_kind(world: World, kind: str) -> dict[str, dict]:
    return {name: obj for (found, name), obj in world.access.items() if found == kind}


@pytest.mark.parametrize("changes", ELASTIC.values(), ids=ELASTIC.keys())
def test_the_heads_ray_container_never_holds_the_autoscalers_rights(changes: dict):
    world = started(changes)
    pod = head_pod(world.rayjobs["tiny-grpo-0"], cluster_name="tiny-grpo-0-x7k2p")
    rules, bound_to = autoscaler_role_binding(pod)
    containers = {container["name"]: container for container in pod["spec"]["containers"]}
    secrets = of_kind(world, "Secret")
    ray = token_holder(pod, containers["ray-head"], secrets)
    assert ray != bound_to  # before: both were tiny-grpo-runtime, whose token the Ray container mounted
    assert ray == "tiny-grpo-runtime" and of_kind(world, "Role")["tiny-grpo-runtime"]["rules"] == REPORT_ONLY
    assert token_holder(pod, containers[AUTOSCALER_CONTAINER], secrets) == bound_to == "tiny-grpo-autoscaler"
    assert any(rule["resources"] == ["pods"] and "patch" in rule["verbs"] for rule in rules)  # what it holds


def test_the_autoscalers_account_exists_before_kuberay_needs_it_and_mounts_no_token_itself():
    """KubeRay refuses to reconcile a head pod that names an account that does not exist (raycluster_controller.go
    reconcileAutoscalerServiceAccount): the operator makes it with the job's other access objects."""
    world = started(ELASTIC["reward pool"])
    account = of_kind(world, "ServiceAccount")["tiny-grpo-autoscaler"]
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["ownerReferences"][0]["name"] == "tiny-grpo"
    secret = of_kind(world, "Secret")["tiny-grpo-runtime-token"]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "tiny-grpo-runtime"}
    assert "stringData" not in secret  # Kubernetes' token controller fills it; the operator never holds the token
    head = world.rayjobs["tiny-grpo-0"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (volume,) = [v for v in head["volumes"] if v.get("secret", {}).get("secretName") == "tiny-grpo-runtime-token"]
    assert [item["key"] for item in volume["secret"]["items"]] == ["token", "ca.crt", "namespace"]  # waits for them


def test_a_job_without_an_elastic_pool_keeps_one_account_and_its_automatic_token():
    world = started({})
    pod = head_pod(world.rayjobs["tiny-grpo-0"], cluster_name="tiny-grpo-0-x7k2p")
    assert [container["name"] for container in pod["spec"]["containers"]] == ["ray-head"]  # no autoscaler
    assert token_holder(pod, pod["spec"]["containers"][0], {}) == "tiny-grpo-runtime"
    assert "tiny-grpo-autoscaler" not in of_kind(world, "ServiceAccount")
    assert "tiny-grpo-runtime-token" not in of_kind(world, "Secret")
