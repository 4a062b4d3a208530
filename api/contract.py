"""Every name the operator and the runtime agree on, defined once.

The operator writes these into the objects it builds (operator/builders.py: mounts, environment,
the entrypoint, each worker group's Ray resource); the runtime reads them inside the pods
(runtime/). The Helm chart sets the operator's own settings by the names below. Both sides import
this module, so the copies cannot drift: a test scans api/, operator/ and runtime/ and fails on a
stray copy of any of these literals (tests/unit/test_contract.py).

Standard library only: the operator image has no torch, the runtime image no kopf.
"""

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

# -- mounts -------------------------------------------------------------------------------------------
#: Where the spec ConfigMap is mounted in every pod, and the key (so the file name) holding the RLJob manifest.
SPEC_MOUNT_DIR = "/etc/kuberl"
SPEC_KEY = "rljob.yaml"
SPEC_PATH = f"{SPEC_MOUNT_DIR}/{SPEC_KEY}"
#: Where spec.checkpoint.pvcClaimName is mounted in every pod; without checkpoint.uri the runtime saves there.
CHECKPOINT_MOUNT_DIR = "/checkpoints"


def job_folder_on_claim(namespace: str | None, name: str) -> str:
    """`<claim mount>/<namespace>/<name>`: one RLJob's folder on a checkpoint claim, which jobs may share (RWX).
    The runtime keeps the job's checkpoints (`checkpoints/`), its exported model (`model/`) and its outputs there.

    >>> job_folder_on_claim("team-a", "grpo"), job_folder_on_claim(None, "grpo")
    ('/checkpoints/team-a/grpo', '/checkpoints/default/grpo')
    """
    return f"{CHECKPOINT_MOUNT_DIR}/{namespace or 'default'}/{name}"


#: kuberl's runtime images carry files of their own here (the CPU image: the examples' prompts under
#: examples/data); a path under it is on every pod of a job that runs one of them.
IMAGE_FILES_DIR = "/opt/kuberl"

# -- environment of every Ray pod (the operator sets them, the runtime reads them) ---------------------
#: The RLJob's metadata.name and namespace: whose progress the runtime reports.
JOB_NAME_ENV = "KUBERL_JOB_NAME"
JOB_NAMESPACE_ENV = "KUBERL_JOB_NAMESPACE"
#: The RLJob's metadata.uid: which job a checkpoint location belongs to. A job deleted and created again under
#: the same name is another job, with another uid (runtime/checkpoint/checkpointing.py).
JOB_UID_ENV = "KUBERL_JOB_UID"
#: The ConfigMap the runtime writes its report into (head pod only; operator/access.py, `<job>-progress`).
STATUS_CONFIGMAP_ENV = "KUBERL_STATUS_CONFIGMAP"
#: The pool the pod belongs to: `head`, or the role of its worker group (actor, critic, ...).
ROLE_ENV = "KUBERL_ROLE"
#: The bearer token for reward.endpoint, from the key `token` of reward.endpoint.secretRef.
REWARD_ENDPOINT_TOKEN_ENV = "KUBERL_REWARD_ENDPOINT_TOKEN"
#: The port the driver serves Prometheus metrics on (/metrics), unless --metrics-port says otherwise.
METRICS_PORT_ENV = "KUBERL_METRICS_PORT"
#: Where the runtime resolves and builds models (default ~/.cache/kuberl); the images may set it.
CACHE_ENV = "KUBERL_CACHE"

# -- ports --------------------------------------------------------------------------------------------------
#: The Ray head's ports: KubeRay's defaults, spelled out on the head container (ray-operator/controllers/ray/utils/
#: constant.go at v1.6.2: DefaultGcsServerPort, DefaultDashboardPort, DefaultClientPort). The dashboard's port is
#: also Ray's Jobs API, where KubeRay's operator submits the entrypoint and reads its status (operator/access.py
#: lets it in there).
RAY_GCS_PORT = 6379
RAY_DASHBOARD_PORT = 8265
RAY_CLIENT_PORT = 10001
#: Where the driver on the head serves the runtime's Prometheus metrics (/metrics): the operator opens it on the
#: head and hands it to the runtime as METRICS_PORT_ENV (runtime/report/telemetry.py reads that).
METRICS_PORT = 9464

#: Where a pod's ServiceAccount token, CA and namespace are mounted (Kubernetes' own place): the runtime's status
#: publisher reads its token there on the head, and KubeRay's autoscaler reads its own there in its container.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

#: The first Ray with token authentication (RAY_AUTH_MODE=token), which every job's Ray cluster turns on: an older
#: Ray ignores the mode and serves its cluster without it, and KubeRay 1.6 refuses authOptions with an older
#: rayVersion (utils/validation.go ValidateRayClusterSpec). The floor of pyproject.toml's `ray`, of the images'
#: Ray (docker/check-ray-version.py runs in their builds) and of the operator's KUBERL_RAY_VERSION.
TOKEN_AUTH_RAY_VERSION = (2, 52, 0)

