"""The runtime's progress on the RLJob itself: status.progress, .metrics, .validation and .lastCheckpoint.

Inside a Kubernetes pod (the operator sets KUBERL_JOB_NAME and KUBERL_JOB_NAMESPACE; the pod's
service account token is mounted) the publisher PATCHes the RLJob's status subresource with
server-side apply under the field manager `kuberl-runtime`, which owns only those fields:
the operator's manager owns phase, conditions and restarts, and neither overwrites the other.
Anywhere else (`kuberl run` on a laptop, tests) it is a no-op.

Standard library only (urllib + ssl): the runtime image does not carry the kubernetes client.
Requests go out from a background thread, at most one every `min_interval` seconds with the
newest values (older unsent ones are dropped), so a slow or absent API server never slows a
training step; failures are logged, at most once a minute, and never raised.
"""

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kuberl.api.status import CheckpointRef, Metrics, Progress, Validation
from kuberl.runtime.telemetry import status_fields

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "kuberl.io", "v1alpha1", "rljobs", "RLJob"
FIELD_MANAGER = "kuberl-runtime"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def status_metrics(step_metrics: Mapping[str, float]) -> dict[str, Any]:
    """The headline metrics of a step, keyed as status.metrics wants them (`telemetry.EXPORTS` names them).

    >>> status_metrics({"reward/mean": 0.5, "kl/mean": 0.01, "time/step": 3.0})
    {'rewardMean': 0.5, 'kl': 0.01}
    """
    return Metrics.model_validate(status_fields(step_metrics)).to_manifest()


def apply_patch(
    name: str,
    namespace: str,
    progress: Mapping[str, Any],
    metrics: Mapping[str, Any],
    last_checkpoint: Mapping[str, Any] | None,
    validation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The server-side-apply body: the RLJob's identity and only the status fields the runtime owns.

    The dicts may use camelCase (as in the CRD) or snake_case (as in api/status.py); they are
    validated by the api models, so a typo fails here and not as a silently dropped field.
    """
    status: dict[str, Any] = {
        "progress": Progress.model_validate(dict(progress)).to_manifest(),
        "metrics": Metrics.model_validate(dict(metrics)).to_manifest(),
    }
    if last_checkpoint is not None:
        status["lastCheckpoint"] = CheckpointRef.model_validate(dict(last_checkpoint)).to_manifest()
    if validation is not None:
        status["validation"] = Validation.model_validate(dict(validation)).to_manifest()
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }


def status_url(base_url: str, name: str, namespace: str) -> str:
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
    return f"{base_url.rstrip('/')}{path}?{query}"


class StatusPublisher:
    """Console-only (does nothing) outside Kubernetes; see `from_environment`."""

    def publish(
        self,
        progress: Mapping[str, Any],
        metrics: Mapping[str, Any],
        last_checkpoint: Mapping[str, Any] | None,
        validation: Mapping[str, Any] | None = None,
    ) -> None:
        """Hand over the latest progress (validation: the step's scores, if it validated); returns at once."""

    def close(self, timeout: float = 5.0) -> None:
        """Send what is still pending (best effort, at most `timeout` seconds) and stop."""

    @staticmethod
    def from_environment(
        env: Mapping[str, str] | None = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR
    ) -> "StatusPublisher":
        """A KubernetesStatusPublisher inside an operator-started pod, else the no-op publisher."""
        env = os.environ if env is None else env
        name, namespace = env.get("KUBERL_JOB_NAME"), env.get("KUBERL_JOB_NAMESPACE")
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        token, authority = service_account_dir / "token", service_account_dir / "ca.crt"
        if not (name and namespace and host and token.is_file() and authority.is_file()):
            return StatusPublisher()
        host = f"[{host}]" if ":" in host else host  # IPv6 service address
        context = ssl.create_default_context(cafile=str(authority))
        return KubernetesStatusPublisher(name, namespace, f"https://{host}:{port}", token, context)


class KubernetesStatusPublisher(StatusPublisher):
    """Applies status.progress/metrics/lastCheckpoint of one RLJob from a background thread."""

    def __init__(
        self,
        name: str,
        namespace: str,
        base_url: str,
        token_file: Path | None,
        ssl_context: ssl.SSLContext | None,
        min_interval: float = 5.0,
        log_interval: float = 60.0,
        request_timeout: float = 10.0,
    ) -> None:
        self.name, self.namespace = name, namespace
        self.url = status_url(base_url, name, namespace)
        self.token_file = token_file
        self.ssl_context = ssl_context
        self.min_interval, self.log_interval, self.request_timeout = min_interval, log_interval, request_timeout
        self._pending: dict[str, Any] | None = None
        self._validation: Mapping[str, Any] | None = None
        self._wake = threading.Condition()
        self._closing = False
        self._last_sent = -float("inf")
        self._last_logged = -float("inf")
        self._failures_unlogged = 0
        self._thread = threading.Thread(target=self._run, name="kuberl-status", daemon=True)
        self._thread.start()

    def publish(
        self,
        progress: Mapping[str, Any],
        metrics: Mapping[str, Any],
        last_checkpoint: Mapping[str, Any] | None,
        validation: Mapping[str, Any] | None = None,
    ) -> None:
        # the latest scores go with every apply: a field the manager stops sending is removed
        self._validation = validation if validation is not None else self._validation
        try:
            body = apply_patch(self.name, self.namespace, progress, metrics, last_checkpoint, self._validation)
        except ValueError as error:  # a caller's bug, reported like a failed request: training goes on
            self._report_failure(f"invalid status values: {error}")
            return
        with self._wake:
            self._pending = body
            self._wake.notify()

    def close(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closing:
                    self._wake.wait()
                wait = self._last_sent + self.min_interval - time.monotonic()
                if wait > 0 and not self._closing:
                    self._wake.wait(wait)  # newer values may replace the pending ones meanwhile
                    continue
                body, self._pending = self._pending, None
                if body is None:  # closing, nothing left
                    return
            self._last_sent = time.monotonic()
            self._send(body)

    def _send(self, body: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"}
        try:
            if self.token_file is not None:  # re-read every time: projected tokens are rotated
                headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
            # JSON is YAML: the apply-patch+yaml content type takes it as is.
            request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="PATCH")
            with urllib.request.urlopen(request, timeout=self.request_timeout, context=self.ssl_context) as response:
                response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            self._report_failure(f"HTTP {error.code} from {self.url}: {detail}")
        except (OSError, ValueError) as error:
            self._report_failure(f"{type(error).__name__}: {error}")

    def _report_failure(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_logged < self.log_interval:
            self._failures_unlogged += 1
            return
        suppressed = (
            f" ({self._failures_unlogged} more failures since the last report)" if self._failures_unlogged else ""
        )
        log.warning("could not publish progress to RLJob %s/%s: %s%s", self.namespace, self.name, what, suppressed)
        self._last_logged, self._failures_unlogged = now, 0
