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

With `spec.queueName` the RayJob carries Kueue's queue label (and priority-class label) and is
created suspended, as Kueue's RayJob integration requires: Kueue unsuspends it on admission and
suspends it again to preempt it. The same never-re-applied rule means the operator never writes
`suspend` back while Kueue owns it.

The head also serves the runtime's Prometheus metrics (`METRICS_PORT`, named `kuberl-metrics`,
handed to the runtime as KUBERL_METRICS_PORT) for a PodMonitor to scrape.

The entrypoint is an argument list joined with shlex.join: KubeRay hands it to a shell
(`ray job submit ... -- <entrypoint>`), and no user string is ever pasted into it.
"""

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from kuberl.api import KIND, RLJob
from kuberl.api.enums import Role
from kuberl.api.resources import RoleResources
from kuberl.operator import names
from kuberl.operator.pods import container_resources, merge

#: Units of its group's custom Ray resource each worker pod offers (actors ask for 1, or a fraction).
RAY_RESOURCE_UNITS = 1000
#: The runtime's Prometheus metrics on the Ray head (the driver serves /metrics; runtime/telemetry.py).
METRICS_PORT = 9464
METRICS_PORT_NAME = "kuberl-metrics"
METRICS_PORT_ENV = "KUBERL_METRICS_PORT"
#: Ports of the Ray head (KubeRay's defaults, spelled out) and the runtime's metrics.
HEAD_PORTS = (
    {"containerPort": 6379, "name": "gcs"},
    {"containerPort": 8265, "name": "dashboard"},
    {
        "containerPort": 10001,
        "name": "client",
    },
    {"containerPort": METRICS_PORT, "name": METRICS_PORT_NAME},
)
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
    if role == "head":  # the driver runs there and serves the metrics
        own.append({"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)})
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
    service_account: str | None = None,
) -> dict[str, Any]:
    volumes, mounts = pod_volumes(job, names.configmap_name(job.metadata.name))
    main: dict[str, Any] = {
        "name": container,
        "image": image,
        "env": pod_env(job, role),
        "resources": resources,
        "volumeMounts": mounts,
    }
    env_from = pod_env_from(job)
    if env_from:
        main["envFrom"] = env_from
    if container == "ray-head":
        main["ports"] = [dict(port) for port in HEAD_PORTS]
    spec: dict[str, Any] = {"containers": [main], "volumes": volumes}
    if (
        service_account
    ):  # the runtime publishes the RLJob's progress as this account (a pool's podTemplate may override)
        spec["serviceAccountName"] = service_account
    if pool is not None and pool.node_selector:
        spec["nodeSelector"] = dict(pool.node_selector)
    if pool is not None and pool.tolerations:
        spec["tolerations"] = [toleration.to_manifest() for toleration in pool.tolerations]
    template = {"metadata": {"labels": {names.JOB_LABEL: job.metadata.name, "kuberl.io/role": role}}, "spec": spec}
    if pool is not None and pool.pod_template:
        template = merge(template, pool.pod_template)
    return template


def worker_group(
    job: RLJob, role: Role, pool: RoleResources, image: str, service_account: str | None = None
) -> dict[str, Any]:
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
            service_account=service_account,
        ),
    }


def head_group(job: RLJob, image: str, cpu: str, memory: str, service_account: str | None = None) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory}
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0"},
        "template": pod_template(
            job,
            role="head",
            container="ray-head",
            image=image,
            resources={"requests": dict(amounts), "limits": dict(amounts)},
            pool=None,
            service_account=service_account,
        ),
    }


def kueue_labels(job: RLJob) -> dict[str, str]:
    """Kueue's queue and priority-class labels for spec.queueName / spec.workloadPriorityClass; none without a queue."""
    if job.spec.queue_name is None:
        return {}
    labels = {names.KUEUE_QUEUE_LABEL: job.spec.queue_name}
    if job.spec.workload_priority_class is not None:
        labels[names.KUEUE_PRIORITY_LABEL] = job.spec.workload_priority_class
    return labels


def build_rayjob(
    job: RLJob,
    owner: Owner,
    index: int,
    *,
    default_image: str,
    generation: int,
    head_cpu: str = "1",
    head_memory: str = "4Gi",
    service_account: str | None = None,
) -> dict[str, Any]:
    """RayJob `<rljob>-<index>`: the runtime on a Ray cluster with one worker group per role; index > 0 resumes."""
    image = job.spec.image or default_image
    pools = role_pools(job)
    marks = {names.RESTART_LABEL: str(index)}
    return {
        "apiVersion": names.RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": child_metadata(
            owner,
            names.rayjob_name(owner.name, index),
            labels={**marks, **kueue_labels(job)},
            annotations={**marks, names.GENERATION_ANNOTATION: str(generation)},
        ),
        "spec": {
            "entrypoint": entrypoint(resume=index > 0),
            # Kueue admits a queued RayJob by unsuspending it; it must be created suspended.
            **({"suspend": True} if job.spec.queue_name else {}),
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "enableInTreeAutoscaling": any(pool.is_elastic for _, pool in pools),
                "headGroupSpec": head_group(job, image, head_cpu, head_memory, service_account),
                "workerGroupSpecs": [worker_group(job, role, pool, image, service_account) for role, pool in pools],
            },
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
