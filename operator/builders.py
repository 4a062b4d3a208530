"""Pure builders of the objects the operator owns: the spec ConfigMap and the KubeRay RayJob.

Every builder is a function of the parsed RLJob and a few plain values (owner identity, index,
image); no clock, no API calls. The RayJob's Ray cluster has a head group (it runs the
controller: the driver started by the entrypoint) and one worker group per role in
`spec.resources` (the actor always; critic, reference, reward and rollout when given). Each
worker group's `rayStartParams.resources` declares a custom Ray resource only that group offers
(`kuberl_<role>`, RAY_RESOURCE_UNITS units per pod) so the runtime pins a role's actors to its
group with `.options(resources={"kuberl_<role>": 1})`. Elastic roles (minReplicas < maxReplicas)
turn on KubeRay's in-tree autoscaler; the RayJob is never re-applied once created, so replica
counts the autoscaler moves are never fought over.

Every pod passes Pod Security `restricted` (pods.py), runs as the job's own ServiceAccount
(access.py), and only the head pod, where the controller publishes its report, mounts its token.
Ray's token authentication is on (`authOptions`), and KubeRay submits over HTTP (no submitter pod).

The entrypoint is an argument list joined with shlex.join: KubeRay hands it to the head's Ray Jobs API,
and no user string is ever pasted into it.
"""

import copy
import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from kuberl.api import KIND, RLJob
from kuberl.api.enums import Role
from kuberl.api.resources import RoleResources
from kuberl.operator import names
from kuberl.operator.pods import CONTAINER_SECURITY_CONTEXT, POD_SECURITY_CONTEXT, container_resources, merge

#: Units of its group's custom Ray resource each worker pod offers (actors ask for 1, or a fraction).
RAY_RESOURCE_UNITS = 1000
#: Ports of the Ray head (KubeRay's defaults, spelled out).
HEAD_PORTS = (
    {"containerPort": 6379, "name": "gcs"},
    {"containerPort": 8265, "name": "dashboard"},
    {
        "containerPort": 10001,
        "name": "client",
    },
)
#: The Ray version the runtime image carries (KubeRay needs it with authOptions; 2.52+ has token auth).
DEFAULT_RAY_VERSION = "2.60.0"
#: The role name of the head pod, which runs the controller.
HEAD_ROLE = "head"
SPEC_VOLUME = "kuberl-spec"
CHECKPOINT_VOLUME = "kuberl-checkpoints"


