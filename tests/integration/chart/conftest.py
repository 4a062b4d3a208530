"""The chart installed into a real API server, and the operator running as the chart's ServiceAccount only.

`installation` (module-scoped, once per `rbac.scope`) does what `helm install` does: the chart's CRDs
from crds/, then every object Helm renders from the templates (helm-python-sdk: Helm's own engine),
applied with the kubernetes client as the cluster admin. It then asks the API server for a real
ServiceAccount token (TokenRequest, what the kubelet mounts into a pod) for the operator (the tests
ask for each job's own runtime token the same way), and runs the operator in-process (as
tests/integration/operator/conftest.py does) with the rendered Deployment's command line and
environment, authenticated with the operator's token alone,
serving the webhook with the certificate from the chart's Secret (written to files, as the kubelet
mounts it). The API server reaches the webhook through the chart's own ValidatingWebhookConfiguration
and Service: an Endpoints object (the endpoints controller's job, which does not run here) points the
Service at this machine's address, and the API server routes to it (--enable-aggregator-routing),
verifying the certificate for the Service's DNS name as it would in a cluster.

Its namespaces are `chart-*`, never `op-*`: the operator tests' own operator watches those.
"""

import asyncio
import base64
import contextlib
import logging
import secrets
import socket
import threading
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.cli import build_parser
from kuberl.operator.main import Operator, build_operator, serve
from kuberl.operator.settings import OperatorSettings
from tests.integration.envtest import ControlPlane, control_plane, free_port, kubeconfig_for, wait_until  # noqa: F401
from tests.unit.chart.rendering import container_env, crd_files, one, operator_container, render

pytestmark = pytest.mark.integration

RELEASE = "kuberl"
FIELD_MANAGER = "helm"


@dataclass
class Installation:
    """One `helm install` of the chart and the operator running with its identity."""

    scope: str
    release_namespace: str
    jobs_namespace: str
    objects: list[dict[str, Any]]
    settings: OperatorSettings
    webhook_configuration: str
    service_account: str
    operator_token: str
    folder: Path
    running: "RunningOperator"
    logs: list[logging.LogRecord] = field(default_factory=list)

    @property
    def operator(self) -> Operator:
        assert self.running.operator is not None, "the operator is stopped"
        return self.running.operator


class RunningOperator:
    """The operator in a thread of its own, as the Deployment's pod would run it; stop() and start() again."""

    def __init__(self, settings: OperatorSettings, kubeconfig: Path, name: str) -> None:
        self.settings, self.kubeconfig, self.name = settings, kubeconfig, name
        self.operator: Operator | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._environment = pytest.MonkeyPatch()

    def start(self) -> None:
        # The operator reads its credentials as in a pod, from KUBECONFIG: the ServiceAccount's, while it runs
        # (kopf logs in from its own thread after the start).
        self._environment = pytest.MonkeyPatch()
        self._environment.setenv("KUBECONFIG", str(self.kubeconfig))
        built = self.operator = build_operator(self.settings)
        self._stop, ready = threading.Event(), threading.Event()
        stop = self._stop
        self._thread = threading.Thread(
            target=lambda: asyncio.run(serve(built, stop_flag=stop, ready_flag=ready)), name=self.name, daemon=True
        )
        self._thread.start()
        assert ready.wait(30), "the operator did not start"

    def stop(self) -> None:
        """A clean shutdown (what SIGTERM does to the pod)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.operator is not None:
            self.operator.close()
        self.operator, self._thread = None, None
        self._environment.undo()


class Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def admin_client(cp: ControlPlane) -> Any:
    from kubernetes import config
    from kubernetes.dynamic import DynamicClient

    # its discovery cache beside the API server's files, not one more osrcp-<hash>.json in /tmp per server
    cache = cp.workdir / "discovery-cache.json"
    return DynamicClient(config.new_client_from_config(config_file=str(cp.kubeconfig)), cache_file=str(cache))


def helm_apply(client: Any, objects: list[dict[str, Any]]) -> None:
    """Server-side apply of each object, in order, as the release's manager."""
    for obj in objects:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        client.server_side_apply(resource, body=obj, field_manager=FIELD_MANAGER, force_conflicts=True)


