"""The door refuses what KubeRay's own validation would refuse of the RayJob an RLJob becomes (api/kuberay.py).

KubeRay cannot run here; kuberay_validation.py transcribes its validation (v1.6.2's validation.go) and is held to
it with KubeRay's own words. The property: whatever a job puts into the env KubeRay reads and the pod templates,
either `parse_rljob` refuses it or KubeRay accepts the RayJob the operator builds for it.
"""

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.api import ManifestError, parse_rljob
from kuberl.operator.builders import Owner, build_rayjob
from tests.conftest import REPO
from tests.unit.operator.conftest import UID, base_spec, make_rljob
from tests.unit.operator.kuberay_validation import kuberay_refusal

OWNER = Owner(name="tiny-grpo", namespace="team-a", uid=UID)
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def rayjob_of(spec: dict, index: int = 0) -> dict:
    return build_rayjob(parse_rljob(make_rljob(spec)), OWNER, index, default_image="i:1", generation=1)


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_kuberay_accepts_the_rayjob_of_every_example(example):
    manifest = yaml.safe_load(example.read_text())
    for index in (0, 1):
        assert kuberay_refusal(rayjob_of(manifest["spec"], index)) is None


def head_container(rayjob: dict) -> dict:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}, "implicitly enables GCS fault tolerance"),
        ({"name": "REDIS_USERNAME", "value": "ray"}, "cannot set redis username"),
        ({"name": "RAY_enable_autoscaler_v2", "value": "true"}, "cannot be set to 'true' when enableInTree"),
    ],
)
def test_the_stand_in_refuses_in_kuberays_words_what_kuberay_refuses(env, words):
    """The stand-in is not vacuous: the env KubeRay refuses, put into the head's Ray container."""
    rayjob = copy.deepcopy(rayjob_of(base_spec()))
    head_container(rayjob)["env"].append(env)
    assert words in (kuberay_refusal(rayjob) or "")
    empty = copy.deepcopy(rayjob_of(base_spec()))
    empty["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"] = []
    assert kuberay_refusal(empty) == "The RayJob spec is invalid: headGroupSpec should have at least one container"


def test_the_stand_in_refuses_a_ray_version_without_token_authentication():
    spec = base_spec()
    rayjob = build_rayjob(
        parse_rljob(make_rljob(spec)), OWNER, 0, default_image="i", generation=1, ray_version="2.51.1"
    )
    assert "minimum Ray version is 2.52.0, got 2.51.1" in (kuberay_refusal(rayjob) or "")


ENV_NAMES = st.sampled_from(
    ["RAY_REDIS_ADDRESS", "REDIS_USERNAME", "RAY_enable_autoscaler_v2", "RAY_AUTH_MODE", "REDIS_HOST", "LOG_LEVEL"]
)
ENV = st.lists(
    st.builds(lambda name, value: {"name": name, "value": value}, ENV_NAMES, st.sampled_from(["1", "true", "0", "x"])),
    max_size=3,
    unique_by=lambda entry: entry["name"],
)
CONTAINERS = st.one_of(
    st.none(), st.just([]), st.builds(lambda env: [{"name": "ray-head", "env": env}], ENV)
)  # a podTemplate's containers: none, an empty list, or the Ray container with env


@settings(max_examples=300, deadline=None)
@given(env=ENV, head=CONTAINERS, actor=CONTAINERS, elastic=st.booleans())
def test_a_job_the_door_admits_is_one_kuberay_accepts(env, head, actor, elastic):
    spec = base_spec() | {"env": env, "resources": {}}
    for pool, containers in (("head", head), ("actor", actor)):
        if containers is not None:
            named = [{**c, "name": "ray-worker"} for c in containers] if pool == "actor" else containers
            spec["resources"][pool] = {"podTemplate": {"spec": {"containers": named}}}
    if elastic:
        spec["resources"]["reward"] = {"replicas": 1, "minReplicas": 1, "maxReplicas": 3}
    try:
        job = parse_rljob(make_rljob(spec))
    except ManifestError:
        return
    rayjob = build_rayjob(job, OWNER, 0, default_image="i:1", generation=1)
    assert kuberay_refusal(rayjob) is None