@dataclass(frozen=True)
class Owner:
    """The RLJob that owns a child: enough to write its owner reference."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, rljob: dict[str, Any]) -> "Owner":
        meta = rljob["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def owner_reference(owner: Owner) -> dict[str, Any]:
    """A controller reference: deleting the RLJob garbage-collects the child."""
    return {
        "apiVersion": names.RLJOB_API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(
    owner: Owner, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {names.JOB_LABEL: owner.name, **(labels or {})},
        "annotations": dict(annotations or {}),
        "ownerReferences": [owner_reference(owner)],
    }


def spec_manifest(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The RLJob manifest the runtime reads (`kuberl.runtime --spec`): the user's spec as written."""
    return {
        "apiVersion": names.RLJOB_API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def build_configmap(owner: Owner, spec: dict[str, Any], generation: int) -> dict[str, Any]:
    """`<rljob>-spec`: the spec the current RayJob runs, mounted at SPEC_PATH in every pod."""
    text = yaml.safe_dump(spec_manifest(owner.name, owner.namespace, spec), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(
            owner, names.configmap_name(owner.name), annotations={names.GENERATION_ANNOTATION: str(generation)}
        ),
        "data": {names.SPEC_KEY: text},
    }


def configmap_spec(configmap: dict[str, Any] | None) -> dict[str, Any] | None:
    """The spec a ConfigMap built by `build_configmap` holds; None when absent or unreadable."""
    if configmap is None:
        return None
    try:
        manifest = yaml.safe_load(configmap.get("data", {}).get(names.SPEC_KEY, ""))
    except yaml.YAMLError:
        return None
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    return spec if isinstance(spec, dict) else None


def runtime_args(resume: bool) -> list[str]:
    """The runtime's command line; `--resume` makes it start from the latest committed checkpoint."""
    return ["python", "-m", "kuberl.runtime", "--spec", names.SPEC_PATH, *(["--resume"] if resume else [])]


def entrypoint(resume: bool) -> str:
    return shlex.join(runtime_args(resume))


def role_pools(job: RLJob) -> list[tuple[Role, RoleResources]]:
    """The roles with a pool of their own, actor first; the others share the actor's pool."""
    pools = [(role, getattr(job.spec.resources, role.value)) for role in Role]
    return [(role, pool) for role, pool in pools if pool is not None]


def ray_start_resources(role: Role) -> str:
    """KubeRay's format for custom resources: a JSON object inside a quoted string, `"{\\"kuberl_actor\\": 1000}"`."""
    return json.dumps(json.dumps({names.ray_resource_name(role.value): RAY_RESOURCE_UNITS}))


def pod_env(job: RLJob, role: str) -> list[dict[str, Any]]:
    """Values go into env entries (never into a command line); the user's come after kuberl's own."""
    own: list[dict[str, Any]] = [
        {"name": "KUBERL_JOB_NAME", "value": job.metadata.name},
        {"name": "KUBERL_JOB_NAMESPACE", "value": job.metadata.namespace or ""},
        {"name": "KUBERL_ROLE", "value": role},
    ]
    if role == HEAD_ROLE:  # where the controller publishes its progress (access.py)
        own.append({"name": "KUBERL_STATUS_CONFIGMAP", "value": names.progress_configmap_name(job.metadata.name)})
    endpoint = job.spec.reward.endpoint
    if endpoint is not None and endpoint.secret_ref is not None:
        own.append(
            {
                "name": "KUBERL_REWARD_ENDPOINT_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": endpoint.secret_ref, "key": "token"}},
            }
        )
    return own + [{"name": var.name, "value": var.value} for var in job.spec.env]


def pod_env_from(job: RLJob) -> list[dict[str, Any]]:
    refs = list(job.spec.secret_refs)
    if job.spec.checkpoint.secret_ref is not None and job.spec.checkpoint.secret_ref not in refs:
        refs.append(job.spec.checkpoint.secret_ref)
    return [{"secretRef": {"name": ref}} for ref in refs]


def pod_volumes(job: RLJob, configmap: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): the spec ConfigMap in every pod, and the checkpoint claim when given."""
    volumes: list[dict[str, Any]] = [{"name": SPEC_VOLUME, "configMap": {"name": configmap}}]
    mounts: list[dict[str, Any]] = [{"name": SPEC_VOLUME, "mountPath": names.SPEC_MOUNT_DIR, "readOnly": True}]
    claim = job.spec.checkpoint.pvc_claim_name
    if claim is not None:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": names.CHECKPOINT_MOUNT_DIR})
    return volumes, mounts


def pod_template(
    job: RLJob,
    *,
    role: str,
    container: str,
    image: str,
    resources: dict[str, Any],
    pool: RoleResources | None,
) -> dict[str, Any]:
    """A role's pod: Pod Security `restricted`, the job's own ServiceAccount, its token only in the head pod."""
    volumes, mounts = pod_volumes(job, names.configmap_name(job.metadata.name))
    main: dict[str, Any] = {
        "name": container,
        "image": image,
        "env": pod_env(job, role),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    env_from = pod_env_from(job)
    if env_from:
        main["envFrom"] = env_from
    if container == "ray-head":
        main["ports"] = [dict(port) for port in HEAD_PORTS]
    spec: dict[str, Any] = {
        "containers": [main],
        "volumes": volumes,
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        # the controller on the head publishes the job's report with this account's token (and KubeRay's
        # autoscaler, a container of the head pod, uses it); worker pods, which run reward code, get no token
        "serviceAccountName": names.runtime_account_name(job.metadata.name),
        "automountServiceAccountToken": role == HEAD_ROLE,
    }
    if pool is not None and pool.node_selector:
        spec["nodeSelector"] = dict(pool.node_selector)
    if pool is not None and pool.tolerations:
        spec["tolerations"] = [toleration.to_manifest() for toleration in pool.tolerations]
    template = {"metadata": {"labels": {names.JOB_LABEL: job.metadata.name, "kuberl.io/role": role}}, "spec": spec}
    if pool is not None and pool.pod_template:
        template = merge(template, pool.pod_template)
    return template


def worker_group(job: RLJob, role: Role, pool: RoleResources, image: str) -> dict[str, Any]:
    """One Ray worker group for a role: replicas, the autoscaler's bounds, and its pods."""
    low, high = (pool.effective_min, pool.effective_max) if pool.is_elastic else (pool.replicas, pool.replicas)
    return {
        "groupName": role.value,
        "replicas": pool.replicas,
        "minReplicas": low,
        "maxReplicas": high,
        "rayStartParams": {"resources": ray_start_resources(role)},
        "template": pod_template(
            job,
            role=role.value,
            container="ray-worker",
            image=image,
            resources=container_resources(pool),
            pool=pool,
        ),
    }


