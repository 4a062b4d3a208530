"""Pure builders of the objects the operator owns: the spec ConfigMap and the KubeRay RayJob.

Every builder is a function of the parsed RLJob and a few plain values (owner identity, index,
image); no clock, no API calls. The RayJob's Ray cluster is rendered from the job's topology
(api/topology.py `plan_topology`, the same one the runtime places its actors by): a head group (it
runs the controller, the driver started by the entrypoint) and one worker group per pool. Each
group's `rayStartParams.resources` offers its pool's custom Ray resource (`kuberl_<pool>`), one unit
per actor the topology puts on one pod, so the runtime's actors land only on their own pool's pods.
Elastic pools (minReplicas < maxReplicas) turn on KubeRay's in-tree autoscaler; the RayJob is never
re-applied once created, so replica counts the autoscaler moves are never fought over.

Every pod passes Pod Security `restricted` (pods.py), runs as the job's own ServiceAccount
(access.py), and only the head pod, where the controller publishes its report, mounts its token. With an
elastic pool the head pod runs as `<job>-autoscaler`, the account KubeRay binds its autoscaler's Role to, whose
token only KubeRay's autoscaler container mounts; the Ray container mounts the job's own account's token.
Ray's token authentication is on (`authOptions`), and KubeRay submits over HTTP (no submitter pod).

With `spec.queueName` the RayJob carries Kueue's queue label (and priority-class label) and is
created suspended, as Kueue's RayJob integration requires: Kueue unsuspends it on admission and
suspends it again to preempt it. The same never-re-applied rule means the operator never writes
`suspend` back while Kueue owns it.

The head also serves the runtime's Prometheus metrics (`contract.METRICS_PORT`, named `kuberl-metrics`,
handed to the runtime as KUBERL_METRICS_PORT) for a PodMonitor to scrape.

The entrypoint is the runtime's command line (api/contract.py `runtime_command`) joined with
shlex.join: KubeRay hands it to the head's Ray Jobs API, which runs it in a shell, and no user string
is ever pasted into it. Mounts and environment names come from api/contract.py too.
"""

import copy
import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from kuberl.api import KIND, RLJob, contract
from kuberl.api.resources import PodPlacement, RoleResources
from kuberl.api.topology import HEAD_POOL, Pool, plan_topology
from kuberl.operator import names
from kuberl.operator.pods import CONTAINER_SECURITY_CONTEXT, POD_SECURITY_CONTEXT, container_resources, merge

#: The name of the head's port of the runtime's Prometheus metrics (the chart's PodMonitor scrapes it by name).
METRICS_PORT_NAME = "kuberl-metrics"
#: Ports of the Ray head (KubeRay's defaults, spelled out) and the runtime's metrics.
HEAD_PORTS = (
    {"containerPort": contract.RAY_GCS_PORT, "name": "gcs"},
    {"containerPort": contract.RAY_DASHBOARD_PORT, "name": "dashboard"},
    {"containerPort": contract.RAY_CLIENT_PORT, "name": "client"},
    {"containerPort": contract.METRICS_PORT, "name": METRICS_PORT_NAME},
)
#: The Ray version the runtime image carries (KubeRay needs it with authOptions; 2.52+ has token auth).
DEFAULT_RAY_VERSION = "2.60.0"
#: The role name of the head pod, which runs the controller.
HEAD_ROLE = HEAD_POOL
SPEC_VOLUME = "kuberl-spec"
CHECKPOINT_VOLUME = "kuberl-checkpoints"
#: The head pod's token volumes when a pool is elastic (access.py: the autoscaler runs as an account of its own).
AUTOSCALER_TOKEN_VOLUME = "kuberl-autoscaler-token"
RUNTIME_TOKEN_VOLUME = "kuberl-runtime-token"
#: The lifetime Kubernetes' own ServiceAccount admission asks for a projected token (the kubelet renews it), so the
#: autoscaler's token behaves as the one KubeRay's autoscaler would otherwise get.
PROJECTED_TOKEN_SECONDS = 3607


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
    """`<rljob>-spec`: the spec the current RayJob runs, mounted at contract.SPEC_PATH in every pod."""
    text = yaml.safe_dump(spec_manifest(owner.name, owner.namespace, spec), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(
            owner, names.configmap_name(owner.name), annotations={names.GENERATION_ANNOTATION: str(generation)}
        ),
        "data": {contract.SPEC_KEY: text},
    }