def helm_install_crds(client: Any, crds: list[dict[str, Any]]) -> None:
    """What Helm does with crds/: create each CRD that is absent, never change one that exists."""
    from kubernetes.dynamic.exceptions import ConflictError

    resource = client.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    for crd in crds:
        try:
            client.create(resource, body=crd)
        except ConflictError:
            pass  # installed already (the session's control plane starts with it)


def chart_crds() -> list[dict[str, Any]]:
    """The CRDs of the chart's crds/ folder."""
    return [doc for path in crd_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def service_account_token(cp: ControlPlane, namespace: str, name: str) -> str:
    """A bound token from the TokenRequest API, as the kubelet would project it into a pod."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    answer = cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
    return str(answer["status"]["token"])


def create_namespace(cp: ControlPlane, name: str) -> None:
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def this_machines_address() -> str:
    """A non-loopback IPv4 address of this machine: Endpoints may not point at 127.0.0.0/8."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address for the webhook's Endpoints")
    return address


def mount_secret(secret: dict[str, Any], folder: Path) -> Path:
    """The Secret's keys as files, as the kubelet mounts a Secret volume."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in secret["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


def operator_settings(objects: list[dict[str, Any]], tls: Path, address: str) -> OperatorSettings:
    """The settings `kuberl operator` builds from the rendered container; the certificate files are under `tls`."""
    container = operator_container(objects)
    args = build_parser().parse_args(["operator", *container["args"]])
    rendered = OperatorSettings.from_env(
        container_env(container),
        namespaces=args.namespace,
        metrics_port=args.metrics_port,
        webhook_port=args.webhook_port,
    )
    assert rendered.webhook_port is not None, "the chart's default values serve the webhook"
    assert rendered.webhook_cert is not None and rendered.webhook_key is not None
    return replace(
        rendered,
        resync_seconds=1.0,
        workers=4,
        metrics_port=free_port(),
        webhook_port=free_port(),
        webhook_addr=address,
        webhook_cert=str(tls / Path(rendered.webhook_cert).name),
        webhook_key=str(tls / Path(rendered.webhook_key).name),
    )


def route_service_here(cp: ControlPlane, service: dict[str, Any], address: str, port: int) -> None:
    """The Endpoints of `service`: this machine's address and the port the operator's webhook listens on."""
    meta = service["metadata"]
    (service_port,) = service["spec"]["ports"]
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": service_port["name"], "port": port}]}],
    }
    cp.request("POST", f"/api/v1/namespaces/{meta['namespace']}/endpoints", endpoints)


def webhook_answers(cp: ControlPlane, namespace: str) -> bool:
    """A dry-run create of an RLJob the schema accepts and the webhook refuses comes back with the webhook's words."""
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "probe"},
        "spec": {
            "models": {"actor": {"path": "tiny://demo"}},
            "data": {"train": "/data/train.jsonl"},
            "reward": {"function": "tiny_task"},
            "algorithm": {"advantageEstimator": "gae"},
        },
    }
    try:
        cp.request("POST", f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs?dryRun=All", manifest)
    except urllib.error.HTTPError as error:
        return "spec.models.critic" in error.read().decode()
    return False


CLUSTER_SCOPED = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


def uninstall(cp: ControlPlane, objects: list[dict[str, Any]], namespaces: list[str]) -> None:
    """Remove what the install made cluster-wide; the namespaces take the rest with them."""
    paths = [
        f"{CLUSTER_SCOPED[obj['kind']]}/{obj['metadata']['name']}" for obj in objects if obj["kind"] in CLUSTER_SCOPED
    ]
    paths += [f"/api/v1/namespaces/{namespace}" for namespace in namespaces]
    for path in paths:
        try:
            cp.request("DELETE", path)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise


def without_disruption_budget(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with the operator's PodDisruptionBudget off. Offline rendering assumes an API server that serves
    policy/v1; this one (1.20) serves only policy/v1beta1, which a real `helm install` picks from the cluster's
    capabilities (templates/poddisruptionbudget.yaml). The budget grants nothing and no test here reads it."""
    operator = {**values.get("operator", {}), "podDisruptionBudget": {"enabled": False}}
    return {**values, "operator": operator}


@dataclass
class ChartInstall:
    """What `helm install` left in the API server, and what the operator's pod is given to run with."""

    objects: list[dict[str, Any]]
    settings: OperatorSettings
    webhook_configuration: str
    service_account: str
    operator_token: str
    kubeconfig: Path


@contextlib.contextmanager
def chart_installed(
    cp: ControlPlane,
    values: dict[str, Any],
    *,
    release_namespace: str,
    jobs_namespace: str,
    folder: Path,
    create_namespaces: tuple[str, ...] = (),
) -> Iterator[ChartInstall]:
    """`helm install` of the chart with `values` into `release_namespace`: the objects applied, the webhook's
    Service routed to this machine's address at `settings.webhook_port`, the certificate from the chart's Secret
    in `folder/webhook-tls` and a kubeconfig with the operator's ServiceAccount token; no operator runs yet. On
    exit, everything it made is removed (both namespaces included)."""
    objects = render(without_disruption_budget(values), name=RELEASE, namespace=release_namespace)
    address = this_machines_address()
    settings = operator_settings(objects, mount_secret(one(objects, "Secret"), folder / "webhook-tls"), address)
    for namespace in create_namespaces:
        create_namespace(cp, namespace)
    client = admin_client(cp)
    try:
        helm_install_crds(client, chart_crds())
        helm_apply(client, objects)
        assert settings.webhook_port is not None
        route_service_here(cp, one(objects, "Service", f"{RELEASE}-webhook"), address, settings.webhook_port)
        service_account = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        operator_token = service_account_token(cp, release_namespace, service_account)
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(cp.server, operator_token, cp.ca_file)))
        yield ChartInstall(
            objects=objects,
            settings=settings,
            webhook_configuration=one(objects, "ValidatingWebhookConfiguration")["metadata"]["name"],
            service_account=service_account,
            operator_token=operator_token,
            kubeconfig=kubeconfig,
        )
    finally:
        uninstall(cp, objects, [release_namespace, jobs_namespace])


