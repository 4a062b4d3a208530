"""Deterministic names: what a crash-safe operator derives from what it stored."""

import re

import pytest
import yaml

from kuberl.api import ManifestError, load_rljob_file, parse_rljob
from kuberl.api.manifest import MAX_NAME_LENGTH
from kuberl.operator.access import build_access
from kuberl.operator.builders import Owner, build_rayjob
from kuberl.operator.names import configmap_name, next_rayjob_name, rayjob_index, rayjob_name
from tests.unit.operator.conftest import KUBERAY, make_rljob


def test_rayjob_names_count_from_zero():
    assert rayjob_name("tiny-grpo", 0) == "tiny-grpo-0"
    assert next_rayjob_name("tiny-grpo", None) == "tiny-grpo-0"
    assert next_rayjob_name("tiny-grpo", "tiny-grpo-0") == "tiny-grpo-1"
    assert next_rayjob_name("tiny-grpo", "tiny-grpo-9") == "tiny-grpo-10"


@pytest.mark.parametrize(
    ("rayjob", "index"),
    [("tiny-grpo-3", 3), ("tiny-grpo-x", None), ("other-3", None), (None, None), ("tiny-grpo-", None)],
)
def test_the_index_is_read_back_only_from_this_jobs_names(rayjob: str | None, index: int | None):
    assert rayjob_index("tiny-grpo", rayjob) == index


def test_a_job_whose_name_ends_in_a_number_still_counts_its_own_rayjobs():
    assert rayjob_index("run-7", "run-7-2") == 2


def test_the_configmap_is_named_after_the_job():
    assert configmap_name("tiny-grpo") == "tiny-grpo-spec"


# -- what KubeRay and Kubernetes accept (KubeRay: ray-operator/controllers/ray/utils/validation.go) --------
#: ValidateRayJobMetadata: a DNS-1035 label of at most MaxRayJobNameLength (53 - 6) characters.
KUBERAY_RAYJOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_RAYJOB_NAME_LENGTH = 47
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_the_longest_job_name_makes_names_kuberay_and_kubernetes_accept_at_a_six_digit_index():
    name = "j" + "-x" * ((MAX_NAME_LENGTH - 1) // 2)  # 39-40 characters, ending in a letter
    name = name.ljust(MAX_NAME_LENGTH, "z")
    job = parse_rljob(make_rljob(name=name))
    owner = Owner.of(make_rljob(name=name))
    rayjob = build_rayjob(job, owner, 999_999, default_image="i:1", generation=1)
    made = rayjob["metadata"]["name"]
    assert len(made) <= MAX_RAYJOB_NAME_LENGTH and KUBERAY_RAYJOB_NAME.fullmatch(made), made
    others = [configmap_name(name), *(o["metadata"]["name"] for o in build_access(owner, KUBERAY))]
    for other in others:  # ConfigMap, ServiceAccount, Role, RoleBinding, Secret, NetworkPolicy
        assert len(other) <= 63 and DNS_1123_LABEL.fullmatch(other), other


@pytest.mark.parametrize("bad", ["7b-grpo", "-grpo", "grpo-", "Grpo", "grpo_7b", "g" * (MAX_NAME_LENGTH + 1)])
def test_kuberl_validate_refuses_a_name_kuberay_would_refuse_naming_metadata_name(bad: str, tmp_path):
    manifest = make_rljob(name=bad)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    with pytest.raises(ManifestError) as refused:
        load_rljob_file(path)
    (problem,) = refused.value.problems
    assert problem.path == "metadata.name"
    if bad == "7b-grpo":
        assert "must start with a lower-case letter" in problem.message and "'job-7b-grpo'" in problem.message