def configmap_spec(configmap: dict[str, Any] | None) -> dict[str, Any] | None:
    """The spec a ConfigMap built by `build_configmap` holds; None when absent or unreadable."""
    if configmap is None:
        return None
    try:
        manifest = yaml.safe_load(configmap.get("data", {}).get(contract.SPEC_KEY, ""))
    except yaml.YAMLError:
        return None
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    return spec if isinstance(spec, dict) else None


def runtime_args(resume: bool, rayjob: str) -> list[str]:
    """The runtime's command line on the mounted spec; `--resume` marks a restart of the same run, and
    `--rayjob` names the RayJob in the runtime's reports."""
    return contract.runtime_command(contract.RuntimeArgs(spec=contract.SPEC_PATH, resume=resume, rayjob=rayjob))


def entrypoint(resume: bool, rayjob: str) -> str:
    return shlex.join(runtime_args(resume, rayjob))


def ray_start_params(pool: Pool) -> dict[str, str]:
    """The pool's custom resource in KubeRay's format: a JSON object inside a quoted string,
    `"{\\"kuberl_actor\\": 8}"`. Nothing when the pool holds no actor."""
    offered = {name: int(units) for name, units in pool.offered_resources.items()}
    return {"resources": json.dumps(json.dumps(offered))} if offered else {}


