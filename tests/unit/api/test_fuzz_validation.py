"""Property: whatever a manifest holds, validation answers with ManifestError or a valid RLJob — nothing else;
and a valid RLJob is one the webhook's cluster review and the operator's builders take without an error.

The second half is what the webhook, `kuberl validate --cluster` and every reconcile pass do with an admitted
job (operator/webhook.py `review`, operator/builders.py `build_rayjob`): a value `parse_rljob` let through that
they cannot read (a pod template's `spec: "x"`, `containers: [1.5]`, a mount path that is a number) crashed
them all, the webhook with a bare 500. Pod templates get mutations of their own, aimed at the values the
operator merges and reads. And KubeRay accepts the RayJob built for an admitted job (its validation,
transcribed in tests/unit/operator/kuberay_validation.py): a podTemplate's `containers: []` was admitted and
refused by KubeRay after creation.
"""

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberl.api import ManifestError, RLJob, parse_rljob
from kuberl.operator.builders import Owner, build_rayjob
from kuberl.operator.webhook import review
from tests.conftest import REPO
from tests.unit.operator.kuberay_validation import kuberay_refusal

EXAMPLES = [yaml.safe_load(path.read_text()) for path in sorted((REPO / "examples").glob("*.yaml"))]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["grpo", "ppo", "vllm", "separate", "16Gi", "s3://b/k", "hf://x/y", "a:b", "Exists", "-1"]),
)
json_like = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths_of(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths_of(value, (*prefix, index))


def replaced(document, path, value):
    out = copy.deepcopy(document)
    if not path:
        return value
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def check(document):
    try:
        job = parse_rljob(document)
    except ManifestError as error:
        assert error.problems, "a ManifestError must name at least one problem"
        for problem in error.problems:
            assert isinstance(problem.path, str) and problem.message
    else:
        assert isinstance(job, RLJob)
        # what the webhook answers, and what the operator builds, for a job the door let in; and KubeRay takes it
        review({**document, "metadata": {**document.get("metadata", {}), "namespace": "fuzz"}})
        owner = Owner(name=job.metadata.name, namespace="fuzz", uid="u")
        assert kuberay_refusal(build_rayjob(job, owner, 0, default_image="i", generation=1)) is None


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(EXAMPLES).flatmap(lambda doc: st.tuples(st.just(doc), st.sampled_from(list(paths_of(doc))))),
    json_like,
)
def test_mutated_examples_only_ever_give_validation_errors(doc_and_path, value):
    document, path = doc_and_path
    check(replaced(document, path, value))


@settings(max_examples=500, deadline=None)
@given(json_like)
def test_arbitrary_documents_only_ever_give_validation_errors(document):
    check(document)


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "algorithm",
                "models",
                "reward",
                "data",
                "rollout",
                "resources",
                "checkpoint",
                "runPolicy",
                "training",
                "env",
                "secretRefs",
                "image",
            ]
        ),
        json_like,
        max_size=12,
    )
)
def test_arbitrary_specs_only_ever_give_validation_errors(spec):
    check({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "fuzz"}, "spec": spec})


#: A pod template with a value in every place the operator merges or reads (named lists, mounts, env, grace).
POD_TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"note": "x"}},
    "spec": {
        "containers": [
            {
                "name": "ray-worker",
                "env": [{"name": "A", "value": "1"}],
                "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
                "resources": {"limits": {"memory": "1Gi"}},
            },
            {"name": "sidecar", "image": "busybox"},
        ],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
        "terminationGracePeriodSeconds": 600,
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
}
CLUSTER_EXAMPLE = yaml.safe_load((REPO / "examples" / "tiny-grpo-cluster.yaml").read_text())


def with_pod_templates(template):
    """The cluster demo with `template` as the head's and the actor pool's podTemplate."""
    document = copy.deepcopy(CLUSTER_EXAMPLE)
    resources = document["spec"].setdefault("resources", {})
    resources["head"] = {"podTemplate": template}
    resources.setdefault("actor", {})["podTemplate"] = template
    return document


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(paths_of(POD_TEMPLATE))), json_like)
def test_mutated_pod_templates_only_ever_give_validation_errors(path, value):
    check(with_pod_templates(replaced(POD_TEMPLATE, path, value)))
