"""The runtime's report of its progress, metrics, validation scores and last checkpoint, shown in the RLJob's status.

Inside the head pod of a job (the operator sets the job's name, namespace and report ConfigMap in the
environment, api/contract.py, and mounts the job's ServiceAccount token there only) the publisher
writes a `RuntimeReport` as JSON into the job's ConfigMap `<job>-progress` (server-side apply, the
runtime's field manager). That ConfigMap is the one object the job's ServiceAccount may write: it cannot touch
any RLJob, nor another job's report. The operator validates the report and copies it into
status.progress, .metrics, .validation and .lastCheckpoint. Anywhere else (`kuberl run` on a laptop,
tests) the publisher is a no-op.

JSON has no NaN or Infinity, and the operator would have to refuse a report holding them. A metric that
is not a finite number is left out of the report's metrics; metrics.jsonl records it as it was.

Standard library only (urllib + ssl): the runtime image does not carry the kubernetes client.
Requests go out from a background thread, at most one every `min_interval` seconds with the
newest values (older unsent ones are dropped), so a slow or absent API server never slows a
training step; failures are logged, at most once a minute, and never raised.
"""

import json
import logging
import math
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

from kuberl.api import contract
from kuberl.api.status import REPORT_KEY, Metrics, RuntimeReport
from kuberl.api.wire import request_body
from kuberl.runtime.report.telemetry import status_fields

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path(contract.SERVICE_ACCOUNT_DIR)


def status_metrics(metrics: Mapping[str, float]) -> dict[str, Any]:
    """The headline metrics of a step, keyed as status.metrics wants them (`telemetry.EXPORTS` names them);
    non-finite ones left out.

    >>> status_metrics({"reward/mean": 0.5, "kl/mean": 0.01, "time/step": 3.0})
    {'rewardMean': 0.5, 'kl': 0.01}
    >>> status_metrics({"reward/mean": float("nan"), "kl/mean": float("inf"), "response/length_mean": 9.0})
    {'responseLength': 9.0}
    """
    return Metrics.model_validate(status_fields(metrics)).to_manifest()


def apply_patch(
    configmap: str,
    namespace: str,
    progress: Mapping[str, Any],
    metrics: Mapping[str, Any],
    last_checkpoint: Mapping[str, Any] | None,
    validation: Mapping[str, Any] | None = None,
    *,
    rayjob: str | None = None,
    configuration_error: str | None = None,
    exported_model: str | None = None,
) -> dict[str, Any]:
    """The server-side-apply body: the report ConfigMap's identity and the report, as JSON under REPORT_KEY.

    The dicts may use camelCase (as in the CRD) or snake_case (as in api/status.py); they are
    validated by the api models, so a typo fails here and not as a silently dropped field.
    """
    if validation is not None and len(_finite(validation)) < len(validation):
        validation = None  # the last finite scores stay in the status
    report = RuntimeReport.model_validate(
        {
            "progress": _finite(progress),
            "metrics": _finite(metrics),
            "last_checkpoint": last_checkpoint,
            "validation": validation,
            "rayjob": rayjob,
            "exported_model": exported_model,
            "configuration_error": configuration_error[:4096] if configuration_error else None,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap, "namespace": namespace},
        "data": {REPORT_KEY: json.dumps(report.to_manifest(), sort_keys=True)},
    }


def _finite(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values without the numbers JSON cannot carry (NaN, infinities)."""
    return {k: v for k, v in values.items() if not (isinstance(v, float) and not math.isfinite(v))}


def report_url(base_url: str, configmap: str, namespace: str) -> str:
    query = urllib.parse.urlencode({"fieldManager": contract.RUNTIME_FIELD_MANAGER, "force": "true"})
    return f"{base_url.rstrip('/')}/api/v1/namespaces/{namespace}/configmaps/{configmap}?{query}"


def report_target(env: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """(job name, namespace, report ConfigMap) as the operator set them in the pod; None where not set."""
    names = (contract.JOB_NAME_ENV, contract.JOB_NAMESPACE_ENV, contract.STATUS_CONFIGMAP_ENV)
    name, namespace, configmap = (env.get(variable) or None for variable in names)
    return name, namespace, configmap


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

    def report_configuration_error(self, message: str) -> None:
        """Add to the report that the job cannot run as specified (the operator then fails it without a restart)."""

    def report_exported_model(self, uri: str) -> None:
        """Add to the report where the final model was exported (status.exportedModel)."""

    def close(self, timeout: float = 5.0) -> None:
        """Send what is still pending (best effort, at most `timeout` seconds) and stop."""

    @staticmethod
    def from_environment(
        env: Mapping[str, str] | None = None,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
        *,
        rayjob: str | None = None,
    ) -> "StatusPublisher":
        """A KubernetesStatusPublisher in the head pod of an operator-started job, else the no-op publisher."""
        env = os.environ if env is None else env
        name, namespace, configmap = report_target(env)
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        token, authority = service_account_dir / "token", service_account_dir / "ca.crt"
        if not (name and namespace and configmap and host and token.is_file() and authority.is_file()):
            return StatusPublisher()
        host = f"[{host}]" if ":" in host else host  # IPv6 service address
        context = ssl.create_default_context(cafile=str(authority))
        return KubernetesStatusPublisher(
            name, namespace, f"https://{host}:{port}", token, context, configmap=configmap, rayjob=rayjob
        )


class KubernetesStatusPublisher(StatusPublisher):
    """Applies one job's report to its ConfigMap (`configmap`, default `<name>-progress`) from a background thread."""

    def __init__(
        self,
        name: str,
        namespace: str,
        base_url: str,
        token_file: Path | None,
        ssl_context: ssl.SSLContext | None,
        configmap: str | None = None,
        min_interval: float = 5.0,
        log_interval: float = 60.0,
        request_timeout: float = 10.0,
        rayjob: str | None = None,
    ) -> None:
        self.name, self.namespace, self.rayjob = name, namespace, rayjob
        #: The last values published: a configuration error is reported beside them, not instead of them.
        self._values: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any] | None] = ({}, {}, None)
        self.configmap = configmap or f"{name}-progress"
        self.url = report_url(base_url, self.configmap, namespace)
        self.token_file = token_file
        self.ssl_context = ssl_context
        self.min_interval, self.log_interval, self.request_timeout = min_interval, log_interval, request_timeout
        self._pending: dict[str, Any] | None = None
        self._validation: Mapping[str, Any] | None = None
        self._exported_model: str | None = None
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
        self._values = (progress, metrics, last_checkpoint)
        self._hand_over()

    def report_configuration_error(self, message: str) -> None:
        self._hand_over(configuration_error=message)

    def report_exported_model(self, uri: str) -> None:
        self._exported_model = uri
        self._hand_over()

    def _hand_over(self, configuration_error: str | None = None) -> None:
        progress, metrics, last_checkpoint = self._values
        try:
            body = apply_patch(
                self.configmap,
                self.namespace,
                progress,
                metrics,
                last_checkpoint,
                self._validation,
                rayjob=self.rayjob,
                configuration_error=configuration_error,
                exported_model=self._exported_model,
            )
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
            request = urllib.request.Request(self.url, data=request_body(body), headers=headers, method="PATCH")
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
