"""The RayJob and ConfigMap builders: pure functions of the parsed RLJob, checked field by field."""

import json
import shlex
from typing import Any

import pytest
import yaml

from kuberl.api import contract, parse_rljob
from kuberl.operator import names
from kuberl.operator.builders import (
    Owner,
    build_configmap,
    build_rayjob,
    configmap_spec,
    entrypoint,
    runtime_args,
)
from tests.conftest import REPO
from tests.unit.operator.conftest import UID, base_spec, make_rljob

OWNER = Owner(name="tiny-grpo", namespace="team-a", uid=UID)


def rayjob_for(spec_change: dict[str, Any] | None = None, index: int = 0, image: str = "default/image:1") -> dict:
    spec = base_spec()
    spec.update(spec_change or {})
    job = parse_rljob(make_rljob(spec))
    return build_rayjob(job, OWNER, index, default_image=image, generation=3)


def groups(rayjob: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}


def all_pod_specs(rayjob: dict) -> list[dict]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in groups(rayjob).values()]


def container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]


def test_the_rayjob_is_named_by_job_and_index():
    assert rayjob_for(index=2)["metadata"]["name"] == "tiny-grpo-2"


def test_a_job_without_extra_pools_has_one_worker_group_for_the_actor():
    assert list(groups(rayjob_for())) == ["actor"]


def test_each_role_with_a_pool_gets_its_own_worker_group_actor_first():
    spec = {
        "models": {"actor": {"path": "hf://org/actor"}, "critic": {}},
        "algorithm": {"name": "ppo"},
        "rollout": {"placement": "separate"},
        "resources": {
            "actor": {"replicas": 2, "gpus": 8},
            "critic": {"replicas": 1, "gpus": 4},
            "reference": {"replicas": 1, "gpus": 2},
            "reward": {"replicas": 2, "cpus": 4},
            "rollout": {"replicas": 3, "gpus": 1},
        },
    }
    assert list(groups(rayjob_for(spec))) == ["actor", "critic", "reference", "reward", "rollout"]


