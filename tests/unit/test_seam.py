"""The seam between the operator and the runtime, crossed without a cluster, for every example.

For each manifest in examples/ the operator builds its RayJob and ConfigMap (operator/builders.py, with
the operator's default settings). Then, from those objects alone, the test reads what the runtime would
meet in its pods: the entrypoint, the spec at the path the entrypoint names in the mounted ConfigMap,
the container's environment, and what each pod offers Ray, computed by KubeRay's rules from
rayStartParams and the container's limits. On that it runs the runtime's own argument parsing
(runtime/main.py) and placement planning (runtime/loop/plan.py's plan_topology, workers/group.py's Ray
options), and checks that every actor the runtime would start fits on a pod of a group the operator
made, with enough units of its pool's resource, and that `--resume` changes what the runtime does. It also
holds every local path an example names against the volume mounts of the pods that read it
(operator/cluster_checks.py), and every example for a cluster to checkpoint storage all its pods share.

The last tests change the topology on one side only and show that the check catches it.
"""

import dataclasses
import json
import math
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api import RLJob, parse_rljob
from kuberl.api.contract import RUNTIME_PROGRAM, RuntimeArgs
from kuberl.api.spec import CheckpointSpec
from kuberl.api.topology import Topology
from kuberl.operator import access, builders
from kuberl.operator.cluster_checks import storage_problems, unreachable_paths
from kuberl.operator.settings import OperatorSettings
from kuberl.runtime import main as runtime_main
from kuberl.runtime.checkpoint.locations import checkpoint_uri, default_output_dir, export_location
from kuberl.runtime.checkpoint.policy import Start, start_from
from kuberl.runtime.loop import plan as runtime_plan
from kuberl.runtime.objectstore import is_remote
from kuberl.runtime.report.status_publisher import report_target
from kuberl.runtime.workers.group import ray_actor_options
from tests.conftest import REPO
from tests.unit.operator.conftest import KUBERAY
from tests.unit.operator.kuberay_autoscaler import token_holder

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"), key=lambda path: path.name)
#: The examples `kuberl run` runs on this machine (relative paths, checkpoints in the output folder); on a
#: cluster the webhook refuses them. tiny-grpo-cluster.yaml is the demo for a cluster.
LOCAL_ONLY = {"tiny-grpo.yaml", "tiny-grpo-async.yaml", "tiny-grpo-lora.yaml", "agent-python-tool.yaml"}
SETTINGS = OperatorSettings(kuberay=KUBERAY)
UID = "0b1c2d3e-0000-4000-8000-000000000001"


# -- what the operator makes ---------------------------------------------------------------------------
@dataclass
class Made:
    """The objects the operator would apply for one RLJob, as the API server would hold them."""

    rljob: dict[str, Any]
    configmap: dict[str, Any]
    rayjob: dict[str, Any]
    access: list[dict[str, Any]]  # the job's identity, its report ConfigMap, its Ray token, its NetworkPolicy


def operator_makes(example: Path, index: int = 0) -> Made:
    manifest = yaml.safe_load(example.read_text())
    manifest["metadata"] = {"namespace": "team-a", **manifest["metadata"], "uid": UID}  # as stored
    owner = builders.Owner.of(manifest)
    job = parse_rljob(manifest)
    configmap = builders.build_configmap(owner, manifest["spec"], generation=1)
    rayjob = builders.build_rayjob(
        job,
        owner,
        index,
        default_image=SETTINGS.runtime_image,
        generation=1,
        head_cpu=SETTINGS.head_cpu,
        head_memory=SETTINGS.head_memory,
    )
    made = access.build_access(owner, SETTINGS.kuberay, autoscaled=job.spec.resources.autoscaled)
    return Made(manifest, configmap, rayjob, made)


def head_spec(rayjob: dict[str, Any]) -> dict[str, Any]:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]


def worker_specs(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    return rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]


def cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def offered_by_one_pod(group: dict[str, Any]) -> dict[str, float]:
    """What one pod of a group offers Ray, by KubeRay's rules (ray-operator's generateRayStartCommand): a
    rayStartParams value wins; else num-cpus is the container's CPU limit rounded up (Quantity.Value()),
    num-gpus its `*gpu` limit; custom resources are rayStartParams.resources, a JSON object in a string."""
    params = group["rayStartParams"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpus = next((value for key, value in limits.items() if key.endswith("gpu")), 0)
    offered = {
        "CPU": float(params.get("num-cpus", math.ceil(cpu_cores(str(limits["cpu"]))))),
        "GPU": float(params.get("num-gpus", gpus)),
    }
    if "resources" in params:
        offered.update({name: float(units) for name, units in json.loads(json.loads(params["resources"])).items()})
    return offered


@dataclass
class Pod:
    group: str  # "head" or the worker group's name
    free: dict[str, float]


def pods(rayjob: dict[str, Any], *, at_most: bool) -> list[Pod]:
    """The head and every worker group's pods: at start (replicas), or as many as the autoscaler may add."""
    made = [Pod("head", offered_by_one_pod(head_spec(rayjob)))]
    for group in worker_specs(rayjob):
        count = group["maxReplicas"] if at_most else group["replicas"]
        made += [Pod(group["groupName"], offered_by_one_pod(group)) for _ in range(count)]
    return made


# -- what the runtime sees and does in those pods --------------------------------------------------------
@dataclass
class Seen:
    args: RuntimeArgs
    job: RLJob
    env: dict[str, str]
    topology: Topology


def runtime_sees(made: Made) -> Seen:
    """The runtime's view, read from the RayJob and ConfigMap alone, through the runtime's own code."""
    argv = shlex.split(made.rayjob["spec"]["entrypoint"])
    assert tuple(argv[: len(RUNTIME_PROGRAM)]) == RUNTIME_PROGRAM
    args = runtime_main.parse_runtime_args(argv[len(RUNTIME_PROGRAM) :])
    head = head_spec(made.rayjob)["template"]["spec"]
    container = head["containers"][0]
    folder, file = posixpath.split(args.spec)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == folder)
    volume = next(v for v in head["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == made.configmap["metadata"]["name"]
    job = parse_rljob(yaml.safe_load(made.configmap["data"][file]))
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    return Seen(args, job, env, runtime_plan.plan_topology(job.spec))


def unplaced(free_pods: list[Pod], seen: Seen, *, at_most: bool) -> list[str]:
    """Place every actor the runtime starts (first fit, in start order); what fits on no pod."""
    problems = []
    for group in seen.topology.groups:
        options = ray_actor_options(group)
        need = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]}
        for rank in range(group.max_actors if at_most else group.actors):
            pod = next((p for p in free_pods if all(p.free.get(k, 0.0) >= v - 1e-9 for k, v in need.items())), None)
            if pod is None:
                problems.append(f"{group.name} actor {rank} asks {need}: no pod offers it")
                continue
            for name, amount in need.items():
                pod.free[name] -= amount
    return problems


def seam_problems(example: Path) -> list[str]:
    made = operator_makes(example)
    seen = runtime_sees(made)
    return unplaced(pods(made.rayjob, at_most=False), seen, at_most=False) + unplaced(
        pods(made.rayjob, at_most=True), seen, at_most=True
    )