def head_group(job: RLJob, image: str, cpu: str, memory: str) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory}
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0"},
        "template": pod_template(
            job,
            role=HEAD_ROLE,
            container="ray-head",
            image=image,
            resources={"requests": dict(amounts), "limits": dict(amounts)},
            pool=None,
        ),
    }


def build_rayjob(
    job: RLJob,
    owner: Owner,
    index: int,
    *,
    default_image: str,
    generation: int,
    head_cpu: str = "1",
    head_memory: str = "4Gi",
    ray_version: str = DEFAULT_RAY_VERSION,
) -> dict[str, Any]:
    """RayJob `<rljob>-<index>`: the runtime on a Ray cluster with one worker group per role; index > 0 resumes.

    Ray's token authentication is on with the job's own token (`authOptions`, KubeRay 1.6+: KubeRay puts
    the Secret's token into every Ray container and its own dashboard client; it needs `rayVersion`).
    KubeRay submits the job over HTTP (HTTPMode), so no submitter pod is created: the head, the workers
    and KubeRay's operator are all that talk to the cluster (access.py's NetworkPolicy).
    """
    image = job.spec.image or default_image
    pools = role_pools(job)
    marks = {names.RESTART_LABEL: str(index)}
    elastic = any(pool.is_elastic for _, pool in pools)
    cluster: dict[str, Any] = {
        "rayVersion": ray_version,
        "authOptions": {"mode": "token", "secretName": names.ray_token_secret_name(owner.name)},
        "enableInTreeAutoscaling": elastic,
        "headGroupSpec": head_group(job, image, head_cpu, head_memory),
        "workerGroupSpecs": [worker_group(job, role, pool, image) for role, pool in pools],
    }
    if elastic:  # KubeRay adds the autoscaler as a container of the head pod: restricted like the others
        cluster["autoscalerOptions"] = {"securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT)}
    return {
        "apiVersion": names.RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": child_metadata(
            owner,
            names.rayjob_name(owner.name, index),
            labels=marks,
            annotations={**marks, names.GENERATION_ANNOTATION: str(generation)},
        ),
        "spec": {
            "entrypoint": entrypoint(resume=index > 0),
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": cluster,
        },
    }


def build_event(
    owner: Owner, *, kind: str, reason: str, message: str, time: str, instance: str, component: str = "kuberl-operator"
) -> dict[str, Any]:
    """A core/v1 Event about the RLJob (`kubectl describe rljob` lists it)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": names.RLJOB_API_VERSION,
            "kind": KIND,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": time,
        "lastTimestamp": time,
        "count": 1,
    }
