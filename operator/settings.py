"""The operator's own settings: flags from `kuberl operator`, the rest from environment variables
(their names are in api/contract.py; the Helm chart sets them).

- KUBERL_RUNTIME_IMAGE (ghcr.io/kuberl/runtime:<kuberl version>): the image of jobs without spec.image.
- KUBERL_RESYNC_SECONDS (300): every RLJob is reconciled at least this often (a kopf timer). It is a
  safety net: RayJob changes, edits and the decisions' own timing (backoff, deadline, TTL) trigger passes.
- KUBERL_RECONCILE_WORKERS (16): reconcile passes that run at once (threads).
- KUBERL_HEAD_CPU / KUBERL_HEAD_MEMORY (1 / 4Gi): the Ray head pod (it runs the controller, no GPU).
- KUBERL_RAY_VERSION (2.60.0): the runtime image's Ray version, the RayCluster's rayVersion; 2.52.0 or later
  (Ray's token authentication, which every job's cluster turns on).
- KUBERL_KUBERAY_NAMESPACE (required) / KUBERL_KUBERAY_OPERATOR_LABELS (app.kubernetes.io/name=kuberay-operator):
  KubeRay's operator pods, which each job's NetworkPolicy lets reach the Ray dashboard: those labels, in that
  namespace only.
- KUBERL_WEBHOOK_ADDR (0.0.0.0): the address the webhook listens on (with --webhook-port).
- KUBERL_WEBHOOK_CERT / KUBERL_WEBHOOK_KEY (required with --webhook-port): the webhook's serving
  certificate and key (PEM files). The ValidatingWebhookConfiguration is the Helm chart's, not the operator's.
- KUBERL_LEASE_NAMESPACE (unset): leader election over the Lease KUBERL_LEASE_NAME (kuberl-operator) in this
  namespace; only the replica holding it reconciles (operator/leader.py). Unset: no election, this process
  reconciles, and exactly one may run. KUBERL_LEASE_IDENTITY (`<hostname>_<random>`): this replica's name in
  the Lease. KUBERL_LEASE_DURATION_SECONDS / _RENEW_DEADLINE_SECONDS / _RETRY_PERIOD_SECONDS (15 / 10 / 2,
  client-go's defaults): how long a standby waits for a silent leader, how long a leader may go without
  renewing before it stops writing, and how often each replica tries.
- KUBERL_LOOP_STALL_SECONDS (10): /healthz fails when the event loop has not run for this long (operator/health.py).
"""

import os
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kuberl import __version__
from kuberl.api import contract
from kuberl.operator.access import KubeRayPeer
from kuberl.operator.builders import DEFAULT_RAY_VERSION

DEFAULT_KUBERAY_LABELS = "app.kubernetes.io/name=kuberay-operator"
#: How often the event loop stamps its heartbeat (health.py); the stall limit must exceed it.
HEARTBEAT_SECONDS = 1.0


def parse_labels(text: str) -> dict[str, str]:
    """`a=b,c=d` -> {"a": "b", "c": "d"}; a clear error for anything else."""
    labels = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ValueError(
                f"{contract.KUBERAY_OPERATOR_LABELS_ENV}: {pair!r} is not key=value (e.g. {DEFAULT_KUBERAY_LABELS})"
            )
        labels[key] = value
    return labels


def kuberay_namespace(env: Mapping[str, str]) -> str:
    """KUBERL_KUBERAY_NAMESPACE, which must be set: without it the NetworkPolicy would have to admit KubeRay's
    labels from every namespace, where anyone who may create a pod could copy them."""
    namespace = env.get(contract.KUBERAY_NAMESPACE_ENV)
    if not namespace:
        raise ValueError(
            f"{contract.KUBERAY_NAMESPACE_ENV} is not set: give the namespace KubeRay's operator runs in (the chart's "
            "kuberay.namespace; `kubectl get pods -A -l app.kubernetes.io/name=kuberay-operator` shows it). Each "
            "job's NetworkPolicy admits KubeRay to the Ray dashboard from that namespace only"
        )
    return namespace


def ray_version(env: Mapping[str, str]) -> str:
    """KUBERL_RAY_VERSION (default DEFAULT_RAY_VERSION), refused below the first Ray with token authentication:
    that Ray would ignore RAY_AUTH_MODE, and KubeRay refuses every RayJob whose rayVersion says so."""
    version = env.get(contract.RAY_VERSION_ENV) or DEFAULT_RAY_VERSION
    found = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    floor = ".".join(map(str, contract.TOKEN_AUTH_RAY_VERSION))
    if found is None or tuple(int(part or 0) for part in found.groups()) < contract.TOKEN_AUTH_RAY_VERSION:
        raise ValueError(
            f"{contract.RAY_VERSION_ENV} ({version!r}) must be the Ray version of the runtime image, {floor} or later: "
            "every job's Ray cluster uses Ray's token authentication, which older Ray ignores"
        )
    return version


def default_runtime_image(version: str = __version__) -> str:
    return f"ghcr.io/kuberl/runtime:{version}"


