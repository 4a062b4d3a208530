"""Property: whatever a manifest holds, validation answers with ManifestError or a valid RLJob — nothing else."""

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberl.api import ManifestError, RLJob, parse_rljob
from tests.conftest import REPO

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
