"""A role's podTemplate is held to the pod template KubeRay's RayJob takes (api/pod_template.py): each malformed
value is refused at the door with its field path, and a partial template of the kind the examples use passes."""

import copy

import pytest

from kuberl.api import ManifestError, parse_rljob
from kuberl.api.pod_template import SCHEMA, pod_template_problems
from kuberl.operator.webhook import review
from tests.unit.api.test_rules import BASE
from tests.unit.operator.conftest import base_spec, make_rljob

HEAD = "spec.resources.head.podTemplate"
ACTOR = "spec.resources.actor.podTemplate"


def with_template(pool: str, template: object) -> dict:
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["resources"] = {pool: {"podTemplate": template}}
    return manifest


def problems(pool: str, template: object) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        parse_rljob(with_template(pool, template))
    return {problem.path: problem.message for problem in caught.value.problems}


# (case, pool, template, the path blamed, a phrase of the message): the first four crashed the webhook before
MALFORMED = [
    ("spec is a string", "head", {"spec": "x"}, f"{HEAD}.spec", "expected a mapping, found a string"),
    (
        "a container that is a number",
        "actor",
        {"spec": {"containers": [1.5]}},
        f"{ACTOR}.spec.containers[0]",
        "expected a mapping, found a number (1.5)",
    ),
    (
        "a mount path that is a number",
        "head",
        {"spec": {"containers": [{"name": "ray-head", "volumeMounts": [{"name": "m", "mountPath": 3}]}]}},
        f"{HEAD}.spec.containers[0].volumeMounts[0].mountPath",
        "expected a string, found a number (3)",
    ),
    (
        "a container name that is a map",
        "actor",
        {"spec": {"containers": [{"name": {"a": 1}}]}},
        f"{ACTOR}.spec.containers[0].name",
        "expected a string, found a mapping",
    ),
    (
        "a container without a name",
        "head",
        {"spec": {"containers": [{"image": "busybox"}]}},
        f"{HEAD}.spec.containers[0]",
        "needs a name",
    ),
    (
        "a volume named twice",
        "actor",
        {"spec": {"volumes": [{"name": "m", "emptyDir": {}}, {"name": "m", "emptyDir": {}}]}},
        f"{ACTOR}.spec.volumes[1].name",
        "already the name of item [0]",
    ),
    (
        "a typo KubeRay's CRD would drop",
        "head",
        {"spec": {"nodeSelectr": {"a": "b"}}},
        f"{HEAD}.spec.nodeSelectr",
        "did you mean nodeSelector?",
    ),
    (
        "a field of the template itself",
        "head",
        {"spec": {}, "kind": "Pod"},
        f"{HEAD}.kind",
        "known fields here: metadata, spec",
    ),
    ("a label that is a number", "head", {"metadata": {"labels": {"a": 1}}}, f"{HEAD}.metadata.labels.a", "string"),
    (
        "a quantity Kubernetes does not read",
        "actor",
        {"spec": {"containers": [{"name": "ray-worker", "resources": {"limits": {"memory": "16GB"}}}]}},
        f"{ACTOR}.spec.containers[0].resources.limits.memory",
        "a quantity such as",
    ),
    (
        "a grace period that is a string",
        "head",
        {"spec": {"terminationGracePeriodSeconds": "600"}},
        f"{HEAD}.spec.terminationGracePeriodSeconds",
        "expected an integer",
    ),
    ("a null", "head", {"spec": None}, f"{HEAD}.spec", "null is not a value here"),
    (
        "a port that is true",
        "head",
        {"spec": {"containers": [{"name": "ray-head", "livenessProbe": {"httpGet": {"port": True}}}]}},
        f"{HEAD}.spec.containers[0].livenessProbe.httpGet.port",
        "an integer or a string",
    ),
]


@pytest.mark.parametrize(
    ("pool", "template", "path", "phrase"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_a_malformed_pod_template_is_refused_naming_the_field(pool, template, path, phrase):
    found = problems(pool, template)
    assert list(found) == [path]
    assert phrase in found[path]


# Partial templates as users write them: merged into the operator's own, so fields Kubernetes requires of a whole
# item may be left to the item of the same name (a mount of the checkpoint claim made read-only, say).
VALID = [
    ("the examples' models volume", "actor", {"spec": {"containers": [{"name": "ray-worker", "volumeMounts": [
        {"name": "models", "mountPath": "/models", "readOnly": True}]}], "volumes": [
        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]}}),
    ("a runtime class and seccomp", "head", {"spec": {"runtimeClassName": "gvisor", "securityContext": {
        "seccompProfile": {"type": "Unconfined"}}}}),
    ("an item merged into the operator's", "actor", {"spec": {"containers": [{"name": "ray-worker", "volumeMounts": [
        {"name": "kuberl-checkpoints", "readOnly": True}]}]}}),
    ("quantities as numbers and strings", "actor", {"spec": {"containers": [{"name": "ray-worker", "resources": {
        "limits": {"cpu": 2, "memory": "16Gi", "ephemeral-storage": "1e9"}}}]}}),
    ("labels, annotations and a priority class", "head", {"metadata": {"labels": {"team": "rl"}, "annotations": {
        "a": "b"}}, "spec": {"priorityClassName": "high"}}),
    ("a named port by name", "head", {"spec": {"containers": [{"name": "ray-head", "readinessProbe": {"httpGet": {
        "port": "dashboard", "path": "/"}}}]}}),
]  # fmt: skip


@pytest.mark.parametrize(("pool", "template"), [case[1:] for case in VALID], ids=[case[0] for case in VALID])
def test_a_partial_pod_template_of_the_right_shape_passes(pool, template):
    parse_rljob(with_template(pool, template))


def test_every_problem_of_one_template_is_reported():
    found = problems("head", {"spec": {"containers": [1.5, {"name": 2}], "hostNetwork": "yes"}})
    assert sorted(found) == [
        f"{HEAD}.spec.containers[0]",
        f"{HEAD}.spec.containers[1].name",
        f"{HEAD}.spec.hostNetwork",
    ]


def test_the_webhook_answers_a_malformed_template_with_its_path_instead_of_failing():
    template = {"spec": {"containers": [{"name": "ray-head", "volumeMounts": [{"name": "m", "mountPath": 3}]}]}}
    job = make_rljob(
        base_spec() | {"checkpoint": {"pvcClaimName": "ckpt"}, "resources": {"head": {"podTemplate": template}}}
    )
    (problem,) = review(job).problems
    assert problem.path == f"{HEAD}.spec.containers[0].volumeMounts[0].mountPath"


def test_the_schema_is_kuberays_pod_template():
    """The vendored schema says where it comes from and knows the fields a pod template has."""
    assert "kuberay v1.6.2" in SCHEMA["source"] and "headGroupSpec.template" in SCHEMA["source"]
    assert pod_template_problems({"spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelector": {}}}) == []