def default_identity() -> str:
    """`<hostname>_<random>`: the pod's name, made unique per process (a restarted container is a new holder)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaderElection:
    """Where the Lease is, who this replica is, and the timing of the protocol (operator/leader.py)."""

    namespace: str
    name: str = contract.DEFAULT_LEASE_NAME
    identity: str = field(default_factory=default_identity)
    #: A standby takes the Lease once it has seen no renewal for this long (whole seconds: the Lease's field).
    lease_duration_seconds: int = 15
    #: The leader stops writing once its last successful renewal started this long ago.
    renew_deadline_seconds: float = 10.0
    #: How often each replica reads (and the leader renews) the Lease.
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        duration, renew, retry = self.lease_duration_seconds, self.renew_deadline_seconds, self.retry_period_seconds
        if not self.namespace or not self.name or not self.identity:
            raise ValueError(
                f"{contract.LEASE_NAMESPACE_ENV}, {contract.LEASE_NAME_ENV} and {contract.LEASE_IDENTITY_ENV} "
                "must not be empty"
            )
        if duration < 1 or renew <= 0 or retry <= 0:
            raise ValueError(
                f"{contract.LEASE_DURATION_ENV} ({duration}) must be a whole number of seconds >= 1, "
                f"{contract.LEASE_RENEW_DEADLINE_ENV} ({renew}) and {contract.LEASE_RETRY_PERIOD_ENV} ({retry}) "
                "must be positive"
            )
        if renew >= duration:
            raise ValueError(
                f"{contract.LEASE_RENEW_DEADLINE_ENV} ({renew}) must be below {contract.LEASE_DURATION_ENV} "
                f"({duration}): a leader must stop writing before a standby may take the Lease"
            )
        if retry >= renew:
            raise ValueError(
                f"{contract.LEASE_RETRY_PERIOD_ENV} ({retry}) must be below {contract.LEASE_RENEW_DEADLINE_ENV} "
                f"({renew}): a leader needs more than one try to renew before it must stop"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "LeaderElection | None":
        """None when KUBERL_LEASE_NAMESPACE is unset (no election)."""
        namespace = env.get(contract.LEASE_NAMESPACE_ENV)
        if not namespace:
            return None
        duration = env.get(contract.LEASE_DURATION_ENV, "15")
        if not duration.isdigit():
            raise ValueError(f"{contract.LEASE_DURATION_ENV}: {duration!r} is not a whole number of seconds")
        return cls(
            namespace=namespace,
            name=env.get(contract.LEASE_NAME_ENV) or contract.DEFAULT_LEASE_NAME,
            identity=env.get(contract.LEASE_IDENTITY_ENV) or default_identity(),
            lease_duration_seconds=int(duration),
            renew_deadline_seconds=float(env.get(contract.LEASE_RENEW_DEADLINE_ENV, "10")),
            retry_period_seconds=float(env.get(contract.LEASE_RETRY_PERIOD_ENV, "2")),
        )


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = default_runtime_image()
    resync_seconds: float = 300.0
    workers: int = 16
    head_cpu: str = "1"
    head_memory: str = "4Gi"
    #: The Ray version of the runtime image, told to KubeRay (rayVersion; its token authentication needs 2.52+)
    ray_version: str = DEFAULT_RAY_VERSION
    #: Where KubeRay's operator runs, for each job's NetworkPolicy (its namespace, required, and its pods' labels)
    kuberay: KubeRayPeer = field(kw_only=True)
    namespaces: tuple[str, ...] = ()
    metrics_port: int | None = None
    webhook_port: int | None = None
    webhook_addr: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None
    #: None: no leader election, this process reconciles (run one replica only)
    leader_election: LeaderElection | None = None
    #: /healthz fails once the event loop has not run for this long
    loop_stall_seconds: float = 10.0

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        namespaces: Sequence[str] | None = None,
        metrics_port: int | None = None,
        webhook_port: int | None = None,
    ) -> "OperatorSettings":
        env = os.environ if env is None else env
        loop_stall_seconds = float(env.get(contract.LOOP_STALL_SECONDS_ENV, "10"))
        if loop_stall_seconds <= HEARTBEAT_SECONDS:
            raise ValueError(
                f"{contract.LOOP_STALL_SECONDS_ENV} ({loop_stall_seconds:g}) must exceed the event loop's heartbeat "
                f"interval ({HEARTBEAT_SECONDS:g} s)"
            )
        return cls(
            runtime_image=env.get(contract.RUNTIME_IMAGE_ENV) or default_runtime_image(),
            resync_seconds=float(env.get(contract.RESYNC_SECONDS_ENV, "300")),
            workers=int(env.get(contract.RECONCILE_WORKERS_ENV, "16")),
            head_cpu=env.get(contract.HEAD_CPU_ENV, "1"),
            head_memory=env.get(contract.HEAD_MEMORY_ENV, "4Gi"),
            ray_version=ray_version(env),
            kuberay=KubeRayPeer(
                namespace=kuberay_namespace(env),
                labels=parse_labels(env.get(contract.KUBERAY_OPERATOR_LABELS_ENV) or DEFAULT_KUBERAY_LABELS),
            ),
            namespaces=tuple(namespaces or ()),
            metrics_port=metrics_port,
            webhook_port=webhook_port,
            webhook_addr=env.get(contract.WEBHOOK_ADDR_ENV, "0.0.0.0"),
            webhook_cert=env.get(contract.WEBHOOK_CERT_ENV) or None,
            webhook_key=env.get(contract.WEBHOOK_KEY_ENV) or None,
            leader_election=LeaderElection.from_env(env),
            loop_stall_seconds=loop_stall_seconds,
        )