# -- the operator's settings (operator/settings.py), set by the Helm chart's Deployment ----------------
RUNTIME_IMAGE_ENV = "KUBERL_RUNTIME_IMAGE"
RESYNC_SECONDS_ENV = "KUBERL_RESYNC_SECONDS"
RECONCILE_WORKERS_ENV = "KUBERL_RECONCILE_WORKERS"
HEAD_CPU_ENV = "KUBERL_HEAD_CPU"
HEAD_MEMORY_ENV = "KUBERL_HEAD_MEMORY"
RAY_VERSION_ENV = "KUBERL_RAY_VERSION"
KUBERAY_OPERATOR_LABELS_ENV = "KUBERL_KUBERAY_OPERATOR_LABELS"
KUBERAY_NAMESPACE_ENV = "KUBERL_KUBERAY_NAMESPACE"
WEBHOOK_ADDR_ENV = "KUBERL_WEBHOOK_ADDR"
WEBHOOK_CERT_ENV = "KUBERL_WEBHOOK_CERT"
WEBHOOK_KEY_ENV = "KUBERL_WEBHOOK_KEY"
#: Leader election (operator/leader.py): the namespace of the Lease; unset, no election (run one replica).
LEASE_NAMESPACE_ENV = "KUBERL_LEASE_NAMESPACE"
LEASE_NAME_ENV = "KUBERL_LEASE_NAME"
#: This replica's holderIdentity in the Lease (default `<hostname>_<random>`, as controller-runtime does).
LEASE_IDENTITY_ENV = "KUBERL_LEASE_IDENTITY"
LEASE_DURATION_ENV = "KUBERL_LEASE_DURATION_SECONDS"
LEASE_RENEW_DEADLINE_ENV = "KUBERL_LEASE_RENEW_DEADLINE_SECONDS"
LEASE_RETRY_PERIOD_ENV = "KUBERL_LEASE_RETRY_PERIOD_SECONDS"
#: /healthz fails once the operator's event loop has not run for this long (operator/health.py).
LOOP_STALL_SECONDS_ENV = "KUBERL_LOOP_STALL_SECONDS"
#: The Lease's name when KUBERL_LEASE_NAME is unset (the chart names it after the release).
DEFAULT_LEASE_NAME = "kuberl-operator"

# -- who writes what (server-side apply field managers) -----------------------------
#: The operator owns spec-derived children and the whole status (it copies the runtime's report into it).
#: Ray's own variable: how long its job supervisor waits between SIGTERM to the driver and SIGKILL (default 3 s).
#: The operator sets it from spec.runPolicy.stopGracePeriodSeconds; the driver reads it to know its window.
RAY_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
#: Ray's own variable: how long `ray start --block` (a pod's Ray; in a worker pod under runtime/podinit.py) that gets
#: SIGTERM keeps its node's processes running, drained, before it kills them (default 30 s; Ray 2.60,
#: python/ray/_private/node.py `_drain_node_before_shutdown`). The operator sets it in every pod to
#: spec.runPolicy.stopGracePeriodSeconds, so a worker pod Kubernetes stops gives the driver the stop window to
#: finish the step and save it (runtime/checkpoint/preemption.py DrainWatcher).
RAY_DRAIN_WINDOW_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
#: The pods outlive the driver's window by this much, so Ray's SIGKILL comes before the kubelet's.
POD_GRACE_MARGIN_SECONDS = 15


def pod_grace_seconds(stop_grace_seconds: int) -> int:
    """terminationGracePeriodSeconds for every pod of a job that may stop for this long (the workers too:
    the ranks write the checkpoint's shards)."""
    return stop_grace_seconds + POD_GRACE_MARGIN_SECONDS


OPERATOR_FIELD_MANAGER = "kuberl-operator"
#: The runtime owns only the data of its job's report ConfigMap.
RUNTIME_FIELD_MANAGER = "kuberl-runtime"


# -- Ray resources --------------------------------------------------------------------------------------
def ray_resource(pool: str) -> str:
    """The custom Ray resource only the pods of one pool offer: `reward` -> `kuberl_reward`.

    A pool is `head` or a role with a pool of its own (api/topology.py decides which).
    """
    return f"kuberl_{pool}"


#: Units of its pool's resource every actor asks for; a pod offers one unit per actor it is meant to hold.
UNITS_PER_ACTOR = 1


