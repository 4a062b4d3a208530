"""Every count and duration a user writes is bounded in the schema, so no value the API server stores can
overflow what the operator or the runtime does with it (api/limits.py)."""

import pytest

from kuberl.api import ManifestError, parse_rljob
from kuberl.api.crd import build_crd
from kuberl.api.limits import MAX_DURATION_SECONDS, MAX_SEED
from tests.unit.api.test_crd import walk


def test_every_number_in_the_spec_has_a_maximum_in_the_crd():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    numbers = [(path, node) for path, node in walk(spec, "spec") if node.get("type") in ("integer", "number")]
    assert len(numbers) > 50
    assert [path for path, node in numbers if "maximum" not in node] == []


def with_field(manifest: dict, dotted: str, value: object) -> dict:
    node = manifest["spec"]
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return manifest


@pytest.mark.parametrize(
    ("dotted", "too_large"),
    [
        ("runPolicy.activeDeadlineSeconds", 10**12),
        ("runPolicy.ttlSecondsAfterFinished", 10**12),
        ("runPolicy.activeDeadlineSeconds", MAX_DURATION_SECONDS + 1),
        ("training.seed", MAX_SEED + 1),
        ("training.totalSteps", 10**12),
    ],
)
def test_a_value_over_its_bound_is_refused_naming_the_field(minimal_manifest, dotted, too_large):
    with pytest.raises(ManifestError) as refused:
        parse_rljob(with_field(minimal_manifest, dotted, too_large))
    assert [problem.path for problem in refused.value.problems] == [f"spec.{dotted}"]
    assert "less than or equal" in str(refused.value)


def test_the_largest_seed_numpy_and_vllm_take_is_accepted(minimal_manifest):
    import numpy as np

    job = parse_rljob(with_field(minimal_manifest, "training.seed", MAX_SEED))
    np.random.seed(job.spec.training.seed)  # the 32-bit seed API refuses 2**32
    with pytest.raises(ValueError):
        np.random.seed(MAX_SEED + 1)


def test_a_batch_timeout_shorter_than_the_endpoint_may_retry_is_refused(minimal_manifest):
    minimal_manifest["spec"]["reward"] = {
        "endpoint": {"url": "https://judge.example/score", "timeoutSeconds": 300, "maxRetries": 2},
        "batchTimeoutSeconds": 600,
    }
    with pytest.raises(ManifestError) as refused:
        parse_rljob(minimal_manifest)
    (problem,) = refused.value.problems
    assert problem.path == "spec.reward.batchTimeoutSeconds"
    assert "3 attempts of timeoutSeconds (300) and the backoff between them, up to 960 s" in problem.message
    minimal_manifest["spec"]["reward"]["batchTimeoutSeconds"] = 960
    assert parse_rljob(minimal_manifest).spec.reward.batch_timeout_seconds == 960
