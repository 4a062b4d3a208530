"""The operator's own settings: flags from `kuberl operator`, the rest from environment variables
(their names are in api/contract.py; the Helm chart sets them).

- KUBERL_RUNTIME_IMAGE (ghcr.io/kuberl/runtime:<kuberl version>): the image of jobs without spec.image.
- KUBERL_RESYNC_SECONDS (300): every RLJob is reconciled at least this often (a kopf timer). It is a
  safety net: RayJob changes, edits and the decisions' own timing (backoff, deadline, TTL) trigger passes.
- KUBERL_RECONCILE_WORKERS (16): reconcile passes that run at once (threads).
- KUBERL_HEAD_CPU / KUBERL_HEAD_MEMORY (1 / 4Gi): the Ray head pod (it runs the controller, no GPU).
- KUBERL_WEBHOOK_HOST (127.0.0.1): the host name the API server reaches the webhook at.
- KUBERL_WEBHOOK_ADDR (0.0.0.0): the address the webhook listens on.
- KUBERL_WEBHOOK_SERVICE (none): `namespace/name[:port]`, reach the webhook through this Service instead.
- KUBERL_WEBHOOK_CERT / KUBERL_WEBHOOK_KEY (self-signed): the webhook's serving certificate and key (PEM).
- KUBERL_WEBHOOK_CONFIGURATION (kuberl.io): the ValidatingWebhookConfiguration kopf keeps current (its
  webhook is `validate-rljob.<this>`, which Kubernetes wants to have at least three dot-separated parts);
  empty: none.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kuberl import __version__
from kuberl.api import contract


def default_runtime_image(version: str = __version__) -> str:
    return f"ghcr.io/kuberl/runtime:{version}"


@dataclass(frozen=True)
class OperatorSettings:
    runtime_image: str = default_runtime_image()
    resync_seconds: float = 300.0
    workers: int = 16
    head_cpu: str = "1"
    head_memory: str = "4Gi"
    #: ServiceAccount of the Ray pods (the runtime patches its RLJob's status as it); None: the namespace's default
    runtime_service_account: str | None = None
    namespaces: tuple[str, ...] = ()
    metrics_port: int | None = None
    webhook_port: int | None = None
    webhook_host: str = "127.0.0.1"
    webhook_addr: str = "0.0.0.0"
    webhook_service: str | None = None
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_configuration: str | None = "kuberl.io"

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
            runtime_service_account=env.get(contract.RUNTIME_SERVICE_ACCOUNT_ENV) or None,
            namespaces=tuple(namespaces or ()),
            metrics_port=metrics_port,
            webhook_port=webhook_port,
            webhook_host=env.get(contract.WEBHOOK_HOST_ENV, "127.0.0.1"),
            webhook_addr=env.get(contract.WEBHOOK_ADDR_ENV, "0.0.0.0"),
            webhook_service=env.get(contract.WEBHOOK_SERVICE_ENV) or None,
            webhook_cert=env.get(contract.WEBHOOK_CERT_ENV) or None,
            webhook_key=env.get(contract.WEBHOOK_KEY_ENV) or None,
            webhook_configuration=env.get(contract.WEBHOOK_CONFIGURATION_ENV, "kuberl.io") or None,
        )
