"""Fixtures for the operator against a real API server (tests/integration/envtest.py).

`operator` runs one in-process operator for the session (kopf.operator in a thread with its own
event loop and a stop flag): it watches the `op-*` namespaces the `namespace` fixture hands out,
resyncs every second, serves the validating webhook on a loopback port and metrics and /healthz on another. The
ValidatingWebhookConfiguration that points the API server at it is created here, as the Helm chart
would (with a URL instead of the chart's Service, which has no pods here).
The chaos test runs its own operator as a subprocess in a `chaos-*` namespace instead.
"""

import asyncio
import base64
import contextlib
import json
import secrets
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client import Configuration

from kuberl.operator import names
from kuberl.operator.kube import Kube
from kuberl.operator.main import Operator, build_operator, serve
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.webhook import WEBHOOK_ID
from tests.integration.certs import write_certificate
from tests.integration.envtest import (  # noqa: F401 - fixtures
    ControlPlane,
    control_plane,
    free_port,
    namespace,
    start_control_plane,
)
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration

RUNTIME_IMAGE = "registry.test/kuberl-runtime:test"
WEBHOOK_NAME = "test.kuberl.io"
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
#: The session operator's /healthz fails after its event loop stalls this long (test_liveness.py wedges it).
LOOP_STALL_SECONDS = 2.0


@dataclass
class RunningOperator:
    operator: Operator
    settings: OperatorSettings
    thread: threading.Thread
    stop: threading.Event


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:  # noqa: F811 - the fixture of that name
    client = Kube.from_environment()
    yield client
    client.close()


@pytest.fixture(scope="session")
def operator(
    control_plane: ControlPlane,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    certificate, key, authority = write_certificate(tmp_path_factory.mktemp("webhook-tls"), ["127.0.0.1"])
    settings = OperatorSettings(
        runtime_image=RUNTIME_IMAGE,
        resync_seconds=1.0,
        workers=8,
        namespaces=("op-*",),
        metrics_port=free_port(),
        webhook_port=free_port(),
        webhook_addr="127.0.0.1",
        webhook_cert=str(certificate),
        webhook_key=str(key),
        loop_stall_seconds=LOOP_STALL_SECONDS,
        kuberay=KUBERAY,
    )
    built = build_operator(settings)
    metrics_server = built.metrics.serve(settings.metrics_port or 0, addr="127.0.0.1", health=built.heartbeat.check)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(serve(built, stop_flag=stop, ready_flag=ready)), name="operator", daemon=True
    )
    thread.start()
    assert ready.wait(30), "the operator did not start"
    url = f"https://127.0.0.1:{settings.webhook_port}/{WEBHOOK_ID}"
    control_plane.request("POST", WEBHOOK_CONFIGURATIONS, webhook_configuration(WEBHOOK_NAME, url, authority))
    wait_for(lambda: webhook_answers(control_plane), timeout=30, what="the webhook to answer")
    yield RunningOperator(operator=built, settings=settings, thread=thread, stop=stop)
    control_plane.request("DELETE", f"{WEBHOOK_CONFIGURATIONS}/{WEBHOOK_NAME}")
    stop.set()
    thread.join(30)
    metrics_server.shutdown()
    built.close()


@contextlib.contextmanager
def own_api_server(crds: list[Path], controllers: str | None = None) -> Iterator[tuple[ControlPlane, Kube]]:
    """An API server of the test's own holding only `crds` (and, given, kube-controller-manager's `controllers`),
    and the operator's client of it as admin; for a module that plays a cluster unlike the session's."""
    if controllers is None:
        cp = start_control_plane(crds, start_controller_manager=False)
    else:
        cp = start_control_plane(crds, controllers=controllers)
    configuration = Configuration()
    kubernetes.config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
    kube = Kube(configuration)
    try:
        yield cp, kube
    finally:
        kube.close()
        cp.stop()


@pytest.fixture
def unwatched_namespace(control_plane: ControlPlane) -> Iterator[str]:  # noqa: F811
    """A namespace of the test's own that no operator of the session watches (theirs are `op-*` and `chart-*`),
    for a test that runs operators of its own; deleted afterwards."""
    name = f"own-{secrets.token_hex(3)}"
    control_plane.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


def webhook_configuration(name: str, url: str, ca: bytes) -> dict[str, Any]:
    """What charts/kuberl/templates/webhook.yaml renders, with a URL for the Service."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"validate-rljob.{name}",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "rules": [
                    {
                        "apiGroups": ["kuberl.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["rljobs"],
                        "scope": "Namespaced",
                    }
                ],
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
            }
        ],
    }


def webhook_answers(cp: ControlPlane) -> bool:
    """A dry-run create of an invalid RLJob is refused by the webhook (not by the schema)."""
    bad = rljob_manifest("probe", "default", tiny_spec(algorithm={"advantageEstimator": "gae"}))
    try:
        cp.request("POST", names.rljob_path("default") + "?dryRun=All", bad)
    except urllib.error.HTTPError as error:
        return "spec.models.critic" in error.read().decode()
    return False


def wait_for(check: Callable[[], Any], *, timeout: float = 20, what: str = "the condition") -> Any:
    """Poll until `check()` is truthy; on time-out, fail showing what it last returned."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last seen: {json.dumps(last, default=str)}")


def tiny_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "models": {"actor": {"path": "tiny://demo"}},
        "data": {"train": "/data/train.jsonl"},
        "reward": {"function": "tiny_task"},
        "runPolicy": {"maxRestarts": 1, "backoffSeconds": 0},
        "checkpoint": {"pvcClaimName": "ckpt"},  # the webhook requires storage every pod of the job shares
    }
    spec.update(changes)
    return spec


def rljob_manifest(name: str, ns: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


class Cluster:
    """What the tests do to the cluster: apply RLJobs, play KubeRay, read back."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns

    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(names.rljob_path(self.ns), rljob_manifest(name, self.ns, spec))

    def rljob(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(names.rljob_path(self.ns, name))

    def status(self, name: str) -> dict[str, Any]:
        return (self.rljob(name) or {}).get("status") or {}

    def edit_spec(self, name: str, spec_patch: dict[str, Any]) -> None:
        self.kube.call(
            "PATCH",
            names.rljob_path(self.ns, name),
            body={"spec": spec_patch},
            content_type="application/merge-patch+json",
        )

    def rayjobs(self) -> dict[str, dict[str, Any]]:
        items = self.kube.call("GET", names.rayjob_path(self.ns))["items"]
        return {item["metadata"]["name"]: item for item in items if not item["metadata"].get("deletionTimestamp")}

    def configmap(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(names.configmap_path(self.ns, names.configmap_name(name)))

    def kuberay(self, rayjob: str, deployment: str, job_status: str = "", **extra: Any) -> None:
        """Move a RayJob's status as KubeRay would."""
        status = {"jobDeploymentStatus": deployment, **({"jobStatus": job_status} if job_status else {}), **extra}
        self.kube.call(
            "PATCH",
            names.rayjob_path(self.ns, rayjob) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.kube.call("GET", names.events_path(self.ns))["items"]
        return [e for e in items if e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == "RLJob"]

    def wait_status(self, name: str, timeout: float = 20, **expected: Any) -> dict[str, Any]:
        def matches() -> dict[str, Any] | None:
            status = self.status(name)
            return status if all(status.get(key) == value for key, value in expected.items()) else None

        return wait_for(matches, timeout=timeout, what=f"{name} status {expected}")  # type: ignore[no-any-return]


@pytest.fixture
def cluster(kube: Kube, namespace: str, operator: RunningOperator) -> Cluster:  # noqa: F811
    return Cluster(kube, namespace)
