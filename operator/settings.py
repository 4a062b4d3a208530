"""The operator's own settings: flags from `kuberl operator`, the rest from environment variables
(their names are in api/contract.py; the Helm chart sets them).

- KUBERL_RUNTIME_IMAGE (ghcr.io/kuberl/runtime:<kuberl version>): the image of jobs without spec.image.
- KUBERL_RESYNC_SECONDS (300): every RLJob is reconciled at least this often (a kopf timer). It is a
  safety net: RayJob changes, edits and the decisions' own timing (backoff, deadline, TTL) trigger passes.
- KUBERL_RECONCILE_WORKERS (16): reconcile passes that run at once (threads).
- KUBERL_HEAD_CPU / KUBERL_HEAD_MEMORY (1 / 4Gi): the Ray head pod (it runs the controller, no GPU).
- KUBERL_RAY_VERSION (2.60.0): the runtime image's Ray version, the RayCluster's rayVersion.
- KUBERL_KUBERAY_OPERATOR_LABELS (app.kubernetes.io/name=kuberay-operator) / KUBERL_KUBERAY_NAMESPACE (any):
  KubeRay's operator pods, which each job's NetworkPolicy lets reach the Ray dashboard.
- KUBERL_WEBHOOK_ADDR (0.0.0.0): the address the webhook listens on (with --webhook-port).
- KUBERL_WEBHOOK_CERT / KUBERL_WEBHOOK_KEY (required with --webhook-port): the webhook's serving
  certificate and key (PEM files). The ValidatingWebhookConfiguration is the Helm chart's, not the operator's.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kuberl import __version__
from kuberl.api import contract
from kuberl.operator.access import KubeRayPeer
from kuberl.operator.builders import DEFAULT_RAY_VERSION

DEFAULT_KUBERAY_LABELS = "app.kubernetes.io/name=kuberay-operator"


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


def default_runtime_image(version: str = __version__) -> str:
    return f"ghcr.io/kuberl/runtime:{version}"


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = default_runtime_image()
    resync_seconds: float = 300.0
    workers: int = 16
    head_cpu: str = "1"
    head_memory: str = "4Gi"
    #: The Ray version of the runtime image, told to KubeRay (rayVersion; its token authentication needs 2.52+)
    ray_version: str = DEFAULT_RAY_VERSION
    #: Where KubeRay's operator runs, for each job's NetworkPolicy (its pods' labels; its namespace, None: any)
    kuberay: KubeRayPeer = field(default_factory=KubeRayPeer)
    namespaces: tuple[str, ...] = ()
    metrics_port: int | None = None
    webhook_port: int | None = None
    webhook_addr: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None

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
        return cls(
            runtime_image=env.get(contract.RUNTIME_IMAGE_ENV) or default_runtime_image(),
            resync_seconds=float(env.get(contract.RESYNC_SECONDS_ENV, "300")),
            workers=int(env.get(contract.RECONCILE_WORKERS_ENV, "16")),
            head_cpu=env.get(contract.HEAD_CPU_ENV, "1"),
            head_memory=env.get(contract.HEAD_MEMORY_ENV, "4Gi"),
            ray_version=env.get(contract.RAY_VERSION_ENV) or DEFAULT_RAY_VERSION,
            kuberay=KubeRayPeer(
                labels=parse_labels(env.get(contract.KUBERAY_OPERATOR_LABELS_ENV) or DEFAULT_KUBERAY_LABELS),
                namespace=env.get(contract.KUBERAY_NAMESPACE_ENV) or None,
            ),
            namespaces=tuple(namespaces or ()),
            metrics_port=metrics_port,
            webhook_port=webhook_port,
            webhook_addr=env.get(contract.WEBHOOK_ADDR_ENV, "0.0.0.0"),
            webhook_cert=env.get(contract.WEBHOOK_CERT_ENV) or None,
            webhook_key=env.get(contract.WEBHOOK_KEY_ENV) or None,
        )