# -- exit codes of the runtime ------------------------------------------------------------------------------
class ExitCode(IntEnum):
    """How `python -m kuberl.runtime` (the RayJob's entrypoint) and `kuberl run` end. A user or a script reads them;
    the operator does not: KubeRay reports an entrypoint that failed as FAILED without its code, so the operator
    learns of a configuration error from the runtime's report (`<job>-progress`), which it validates."""

    SUCCESS = 0
    #: The job cannot run as specified (the message names the field or file): restarting will not help.
    CONFIG_ERROR = 1
    #: Training could not go on (runtime/health.py: NaN updates in a row, rewards that keep failing, a step
    #: past training.stepTimeoutSeconds); the last good checkpoint is kept. (sysexits EX_SOFTWARE)
    JOB_FAILED = 70
    #: Stopped early after saving what it had (SIGTERM, or Ray draining a trainer's node: a pod asked to stop), or
    #: after losing a trainer rank outright (the step in progress lost with it): restart it and it resumes from the
    #: latest commit. (sysexits EX_TEMPFAIL)
    RESUMABLE = 75


# -- the runtime's command line: built by the operator, parsed by the runtime ----------------------------
#: How the operator starts the runtime in the RayJob's entrypoint (the arguments follow).
RUNTIME_PROGRAM = ("python", "-m", "kuberl.runtime")
#: A worker pod's first process (runtime/podinit.py): KubeRay's `ray start`, ended at once when the pod is asked to
#: stop after its head is gone. The operator sets it as the Ray container's command of every worker group, with
#: KubeRay's annotation that keeps a container's own command (it then hands `ray start ...` over in
#: KUBERAY_GEN_RAY_START_CMD; ray-operator/controllers/ray/common/pod.go `BuildPod`). The shell is KubeRay's own
#: (`utils.GetContainerCommand`).
WORKER_POD_COMMAND = ("/bin/bash", "-c", "--")
WORKER_POD_ARGS = ("exec python -m kuberl.runtime.podinit",)
KUBERAY_OWN_COMMAND_ANNOTATION = "ray.io/overwrite-container-cmd"


@dataclass(frozen=True)
class RuntimeArgs:
    """The runtime's arguments; each field is one option `--<field>`, `_` spelled `-` (a bool is a switch)."""

    spec: str = field(metadata={"help": "the RLJob manifest (YAML)"})
    output: str | None = field(
        default=None, metadata={"help": "folder for everything the run writes (default: runs/<job name>/)"}
    )
    address: str | None = field(
        default=None, metadata={"help": "Ray cluster to join (default: RAY_ADDRESS, else start a local Ray)"}
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "this is a restart of the same run: resume from the latest committed checkpoint even when "
            "spec.checkpoint.resume is false (the operator passes it to every RayJob after the first)"
        },
    )
    rayjob: str | None = field(
        default=None,
        metadata={
            "help": "the RayJob this run is (the operator names it): the runtime's report carries it, so the "
            "operator never reads one RayJob's verdict as another's"
        },
    )
    metrics_port: int | None = field(
        default=None,
        metadata={
            "help": f"serve Prometheus metrics at :PORT/metrics while it runs (0: any free port; default: "
            f"${METRICS_PORT_ENV})"
        },
    )


def runtime_command(args: RuntimeArgs) -> list[str]:
    """The argument list that starts the runtime with `args`; `parse_runtime_args` reads it back.

    >>> runtime_command(RuntimeArgs(spec="/etc/kuberl/rljob.yaml", resume=True))
    ['python', '-m', 'kuberl.runtime', '--spec', '/etc/kuberl/rljob.yaml', '--resume']
    """
    argv = list(RUNTIME_PROGRAM)
    for option in fields(RuntimeArgs):
        value = getattr(args, option.name)
        if value is True:
            argv.append(_flag(option.name))
        elif value is not None and value is not False:
            argv += [_flag(option.name), str(value)]
    return argv


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_runtime_options(parser: argparse.ArgumentParser, *, spec_positional: bool = False) -> None:
    """The runtime's options on `parser`; `kuberl run` takes the spec as a positional argument instead."""
    for option in fields(RuntimeArgs):
        help_text = option.metadata["help"]
        if option.type is bool:
            parser.add_argument(_flag(option.name), action="store_true", help=help_text)
        elif option.name == "spec" and spec_positional:
            parser.add_argument("spec", help=help_text)
        else:
            kind = int if option.type == (int | None) else str
            parser.add_argument(_flag(option.name), type=kind, required=option.name == "spec", help=help_text)


def runtime_args_of(namespace: argparse.Namespace) -> RuntimeArgs:
    """RuntimeArgs from what a parser with `add_runtime_options` read."""
    values: dict[str, Any] = {option.name: getattr(namespace, option.name) for option in fields(RuntimeArgs)}
    return RuntimeArgs(**values)


def parse_runtime_args(argv: Sequence[str] | None = None) -> RuntimeArgs:
    """The runtime's arguments from its command line (without RUNTIME_PROGRAM)."""
    parser = argparse.ArgumentParser(prog=" ".join(RUNTIME_PROGRAM), description="Run an RLJob.")
    add_runtime_options(parser)
    return runtime_args_of(parser.parse_args(argv))
