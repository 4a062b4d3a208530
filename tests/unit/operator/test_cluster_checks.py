"""What a cluster needs that a local run does not: shared checkpoint storage, every path on the pods reading it."""

from typing import Any

import pytest

from kuberl.api import Problem, parse_rljob
from kuberl.operator.cluster_checks import review_for_cluster, storage_problems
from tests.unit.operator.conftest import base_spec, make_rljob

CLAIM = {"pvcClaimName": "ckpt"}
#: The models claim mounted at /models in a pod's Ray container, as a podTemplate adds it.
MODELS = {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}


def models_template(container: str, mount: str = "/models") -> dict[str, Any]:
    return {
        "spec": {
            "containers": [{"name": container, "volumeMounts": [{"name": "models", "mountPath": mount}]}],
            "volumes": [MODELS],
        }
    }


def spec(**changes: Any) -> dict[str, Any]:
    made = base_spec()  # hf:// actor, /data/train.jsonl
    made["checkpoint"] = dict(CLAIM)
    made.update(changes)
    return made


def review(**changes: Any):
    return review_for_cluster(parse_rljob(make_rljob(spec(**changes))))


def unreachable(**changes: Any) -> dict[str, str]:
    return {problem.path: problem.message for problem in review(**changes).unreachable}


# -- checkpoints -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "checkpoint",
    [CLAIM, {"uri": "s3://bucket/jobs/a"}, {"uri": "gs://bucket/jobs/a"}, {**CLAIM, "uri": "/checkpoints/team/a"}],
)
def test_a_claim_or_an_object_store_is_storage_every_pod_shares(checkpoint: dict[str, Any]):
    assert storage_problems(parse_rljob(make_rljob(spec(checkpoint=checkpoint)))) == []


@pytest.mark.parametrize("checkpoint", [{}, {"uri": "/ckpts/a"}, {"uri": "file:///ckpts/a"}, {"intervalSteps": 5}])
def test_without_a_claim_or_an_object_store_the_job_is_refused_naming_spec_checkpoint(checkpoint: dict[str, Any]):
    (problem,) = review(checkpoint=checkpoint).refusals
    assert problem.path == "spec.checkpoint"
    assert "set pvcClaimName" in problem.message and "s3://" in problem.message


def test_a_local_checkpoint_uri_outside_the_claims_mount_is_refused():
    (problem,) = review(checkpoint={**CLAIM, "uri": "/data/ckpts"}).refusals
    assert problem == Problem(
        "spec.checkpoint.uri",
        "/data/ckpts is outside /checkpoints, where every pod mounts pvcClaimName, so each pod would write its own "
        "disk; give a path under /checkpoints/, or a relative path (inside the job's folder on the claim), or "
        "remove uri",
    )
    assert review(checkpoint={**CLAIM, "uri": "ckpts"}).refusals == []  # relative: in the job's folder on the claim


# -- paths -----------------------------------------------------------------------------------------------
def test_a_model_path_no_pod_mounts_names_the_field_the_path_and_the_pods():
    problems = unreachable(models={"actor": {"path": "/models/qwen"}})
    message = problems["spec.models.actor.path"]
    assert message.startswith("/models/qwen is read on the head, actor pods, which mount no volume holding it")
    assert "spec.resources.head.podTemplate, spec.resources.actor.podTemplate" in message


def test_mounting_the_volume_in_every_pod_that_reads_the_path_satisfies_the_check():
    problems = unreachable(
        models={"actor": {"path": "/models/qwen"}},
        data={"train": "/models/prompts.jsonl"},
        resources={
            "head": {"podTemplate": models_template("ray-head")},
            "actor": {"podTemplate": models_template("ray-worker")},
        },
    )
    assert problems == {}


def test_a_pod_that_reads_the_path_without_the_mount_is_still_named():
    problems = unreachable(
        models={"actor": {"path": "/models/qwen"}},
        resources={"actor": {"podTemplate": models_template("ray-worker")}},
    )
    assert problems["spec.models.actor.path"].startswith("/models/qwen is read on the head pods")


def test_a_mount_counts_only_for_what_lies_under_it_and_only_in_the_ray_container():
    sidecar = {
        "spec": {
            "containers": [{"name": "sidecar", "image": "busybox", "volumeMounts": [{"name": "m", "mountPath": "/m"}]}],
            "volumes": [{"name": "m", "emptyDir": {}}],
        }
    }
    assert set(unreachable(data={"train": "/m/prompts.jsonl"}, resources={"head": {"podTemplate": sidecar}})) == {
        "spec.data.train"  # KubeRay runs Ray in the first container; a sidecar's volumes are not the driver's
    }
    prefix_only = unreachable(
        data={"train": "/models2/prompts.jsonl"}, resources={"head": {"podTemplate": models_template("ray-head")}}
    )
    assert set(prefix_only) == {"spec.data.train"}  # /models2 is not under /models


def test_the_checkpoint_claim_holds_paths_too_and_the_images_own_files_need_no_volume():
    problems = unreachable(
        models={"actor": {"path": "/checkpoints/team-a/earlier-job/model"}},
        data={"train": "/opt/kuberl/examples/data/tiny-task.jsonl"},
    )
    assert problems == {}


def test_a_relative_path_is_refused_on_a_cluster_the_spec_mount_holds_the_manifest_alone():
    message = unreachable(data={"train": "data/tiny-task.jsonl"})["spec.data.train"]
    assert message.startswith("data/tiny-task.jsonl is relative")
    assert "/etc/kuberl" in message


def test_a_reward_pool_reading_a_reward_file_needs_the_volume_too():
    problems = unreachable(
        reward={"function": "/models/rewards/grade.py:score"},
        resources={"head": {"podTemplate": models_template("ray-head")}, "reward": {"replicas": 2}},
    )
    assert problems["spec.reward.function"].startswith("/models/rewards/grade.py is read on the reward pods")
