"""The chart installed into a real API server, and the operator running as the chart's ServiceAccount only.

`installation` (module-scoped, once per `rbac.scope`) does what `helm install` does: the chart's CRDs
from crds/, then every object Helm renders from the templates (helm-python-sdk: Helm's own engine),
applied with the kubernetes client as the cluster admin. It then asks the API server for real
ServiceAccount tokens (TokenRequest, what the kubelet mounts into a pod) for the operator and the
runtime, and runs the operator in-process (as tests/integration/operator/conftest.py does) with the
rendered Deployment's command line and environment, authenticated with the operator's token alone.
Only the webhook's address differs: loopback instead of the Service, which has no pods here.

Its namespaces are `chart-*`, never `op-*`: the operator tests' own operator watches those.
"""

import asyncio
import contextlib
import logging
import secrets
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
    runtime_token: str
    runtime_token_file: Path
    operator: Operator
    logs: list[logging.LogRecord] = field(default_factory=list)


class Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def admin_client(cp: ControlPlane) -> Any:
    from kubernetes import config
    from kubernetes.dynamic import DynamicClient

    return DynamicClient(config.new_client_from_config(config_file=str(cp.kubeconfig)))


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


def operator_settings(objects: list[dict[str, Any]]) -> OperatorSettings:
    """The settings `kuberl operator` builds from the rendered container, with the webhook on loopback."""
    container = operator_container(objects)
    args = build_parser().parse_args(["operator", *container["args"]])
    rendered = OperatorSettings.from_env(
        container_env(container),
        namespaces=args.namespace,
        metrics_port=args.metrics_port,
        webhook_port=args.webhook_port,
    )
    assert rendered.webhook_port is not None, "the chart's default values serve the webhook"
    return replace(
        rendered,
        resync_seconds=1.0,
        workers=4,
        metrics_port=free_port(),
        webhook_port=free_port(),
        webhook_host="127.0.0.1",
        webhook_addr="127.0.0.1",
        webhook_service=None,
    )


def webhook_registered(cp: ControlPlane, name: str) -> bool:
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"
    try:
        return bool(cp.request("GET", path).get("webhooks"))
    except urllib.error.HTTPError:
        return False


def uninstall(cp: ControlPlane, objects: list[dict[str, Any]], namespaces: list[str], webhook: str) -> None:
    """Remove what the install made cluster-wide; the namespaces take the rest with them."""
    paths = [
        f"/apis/admissionregistration.k8s.io/v1/{kind}/{webhook}"
        for kind in (
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
        )
    ]
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            plural = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
            paths.append(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{obj['metadata']['name']}")
    paths += [f"/api/v1/namespaces/{namespace}" for namespace in namespaces]
    for path in paths:
        try:
            cp.request("DELETE", path)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise


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
    """`helm install` of the chart with `values` into `release_namespace`, and the operator running as the chart's
    ServiceAccount; on exit, everything it made is removed (both namespaces included)."""
    objects = render(values, name=RELEASE, namespace=release_namespace)
    settings = operator_settings(objects)
    webhook = settings.webhook_configuration or ""
    for namespace in create_namespaces:
        create_namespace(cp, namespace)
    client = admin_client(cp)
    try:
        helm_install_crds(client, chart_crds())
        helm_apply(client, objects)
        service_account = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        operator_token = service_account_token(cp, release_namespace, service_account)
        runtime_token = service_account_token(cp, jobs_namespace, "kuberl-runtime")
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(cp.server, operator_token, cp.ca_file)))
        (folder / "runtime-token").write_text(runtime_token)
        logs: list[logging.LogRecord] = []
        handler = Collect(logs)
        for name in ("kopf", "kuberl"):
            logging.getLogger(name).addHandler(handler)
        with pytest.MonkeyPatch.context() as patch:
            # The operator reads its credentials as in a pod: from KUBECONFIG, now the ServiceAccount's.
            patch.setenv("KUBECONFIG", str(kubeconfig))
            built = build_operator(settings)
            stop, ready = threading.Event(), threading.Event()
            thread = threading.Thread(
                target=lambda: asyncio.run(serve(built, stop_flag=stop, ready_flag=ready)),
                name=f"chart-operator-{release_namespace}",
                daemon=True,
            )
            thread.start()
            try:
                assert ready.wait(30), "the operator did not start"
                wait_until(lambda: webhook_registered(cp, webhook), timeout=30, what=f"webhook {webhook}")
                yield Installation(
                    scope=str(values.get("rbac", {}).get("scope", "cluster")),
                    release_namespace=release_namespace,
                    jobs_namespace=jobs_namespace,
                    objects=objects,
                    settings=settings,
                    webhook_configuration=webhook,
                    service_account=service_account,
                    operator_token=operator_token,
                    runtime_token=runtime_token,
                    runtime_token_file=folder / "runtime-token",
                    operator=built,
                    logs=logs,
                )
            finally:
                stop.set()
                thread.join(30)
                built.close()
                for name in ("kopf", "kuberl"):
                    logging.getLogger(name).removeHandler(handler)
    finally:
        uninstall(cp, objects, [release_namespace, jobs_namespace], webhook)


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
        "runtime": {"namespaces": [jobs_namespace]},
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