def test_gpus_become_nvidia_gpu_limits_and_requests():
    actor = groups(rayjob_for({"resources": {"actor": {"gpus": 8, "cpus": 32, "memory": "256Gi"}}}))["actor"]
    resources = container(actor)["resources"]
    assert resources["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 8}
    assert resources["requests"] == resources["limits"]


def test_a_tensor_parallel_rollout_replica_gets_a_pod_with_a_gpu_per_shard_and_room_for_one_engine():
    spec = {
        "rollout": {"placement": "separate", "tensorParallelSize": 2},
        "resources": {"actor": {"gpus": 8}, "rollout": {"replicas": 3, "gpus": 2, "cpus": 16}},
    }
    rollout = groups(rayjob_for(spec))["rollout"]
    assert container(rollout)["resources"]["limits"] == {"cpu": "16", "nvidia.com/gpu": 2}
    assert rollout["replicas"] == 3
    # one engine per pod: the pod offers one unit of the rollout resource, and the engine's actor asks for it
    assert json.loads(json.loads(rollout["rayStartParams"]["resources"])) == {"kuberl_rollout": 1}


def test_the_7b_example_gets_rollout_pods_of_two_gpus_each_for_its_two_way_split_engines():
    job = parse_rljob(yaml.safe_load((REPO / "examples" / "grpo-7b-vllm.yaml").read_text()))
    assert job.spec.rollout.tensor_parallel_size == 2
    built = groups(build_rayjob(job, OWNER, 0, default_image="default/image:1", generation=1))
    assert list(built) == ["actor", "rollout"]
    rollout = built["rollout"]
    assert rollout["replicas"] == 4 and container(rollout)["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_a_tensor_parallel_rollout_on_cpu_gets_a_core_per_shard():
    spec = {
        "rollout": {"placement": "separate", "tensorParallelSize": 2},
        "resources": {"rollout": {"replicas": 1, "cpus": 2}},
    }
    assert container(groups(rayjob_for(spec))["rollout"])["resources"]["limits"] == {"cpu": "2"}


def test_a_cpu_only_role_asks_for_no_gpu():
    actor = groups(rayjob_for({"resources": {"actor": {"cpus": 0.5}}}))["actor"]
    assert container(actor)["resources"]["limits"] == {"cpu": "500m"}


def test_node_selector_and_tolerations_reach_the_role_pods_only():
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec = {
        "rollout": {"placement": "separate"},
        "resources": {
            "actor": {"nodeSelector": {"gpu": "h100"}, "tolerations": tolerations},
            "rollout": {"replicas": 1},
        },
    }
    built = groups(rayjob_for(spec))
    assert built["actor"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert built["actor"]["template"]["spec"]["tolerations"] == tolerations
    assert "nodeSelector" not in built["rollout"]["template"]["spec"]
    assert "tolerations" not in built["rollout"]["template"]["spec"]


def test_a_fixed_pool_has_min_and_max_equal_to_replicas_and_no_autoscaler():
    rayjob = rayjob_for({"resources": {"actor": {"replicas": 3}}})
    actor = groups(rayjob)["actor"]
    assert (actor["replicas"], actor["minReplicas"], actor["maxReplicas"]) == (3, 3, 3)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False


def test_an_elastic_reward_pool_gets_its_bounds_and_turns_on_in_tree_autoscaling():
    rayjob = rayjob_for({"resources": {"reward": {"replicas": 2, "minReplicas": 1, "maxReplicas": 16}}})
    reward = groups(rayjob)["reward"]
    assert (reward["replicas"], reward["minReplicas"], reward["maxReplicas"]) == (2, 1, 16)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True


def test_each_worker_group_offers_its_own_ray_resource_one_unit_per_actor_in_kuberays_quoted_json():
    built = groups(rayjob_for({"resources": {"actor": {"gpus": 8}, "reward": {"replicas": 1}}}))
    # KubeRay wants the JSON object inside a quoted string: YAML '"{\"kuberl_actor\": 8}"'.
    assert built["actor"]["rayStartParams"]["resources"] == '"{\\"kuberl_actor\\": 8}"'  # a trainer rank per GPU
    assert json.loads(json.loads(built["reward"]["rayStartParams"]["resources"])) == {"kuberl_reward": 1}


def head_resources(rayjob: dict) -> dict:
    params = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    return json.loads(json.loads(params["resources"])) if "resources" in params else {}


def test_the_head_offers_a_place_to_the_reward_worker_only_when_the_reward_has_no_pool():
    assert head_resources(rayjob_for()) == {"kuberl_head": 1}
    assert head_resources(rayjob_for({"resources": {"reward": {"replicas": 1}}})) == {}


def test_the_entrypoint_runs_the_runtime_on_the_mounted_spec():
    assert shlex.split(rayjob_for()["spec"]["entrypoint"]) == [
        "python",
        "-m",
        "kuberl.runtime",
        "--spec",
        "/etc/kuberl/rljob.yaml",
        "--rayjob",
        "tiny-grpo-0",
    ]


def test_a_rayjob_after_the_first_resumes_from_the_checkpoint():
    rayjob = rayjob_for(index=1)
    assert "--resume" in shlex.split(rayjob["spec"]["entrypoint"])
    assert rayjob["metadata"]["labels"][names.RESTART_LABEL] == "1"
    assert rayjob["metadata"]["annotations"][names.RESTART_LABEL] == "1"


def test_the_entrypoint_is_the_shell_quoted_argument_list():
    for resume in (False, True):
        assert shlex.split(entrypoint(resume, "tiny-grpo-3")) == runtime_args(resume, "tiny-grpo-3")


def test_the_runtime_is_told_which_rayjob_it_is():
    argv = shlex.split(rayjob_for(index=2)["spec"]["entrypoint"])
    assert argv[argv.index("--rayjob") + 1] == "tiny-grpo-2"


@pytest.mark.parametrize("hostile", ["$(rm -rf /)", "a b", "it's", '"; echo pwned', "`id`", "x\ny"])
def test_env_values_reach_the_pods_as_env_entries_and_never_the_entrypoint(hostile: str):
    rayjob = rayjob_for({"env": [{"name": "GREETING", "value": hostile}]})
    assert hostile not in rayjob["spec"]["entrypoint"]
    for spec in all_pod_specs(rayjob):
        assert {"name": "GREETING", "value": hostile} in spec["containers"][0]["env"]


def test_shutdown_after_the_job_finishes():
    assert rayjob_for()["spec"]["shutdownAfterJobFinishes"] is True


def test_the_checkpoint_claim_is_mounted_at_checkpoints_in_every_pod():
    rayjob = rayjob_for({"checkpoint": {"pvcClaimName": "ckpt"}, "resources": {"reward": {"replicas": 1}}})
    for spec in all_pod_specs(rayjob):
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert volumes[mounts["/checkpoints"]]["persistentVolumeClaim"] == {"claimName": "ckpt"}


def test_without_a_claim_no_checkpoint_volume_is_mounted():
    for spec in all_pod_specs(rayjob_for()):
        assert all(m["mountPath"] != "/checkpoints" for m in spec["containers"][0]["volumeMounts"])


def test_the_spec_configmap_is_mounted_in_every_pod():
    for spec in all_pod_specs(rayjob_for()):
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        assert volumes[mounts["/etc/kuberl"]]["configMap"] == {"name": "tiny-grpo-spec"}


def test_secret_refs_become_env_from_in_every_pod():
    rayjob = rayjob_for({"secretRefs": ["hf-token", "wandb"], "checkpoint": {"secretRef": "s3-creds"}})
    for spec in all_pod_specs(rayjob):
        assert spec["containers"][0]["envFrom"] == [
            {"secretRef": {"name": "hf-token"}},
            {"secretRef": {"name": "wandb"}},
            {"secretRef": {"name": "s3-creds"}},
        ]


def test_the_image_defaults_to_the_operators_setting():
    for spec in all_pod_specs(rayjob_for(image="ghcr.io/kuberl/runtime:0.1.0")):
        assert spec["containers"][0]["image"] == "ghcr.io/kuberl/runtime:0.1.0"


def test_spec_image_overrides_the_default():
    for spec in all_pod_specs(rayjob_for({"image": "my.registry/rl:7"})):
        assert spec["containers"][0]["image"] == "my.registry/rl:7"


def test_a_pod_template_override_merges_containers_by_name_and_adds_the_rest():
    override = {
        "metadata": {"annotations": {"team": "rl"}},
        "spec": {
            "priorityClassName": "high",
            "containers": [
                {"name": "ray-worker", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
                {"name": "sidecar", "image": "busybox"},
            ],
        },
    }
    actor = groups(rayjob_for({"resources": {"actor": {"podTemplate": override}}}))["actor"]
    template = actor["template"]
    assert template["metadata"]["annotations"] == {"team": "rl", contract.KUBERAY_OWN_COMMAND_ANNOTATION: "true"}
    assert template["metadata"]["labels"][names.JOB_LABEL] == "tiny-grpo"
    assert template["spec"]["priorityClassName"] == "high"
    assert [c["name"] for c in template["spec"]["containers"]] == ["ray-worker", "sidecar"]
    worker = template["spec"]["containers"][0]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in worker["env"]
    assert {"name": "KUBERL_ROLE", "value": "actor"} in worker["env"]
    assert worker["image"] == "default/image:1"


def test_worker_pods_run_ray_start_under_podinit_and_the_head_runs_kuberays_own():
    rayjob = rayjob_for({"resources": {"actor": {"replicas": 2}}})
    for name, group in groups(rayjob).items():
        template = group["template"]
        (container, *_) = template["spec"]["containers"]
        assert (container["command"], container["args"]) == (
            list(contract.WORKER_POD_COMMAND),
            list(contract.WORKER_POD_ARGS),
        ), name
        # KubeRay keeps a container's own command only under its annotation, and then hands `ray start` over in env
        assert template["metadata"]["annotations"][contract.KUBERAY_OWN_COMMAND_ANNOTATION] == "true", name
    assert "python -m kuberl.runtime.podinit" in contract.WORKER_POD_ARGS[0]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert "command" not in head["spec"]["containers"][0]
    assert contract.KUBERAY_OWN_COMMAND_ANNOTATION not in (head["metadata"].get("annotations") or {})


def test_a_pod_template_giving_the_ray_container_a_command_keeps_kuberays_handling_of_it():
    setup = {"spec": {"containers": [{"name": "ray-worker", "command": ["bash", "-c"], "args": ["nvidia-smi"]}]}}
    actor = groups(rayjob_for({"resources": {"actor": {"podTemplate": setup}}}))["actor"]
    (container,) = actor["template"]["spec"]["containers"]
    assert (container["command"], container["args"]) == (["bash", "-c"], ["nvidia-smi"])
    assert contract.KUBERAY_OWN_COMMAND_ANNOTATION not in (actor["template"]["metadata"].get("annotations") or {})


def test_the_head_takes_its_own_volume_node_and_tolerations_and_keeps_what_kuberl_needs():
    models = {"name": "models", "persistentVolumeClaim": {"claimName": "team-models", "readOnly": True}}
    head_resources = {
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
        "podTemplate": {
            "spec": {
                "volumes": [models],
                "containers": [{"name": "ray-head", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
            }
        },
    }
    rayjob = rayjob_for({"resources": {"head": head_resources}})
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"pool": "cpu"}
    assert head["tolerations"][0]["key"] == "dedicated"
    assert models in head["volumes"]
    (container,) = head["containers"]
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/models", contract.SPEC_MOUNT_DIR} <= mounts  # the user's volume beside the spec
    assert head["automountServiceAccountToken"] is True  # kuberl's own settings survive the merge
    for group in groups(rayjob).values():  # the head's additions stay on the head
        assert "nodeSelector" not in group["template"]["spec"]


def test_children_are_owned_by_the_rljob_and_labelled_with_its_name():
    rayjob = rayjob_for()
    configmap = build_configmap(OWNER, base_spec(), generation=3)
    for child in (rayjob, configmap):
        assert child["metadata"]["labels"][names.JOB_LABEL] == "tiny-grpo"
        (reference,) = child["metadata"]["ownerReferences"]
        assert reference == {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "name": "tiny-grpo",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_the_configmap_holds_an_rljob_manifest_the_runtime_can_parse():
    configmap = build_configmap(OWNER, base_spec(), generation=3)
    assert configmap["metadata"]["name"] == "tiny-grpo-spec"
    manifest = yaml.safe_load(configmap["data"]["rljob.yaml"])
    assert parse_rljob(manifest).metadata.name == "tiny-grpo"
    assert configmap_spec(configmap) == base_spec()


def test_configmap_spec_of_nothing_or_garbage_is_none():
    assert configmap_spec(None) is None
    assert configmap_spec({"data": {"rljob.yaml": ": : not yaml ["}}) is None
    assert configmap_spec({"data": {}}) is None


def test_every_ray_pod_runs_as_the_jobs_own_account_unless_a_pool_names_another():
    spec = base_spec()
    spec["resources"] = {"actor": {"podTemplate": {"spec": {"serviceAccountName": "team-trainer"}}}}
    job = parse_rljob(make_rljob(spec))
    rayjob = build_rayjob(job, OWNER, 0, default_image="i:1", generation=1)
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "tiny-grpo-runtime"
    assert groups(rayjob)["actor"]["template"]["spec"]["serviceAccountName"] == "team-trainer"


def test_the_head_serves_the_runtime_metrics_on_a_named_port_and_only_the_head():
    rayjob = rayjob_for()
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"containerPort": 9464, "name": "kuberl-metrics"} in head["ports"]
    assert {"name": contract.METRICS_PORT_ENV, "value": "9464"} in head["env"]
    for group in groups(rayjob).values():
        (worker,) = group["template"]["spec"]["containers"]
        assert contract.METRICS_PORT_ENV not in {entry["name"] for entry in worker["env"]}


def test_every_pod_knows_the_uid_of_its_rljob_which_tells_a_job_created_again_under_its_name_apart():
    rayjob = rayjob_for({"resources": {"reward": {"replicas": 1}}})
    cluster = rayjob["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *groups(rayjob).values()]:
        assert {"name": contract.JOB_UID_ENV, "value": UID} in container(group)["env"]


def test_the_pods_that_run_tool_calls_get_memory_and_ephemeral_storage_limits():
    environment = {"name": "python", "maxEpisodeTokens": 256, "toolMemoryMib": 256}
    rayjob = rayjob_for({"environment": environment, "resources": {"reward": {"replicas": 1, "cpus": 4}}})
    reward = container(groups(rayjob)["reward"])["resources"]
    # 2 calls at once (2 of the pod's 4 CPUs are the environment worker's), 256 + 64 MiB each, 2048 MiB besides
    assert reward["limits"] == reward["requests"] == {"cpu": "4", "memory": "2688Mi", "ephemeral-storage": "8Gi"}
    assert "ephemeral-storage" not in container(groups(rayjob)["actor"])["resources"]["limits"]
    head = container(rayjob["spec"]["rayClusterSpec"]["headGroupSpec"])["resources"]["limits"]
    assert "ephemeral-storage" not in head  # the tools run on the reward pool's pods
    on_head = rayjob_for({"environment": environment})
    assert container(on_head["spec"]["rayClusterSpec"]["headGroupSpec"])["resources"]["limits"][
        "ephemeral-storage"
    ] == ("8Gi")


def test_the_stop_grace_period_reaches_rays_job_supervisor_and_every_pod():
    rayjob = rayjob_for({"runPolicy": {"stopGracePeriodSeconds": 600}, "resources": {"reward": {"replicas": 1}}})
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime_env == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "600"}}
    assert [pod["terminationGracePeriodSeconds"] for pod in all_pod_specs(rayjob)] == [615, 615, 615]
    # a stopped pod's `ray start` keeps its processes, drained, for as long (runtime/checkpoint/preemption.py)
    for pod in all_pod_specs(rayjob):
        assert {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "600"} in pod["containers"][0]["env"]


def test_a_pod_templates_longer_grace_period_is_kept():
    placement = {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 900}}}
    rayjob = rayjob_for({"resources": {"actor": placement}})
    assert groups(rayjob)["actor"]["template"]["spec"]["terminationGracePeriodSeconds"] == 900
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 135