def pod_env(job: RLJob, role: str, uid: str) -> list[dict[str, Any]]:
    """Values go into env entries (never into a command line); the user's come after kuberl's own. `uid` is the
    RLJob's: the runtime keeps it with the checkpoints, so a job created again under the same name is told apart."""
    own: list[dict[str, Any]] = [
        {"name": contract.JOB_NAME_ENV, "value": job.metadata.name},
        {"name": contract.JOB_NAMESPACE_ENV, "value": job.metadata.namespace or ""},
        {"name": contract.JOB_UID_ENV, "value": uid},
        # a pod Kubernetes stops keeps its Ray processes for the stop window: the driver saves the step under way
        {"name": contract.RAY_DRAIN_WINDOW_ENV, "value": str(job.spec.run_policy.stop_grace_period_seconds)},
        {"name": contract.ROLE_ENV, "value": role},
    ]
    if role == HEAD_ROLE:  # the controller runs there: it publishes its report and serves the metrics
        own.append({"name": contract.STATUS_CONFIGMAP_ENV, "value": names.progress_configmap_name(job.metadata.name)})
        own.append({"name": contract.METRICS_PORT_ENV, "value": str(contract.METRICS_PORT)})
    endpoint = job.spec.reward.endpoint
    if endpoint is not None and endpoint.secret_ref is not None:
        own.append(
            {
                "name": contract.REWARD_ENDPOINT_TOKEN_ENV,
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
    mounts: list[dict[str, Any]] = [{"name": SPEC_VOLUME, "mountPath": contract.SPEC_MOUNT_DIR, "readOnly": True}]
    claim = job.spec.checkpoint.pvc_claim_name
    if claim is not None:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": contract.CHECKPOINT_MOUNT_DIR})
    return volumes, mounts


def pod_template(
    job: RLJob,
    *,
    role: str,
    container: str,
    image: str,
    resources: dict[str, Any],
    pool: PodPlacement | None,
    uid: str,
) -> dict[str, Any]:
    """A role's pod: Pod Security `restricted`, the job's own ServiceAccount, its token only in the head pod;
    `pool`'s node selector, tolerations and partial template on top."""
    volumes, mounts = pod_volumes(job, names.configmap_name(job.metadata.name))
    main: dict[str, Any] = {
        "name": container,
        "image": image,
        "env": pod_env(job, role, uid),
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
        # the controller on the head publishes the job's report with this account's token; worker pods, which run
        # reward code, get no token (with an elastic pool the head runs as the autoscaler's account instead:
        # separate_autoscaler_account)
        "serviceAccountName": names.runtime_account_name(job.metadata.name),
        "automountServiceAccountToken": role == HEAD_ROLE,
        # every pod outlives the driver's stop window: the ranks on the workers write the checkpoint's shards
        "terminationGracePeriodSeconds": contract.pod_grace_seconds(job.spec.run_policy.stop_grace_period_seconds),
    }
    if role == HEAD_ROLE and job.spec.resources.autoscaled:
        separate_autoscaler_account(job.metadata.name, spec, main)
    if pool is not None and pool.node_selector:
        spec["nodeSelector"] = dict(pool.node_selector)
    if pool is not None and pool.tolerations:
        spec["tolerations"] = [toleration.to_manifest() for toleration in pool.tolerations]
    template = {"metadata": {"labels": {names.JOB_LABEL: job.metadata.name, "kuberl.io/role": role}}, "spec": spec}
    if pool is not None and pool.pod_template:
        template = merge(template, pool.pod_template)
    return template


def separate_autoscaler_account(job: str, spec: dict[str, Any], ray_container: dict[str, Any]) -> None:
    """The head pod of a job with an elastic pool (access.py): KubeRay binds its autoscaler's Role to the pod's
    account, so the pod runs as `<job>-autoscaler` without an automatic token; that account's token is projected
    only into the autoscaler's container (`autoscaler_options`), and the Ray container, where user code can run,
    mounts the token of `<job>-runtime` from its Secret where Kubernetes would have put the pod's own."""
    spec["serviceAccountName"] = names.autoscaler_account_name(job)
    spec["automountServiceAccountToken"] = False
    spec["volumes"] += [autoscaler_token_volume(), runtime_token_volume(job)]
    ray_container["volumeMounts"].append(
        {"name": RUNTIME_TOKEN_VOLUME, "mountPath": contract.SERVICE_ACCOUNT_DIR, "readOnly": True}
    )


def autoscaler_token_volume() -> dict[str, Any]:
    """What Kubernetes' ServiceAccount admission projects into a pod for the pod's own account (a token, the
    cluster's CA, the namespace), as a volume only the autoscaler's container mounts."""
    namespace = {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    return {
        "name": AUTOSCALER_TOKEN_VOLUME,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": PROJECTED_TOKEN_SECONDS}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [namespace]}},
            ]
        },
    }


def runtime_token_volume(job: str) -> dict[str, Any]:
    """`<job>-runtime-token` (token, CA, namespace): each key named, so the pod starts only once Kubernetes' token
    controller has filled the Secret in."""
    keys = [{"key": key, "path": key} for key in ("token", "ca.crt", "namespace")]
    return {"name": RUNTIME_TOKEN_VOLUME, "secret": {"secretName": names.runtime_token_secret_name(job), "items": keys}}


def autoscaler_options() -> dict[str, Any]:
    """KubeRay's autoscaler container (it adds it to the head pod): restricted like the others, and the only one
    that mounts the head pod's own token (KubeRay v1.6.2 common/pod.go `mergeAutoscalerOverrides` appends these
    volumeMounts to it; Ray's autoscaler reads its token from Kubernetes' usual place)."""
    mount = {"name": AUTOSCALER_TOKEN_VOLUME, "mountPath": contract.SERVICE_ACCOUNT_DIR, "readOnly": True}
    return {"securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT), "volumeMounts": [mount]}


def worker_group(job: RLJob, pool: Pool, image: str, uid: str) -> dict[str, Any]:
    """One Ray worker group for a pool: its pods, the autoscaler's bounds, and the resource it offers."""
    size: RoleResources = getattr(job.spec.resources, pool.name)  # placement constraints and podTemplate
    template = pod_template(
        job,
        role=pool.name,
        container="ray-worker",
        image=image,
        resources=container_resources(pool, pool.ephemeral_storage),
        pool=size,
        uid=uid,
    )
    run_ray_start_in_podinit(template)
    return {
        "groupName": pool.name,
        "replicas": pool.pods,
        "minReplicas": pool.min_pods,
        "maxReplicas": pool.max_pods,
        "rayStartParams": ray_start_params(pool),
        "template": template,
    }


def run_ray_start_in_podinit(template: dict[str, Any]) -> None:
    """A worker pod's Ray container runs KubeRay's `ray start` under runtime/podinit.py, which ends the pod at once
    when it is asked to stop after its head is gone, instead of after the whole stop window (api/contract.py
    WORKER_POD_COMMAND). A podTemplate that gives the Ray container a command or args of its own keeps KubeRay's
    handling of them (KubeRay runs them before its `ray start`), without podinit."""
    ray_container = template["spec"]["containers"][0]  # KubeRay's Ray container is the first
    if "command" in ray_container or "args" in ray_container:
        return
    ray_container["command"] = list(contract.WORKER_POD_COMMAND)
    ray_container["args"] = list(contract.WORKER_POD_ARGS)
    template["metadata"].setdefault("annotations", {})[contract.KUBERAY_OWN_COMMAND_ANNOTATION] = "true"


def head_group(job: RLJob, pool: Pool, image: str, cpu: str, memory: str, uid: str) -> dict[str, Any]:
    """The head: it runs the controller, and the actors the topology puts beside it (a reward without a pool)."""
    amounts = {"cpu": cpu, "memory": memory}
    if pool.ephemeral_storage is not None:  # the environment workers run tool calls here (no reward pool)
        amounts["ephemeral-storage"] = pool.ephemeral_storage
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0", **ray_start_params(pool)},
        "template": pod_template(
            job,
            role=pool.name,
            container="ray-head",
            image=image,
            resources={"requests": dict(amounts), "limits": dict(amounts)},
            pool=job.spec.resources.head,
            uid=uid,
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
    ray_version: str = DEFAULT_RAY_VERSION,
) -> dict[str, Any]:
    """RayJob `<rljob>-<index>`: the runtime on a Ray cluster with one worker group per pool; index > 0 is a
    restart of the same run (the runtime resumes from the latest checkpoint).

    Ray's token authentication is on with the job's own token (`authOptions`, KubeRay 1.6+: KubeRay puts
    the Secret's token into every Ray container and its own dashboard client; it needs `rayVersion`).
    KubeRay submits the job over HTTP (HTTPMode), so no submitter pod is created: the head, the workers
    and KubeRay's operator are all that talk to the cluster (access.py's NetworkPolicy).
    """
    image = job.spec.image or default_image
    topology = plan_topology(job.spec)
    marks = {names.RESTART_LABEL: str(index)}
    elastic = job.spec.resources.autoscaled  # any pool elastic (as plan_topology's pools)
    cluster: dict[str, Any] = {
        "rayVersion": ray_version,
        "authOptions": {"mode": "token", "secretName": names.ray_token_secret_name(owner.name)},
        "enableInTreeAutoscaling": elastic,
        "headGroupSpec": head_group(job, topology.head, image, head_cpu, head_memory, owner.uid),
        "workerGroupSpecs": [worker_group(job, pool, image, owner.uid) for pool in topology.worker_pools],
    }
    if elastic:  # KubeRay adds the autoscaler as a container of the head pod
        cluster["autoscalerOptions"] = autoscaler_options()
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
            # A queued job's RayJob is re-run by KubeRay after each Kueue preemption: every run of it but
            # the first is a restart of the same run, and only --resume makes it one (resume: false).
            "entrypoint": entrypoint(
                resume=index > 0 or job.spec.queue_name is not None, rayjob=names.rayjob_name(owner.name, index)
            ),
            "submissionMode": "HTTPMode",
            # Ray's job supervisor reads this from the job's runtime_env: the driver's SIGTERM-to-SIGKILL window
            "runtimeEnvYAML": yaml.safe_dump(
                {"env_vars": {contract.RAY_STOP_WAIT_ENV: str(job.spec.run_policy.stop_grace_period_seconds)}}
            ),
            # Kueue admits a queued RayJob by unsuspending it; it must be created suspended.
            **({"suspend": True} if job.spec.queue_name else {}),
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": cluster,
        },
    }


def build_event(
    owner: Owner,
    *,
    kind: str,
    reason: str,
    message: str,
    time: str,
    instance: str,
    component: str = names.FIELD_MANAGER,
) -> dict[str, Any]:
    """A core/v1 Event about the RLJob (`kubectl describe rljob` lists it); the operator's name, its field
    manager, is the reporting component."""
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