# -- the checks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_actor_the_runtime_starts_fits_on_a_group_the_operator_made(example: Path):
    assert seam_problems(example) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_each_pool_resource_is_offered_by_one_group_only(example: Path):
    rayjob = operator_makes(example).rayjob
    offering: dict[str, list[str]] = {}
    for pod in pods(rayjob, at_most=False):
        for name in pod.free:
            if name.startswith("kuberl_"):
                offering.setdefault(name, []).append(pod.group)
    assert {name: set(groups) for name, groups in offering.items()} == {
        name: {groups[0]} for name, groups in offering.items()
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_runtime_reads_its_job_and_identity_from_the_pod(example: Path):
    made = operator_makes(example)
    seen = runtime_sees(made)
    assert seen.job.spec == parse_rljob(made.rljob).spec
    meta = made.rljob["metadata"]
    made_configmaps = [o["metadata"]["name"] for o in made.access if o["kind"] == "ConfigMap"]
    assert report_target(seen.env) == (meta["name"], meta["namespace"], *made_configmaps)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_head_may_write_its_report_and_nothing_else_and_only_the_head_holds_a_token(example: Path):
    made = operator_makes(example)
    _, namespace, report = report_target(runtime_sees(made).env)
    head = head_spec(made.rayjob)["template"]
    secrets = {o["metadata"]["name"]: o for o in made.access if o["kind"] == "Secret"}
    account = token_holder(head, head["spec"]["containers"][0], secrets)  # the token the controller publishes with
    kinds = {o["kind"]: o for o in made.access if o["metadata"]["name"] == account}
    assert kinds["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert kinds["RoleBinding"]["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    only_rule = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [report], "verbs": ["patch"]}
    assert kinds["Role"]["rules"] == [only_rule]
    for group in worker_specs(made.rayjob):  # reward code runs there
        assert group["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_a_checkpoint_claim_is_mounted_where_the_runtime_saves_in_every_pod(example: Path):
    made = operator_makes(example)
    seen = runtime_sees(made)
    if seen.job.spec.checkpoint.pvc_claim_name is None:
        pytest.skip("no claim: an object store (or, for local runs, the output folder) holds the checkpoints")
    output = str(default_output_dir(seen.job))  # the exported model and metrics.jsonl outlive the pod there
    root = checkpoint_uri(seen.job, Path(output))
    cluster = made.rayjob["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        claims = {v["name"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
        mounted = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] in claims]
        for folder in (root, output):
            assert any(folder.startswith(path + "/") for path in mounted), (group, folder)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_exported_model_goes_where_it_outlives_the_actors_pods(example: Path):
    made = operator_makes(example)
    seen = runtime_sees(made)
    output = Path(seen.args.output) if seen.args.output else default_output_dir(seen.job)
    model = export_location(seen.job, output)  # actor rank 0 writes it, in a pod KubeRay deletes afterwards
    if is_remote(model):
        return
    if seen.job.spec.checkpoint.pvc_claim_name is None:  # the model would stay on rank 0's disk: refused
        assert example.name in LOCAL_ONLY
        assert [problem.path for problem in storage_problems(seen.job)] == ["spec.checkpoint"]
        return
    (actor,) = [group for group in worker_specs(made.rayjob) if group["groupName"] == "actor"]
    spec = actor["template"]["spec"]
    claims = {v["name"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    mounted = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] in claims]
    assert any(model.startswith(path + "/") for path in mounted), (example.name, model, mounted)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_path_a_cluster_example_names_is_on_every_pod_that_reads_it(example: Path):
    made = operator_makes(example)
    job = runtime_sees(made).job
    if example.name in LOCAL_ONLY:  # kuberl run's: the webhook refuses it, as its checkpoints have no shared home
        assert [problem.path for problem in storage_problems(job)] == ["spec.checkpoint"]
        return
    assert storage_problems(job) == []
    assert unreachable_paths(job, made.rayjob) == []


def test_a_pod_template_without_the_models_volume_is_caught():
    made = operator_makes(REPO / "examples" / "ppo-critic.yaml")
    (critic,) = [group for group in worker_specs(made.rayjob) if group["groupName"] == "critic"]
    critic["template"]["spec"]["containers"][0]["volumeMounts"] = [
        mount for mount in critic["template"]["spec"]["containers"][0]["volumeMounts"] if mount["name"] != "models"
    ]
    problems = unreachable_paths(parse_rljob(made.rljob), made.rayjob)
    # the critic loads its backbone, and the actor's tokenizer (that model's folder too)
    assert [problem.path for problem in problems] == ["spec.models.actor.path", "spec.models.critic.path"]
    for problem in problems:
        assert problem.message.startswith("/models/Qwen2.5-1.5B-Instruct is read on the critic pods")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_resume_marks_every_rayjob_after_the_first_and_changes_where_the_runtime_starts(example: Path):
    first, restart = (runtime_sees(operator_makes(example, index)) for index in (0, 1))
    assert (first.args.resume, restart.args.resume) == (False, True)
    # with saved checkpoints and checkpoint.resume: false, only the restart may carry on from them
    fresh_only = CheckpointSpec(resume=False)
    assert start_from(True, fresh_only, first.args.resume) == Start.REFUSE
    assert start_from(True, fresh_only, restart.args.resume) == Start.RESUME


# -- the check catches one-sided changes -----------------------------------------------------------------
def operator_offers_a_unit_less_per_actor_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = builders.plan_topology

    def fewer_units(spec: Any) -> Topology:
        topology = planned(spec)
        pools = [
            dataclasses.replace(pool, units=pool.units - 1) if pool.name == "actor" else pool for pool in topology.pools
        ]
        return dataclasses.replace(topology, pools=tuple(pools))

    monkeypatch.setattr(builders, "plan_topology", fewer_units)


def runtime_starts_one_more_actor_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = runtime_plan.plan_topology

    def one_more_rank(spec: Any) -> Topology:
        topology = planned(spec)
        more = [
            dataclasses.replace(group, actors=group.actors + 1, max_actors=group.max_actors + 1)
            if group.name == "actor"
            else group
            for group in topology.groups
        ]
        return dataclasses.replace(topology, groups=tuple(more))

    monkeypatch.setattr(runtime_plan, "plan_topology", one_more_rank)


@pytest.mark.parametrize("change", [operator_offers_a_unit_less_per_actor_pod, runtime_starts_one_more_actor_rank])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_a_topology_changed_on_one_side_only_is_caught(example: Path, change: Any, monkeypatch: pytest.MonkeyPatch):
    change(monkeypatch)
    problems = seam_problems(example)
    assert problems and all(problem.startswith("actor actor") for problem in problems), problems