@contextlib.contextmanager
def installed(
    cp: ControlPlane,
    values: dict[str, Any],
    *,
    release_namespace: str,
    jobs_namespace: str,
    folder: Path,
    create_namespaces: tuple[str, ...] = (),
) -> Iterator[Installation]:
    """`chart_installed`, and the operator running in-process as the chart's ServiceAccount with the chart's
    webhook certificate."""
    logs: list[logging.LogRecord] = []
    handler = Collect(logs)
    with chart_installed(
        cp,
        values,
        release_namespace=release_namespace,
        jobs_namespace=jobs_namespace,
        folder=folder,
        create_namespaces=create_namespaces,
    ) as chart:
        for name in ("kopf", "kuberl"):
            logging.getLogger(name).addHandler(handler)
        running = RunningOperator(chart.settings, chart.kubeconfig, f"chart-operator-{release_namespace}")
        try:
            running.start()
            wait_until(
                lambda: webhook_answers(cp, jobs_namespace), timeout=30, what=f"webhook {chart.webhook_configuration}"
            )
            yield Installation(
                scope=str(values.get("rbac", {}).get("scope", "cluster")),
                release_namespace=release_namespace,
                jobs_namespace=jobs_namespace,
                objects=chart.objects,
                settings=chart.settings,
                webhook_configuration=chart.webhook_configuration,
                service_account=chart.service_account,
                operator_token=chart.operator_token,
                folder=folder,
                running=running,
                logs=logs,
            )
        finally:
            running.stop()
            for name in ("kopf", "kuberl"):
                logging.getLogger(name).removeHandler(handler)


@pytest.fixture(scope="module", params=["cluster", "namespace"])
def installation(
    control_plane: ControlPlane,  # noqa: F811 - the fixture of that name
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installation]:
    pytest.importorskip("helm_python", reason="rendering the chart needs helm-python-sdk (the dev extra)")
    scope: str = request.param
    suffix = secrets.token_hex(3)
    release_namespace, jobs_namespace = f"chart-{scope[:2]}-rel-{suffix}", f"chart-{scope[:2]}-jobs-{suffix}"
    values = {
        "rbac": {"scope": scope},
        "watchNamespaces": [jobs_namespace],
    }
    with installed(
        control_plane,
        values,
        release_namespace=release_namespace,
        jobs_namespace=jobs_namespace,
        folder=tmp_path_factory.mktemp(f"chart-{scope}"),
        create_namespaces=(release_namespace, jobs_namespace),
    ) as installation:
        yield installation
