"""The operator image serves the validating webhook to a real API server, run as the chart's pod runs it.

`chart_installed` does what `helm install` does (tests/integration/chart/conftest.py) with the chart's
operator image set to the one built here; the Deployment's pod then runs in that image under the FAKE
kubelet (kubelet_standin.py): uid 10001, a read-only root filesystem, no capabilities, an emptyDir at
/tmp, the chart's webhook certificate Secret at /etc/kuberl/webhook-tls, and the ServiceAccount's token
where the kubelet mounts it (the operator logs in with in-cluster credentials, as in a pod). The API server
calls the webhook through the chart's own ValidatingWebhookConfiguration and Service. Two settings are this
machine's, as in the chart tests: the ports (the container shares this machine's network) and the address
the webhook listens on (the one the Service's Endpoints name).
"""

import secrets
import shlex
import subprocess
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kuberl.api.contract import WEBHOOK_ADDR_ENV
from tests.integration.chart.conftest import ChartInstall, chart_installed
from tests.integration.envtest import ControlPlane, control_plane, wait_until  # noqa: F401 - the fixture
from tests.integration.images.conftest import BuiltImages
from tests.integration.images.kubelet_standin import Node, run_command
from tests.unit.chart.rendering import one

pytestmark = pytest.mark.integration

RELEASE = "kuberl"


def this_machines_ports(args: list[str], chart: ChartInstall) -> list[str]:
    """The Deployment's arguments with the ports this machine has free (the chart's are the pod's own)."""
    ports = {"--metrics-port": chart.settings.metrics_port, "--webhook-port": chart.settings.webhook_port}
    return [f"{arg.split('=')[0]}={ports[arg.split('=')[0]]}" if arg.split("=")[0] in ports else arg for arg in args]


def operator_pod(chart: ChartInstall) -> dict[str, Any]:
    """The chart's operator pod, with this machine's ports and the address its Endpoints name."""
    pod_spec: dict[str, Any] = one(chart.objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    container["args"] = this_machines_ports(container["args"], chart)
    container["env"].append({"name": WEBHOOK_ADDR_ENV, "value": chart.settings.webhook_addr})
    return pod_spec


@contextmanager
def operator_running(built: BuiltImages, cp: ControlPlane, chart: ChartInstall, ns: str, folder: Path) -> Iterator[str]:
    """The operator's container, started and running; stopped (SIGTERM, as the kubelet does) and removed after."""
    pod_spec = operator_pod(chart)
    (secret_volume,) = [v for v in pod_spec["volumes"] if "secret" in v]
    api = urlsplit(cp.server)
    node = Node(
        secrets={secret_volume["secret"]["secretName"]: one(chart.objects, "Secret")["data"]},
        service_account=(str(api.hostname), int(api.port or 443), chart.operator_token, cp.ca_file.read_text(), ns),
    )
    name = f"kuberl-test-operator-{secrets.token_hex(3)}"
    image = built.operator
    command = run_command(built.engine, pod_spec, "operator", image=image, node=node, scratch=folder, name=name)
    command.insert(2, "--detach")
    started = subprocess.run(command, capture_output=True, text=True)
    assert started.returncode == 0, f"{shlex.join(command)}\n{started.stderr}"
    try:
        yield name
    finally:
        logs = subprocess.run([built.engine, "logs", name], capture_output=True, text=True).stdout
        (folder / "operator.log").write_text(logs)
        subprocess.run([built.engine, "stop", "--time", "30", name], capture_output=True)
        subprocess.run([built.engine, "rm", "--force", "--ignore", name], capture_output=True)


def dry_run_create(cp: ControlPlane, namespace: str, spec: dict[str, Any]) -> str:
    """The API server's answer to a dry-run create of an RLJob: "" when admitted, else its message."""
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "probe"}, "spec": spec}
    try:
        cp.request("POST", f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs?dryRun=All", manifest)
    except urllib.error.HTTPError as error:
        return error.read().decode()
    return ""


def lease_holder(cp: ControlPlane, namespace: str) -> str:
    lease = cp.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{RELEASE}")
    return str(lease["spec"].get("holderIdentity") or "")


def test_the_operator_image_serves_the_chart_webhook_to_the_api_server(
    built_images: BuiltImages,
    control_plane: ControlPlane,  # noqa: F811 - the fixture of that name
    tmp_path: Path,
) -> None:
    pytest.importorskip("helm_python", reason="rendering the chart needs helm-python-sdk (the dev extra)")
    suffix = secrets.token_hex(3)
    release_ns, jobs_ns = f"img-rel-{suffix}", f"img-jobs-{suffix}"
    repository, tag = built_images.operator.rsplit(":", 1)
    values = {"operator": {"image": {"repository": repository, "tag": tag}}}
    with (
        chart_installed(
            control_plane,
            values,
            release_namespace=release_ns,
            jobs_namespace=jobs_ns,
            folder=tmp_path,
            create_namespaces=(release_ns, jobs_ns),
        ) as chart,
        operator_running(built_images, control_plane, chart, release_ns, tmp_path) as container,
    ):
        assert one(chart.objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] == (
            built_images.operator
        )
        ppo_without_critic = {
            "models": {"actor": {"path": "tiny://counter"}},
            "data": {"train": "/opt/kuberl/examples/data/tiny-task.jsonl"},
            "reward": {"function": "tiny_task"},
            "algorithm": {"name": "ppo"},
            "checkpoint": {"pvcClaimName": "checkpoints"},
        }
        refusal = wait_until(
            lambda: (
                "spec.models.critic" in (answer := dry_run_create(control_plane, jobs_ns, ppo_without_critic))
                and answer
            ),
            timeout=60,
            what="the webhook in the operator's container refusing a PPO job without a critic",
        )
        assert "denied the request" in refusal, refusal  # the API server's words for a webhook's refusal
        grpo = {**ppo_without_critic, "algorithm": {"name": "grpo"}}
        assert dry_run_create(control_plane, jobs_ns, grpo) == ""
        # The reconciler side logged in from the pod's ServiceAccount token and took the chart's Lease.
        assert wait_until(lambda: lease_holder(control_plane, release_ns), timeout=60, what="the Lease's holder")
        inside = subprocess.run(
            [built_images.engine, "exec", container, "sh", "-c", "id -u; touch /probe"], capture_output=True, text=True
        )
        assert inside.stdout.split()[0] == "10001"
        assert "Read-only file system" in inside.stderr
