"""Every command of the README's "Running on Kubernetes", run in order against a real API server.

The commands are read from the README itself, so the section cannot go stale: a command this test
does not know fails it. `kubectl` commands run with the real kubectl binary (admin credentials);
`helm install` is done as `installation` does it (Helm's own engine renders the chart with the
command's --set values, the objects are applied, and the operator runs as the chart's
ServiceAccount). Between the commands the test plays what a cluster would add: KubeRay moving the
RayJobs' status, and the runtime reporting progress with its job's own ServiceAccount token.
Pods stay Pending (there is no kubelet), which is all the model reader needs to be checked.
"""

import contextlib
import json
import re
import shlex
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.contract import RUNTIME_IMAGE_ENV
from kuberl.operator import names
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher
from tests.conftest import REPO
from tests.integration.chart.conftest import Installation, installed, service_account_token
from tests.integration.envtest import ControlPlane, wait_until
from tests.unit.chart.rendering import container_env, operator_container

pytestmark = pytest.mark.integration

README = REPO / "README.md"
SECTION = "## Running on Kubernetes"


def readme_section() -> str:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end > 0 else len(text)]


def readme_commands() -> list[str]:
    """The command lines of the section's ```sh blocks, in order (a line ending in `\\` goes on)."""
    blocks = re.findall(r"```sh\n(.*?)```", readme_section(), re.DOTALL)
    return [
        " ".join(line.strip() for line in command.split("\\\n"))
        for block in blocks
        for command in re.split(r"(?<!\\)\n", block)
        if command.strip()
    ]


def readme_watch_output() -> list[list[str]]:
    """The rows of the section's sample `kubectl get rlj -w` output, split on blanks."""
    section = readme_section()
    start = section.index("```\nNAME") + len("```\n")
    block = section[start : section.index("```", start)]
    return [line.split() for line in block.splitlines()]


class Story:
    """The cluster the README's reader talks to, and what the test plays beside the commands."""

    def __init__(self, cp: ControlPlane, folder: Path, stack: contextlib.ExitStack) -> None:
        self.cp, self.folder, self.stack = cp, folder, stack
        self.namespaces: list[str] = []  # created by the README's commands
        self.installation: Installation | None = None
        self.images: dict[str, str] = {}  # what `make images` names: operator, runtime-cpu, runtime
        self.env = {"KUBECONFIG": str(cp.kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(folder)}

    def kubectl(self, command: str) -> str:
        done = subprocess.run(shlex.split(command), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        return done.stdout

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return dict(self.cp.request("GET", path))
        except Exception:  # noqa: BLE001 - absent
            return None

    def rljob(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs/{name}") or {}

    def rayjobs(self, namespace: str) -> dict[str, dict[str, Any]]:
        items = self.cp.request("GET", f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs")["items"]
        return {item["metadata"]["name"]: item for item in items if not item["metadata"].get("deletionTimestamp")}

    def wait_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        return wait_until(
            lambda: (
                (self.rljob(namespace, name).get("status") or {}).get("phase") == phase
                and self.rljob(namespace, name)["status"]
            ),
            timeout=30,
            what=f"{name} {phase}",
        )

    def play_kuberay(self, namespace: str, rayjob: str, deployment: str, job_status: str) -> None:
        self.cp.request(
            "PATCH",
            f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{rayjob}/status",
            {"status": {"jobDeploymentStatus": deployment, "jobStatus": job_status}},
            content_type="application/merge-patch+json",
        )

    def publish(self, namespace: str, name: str, step: int, reward: float, checkpoint: dict[str, Any] | None) -> None:
        """What the runtime in the head pod writes: its report, with the job's own ServiceAccount token."""
        assert self.installation is not None
        token_file = self.folder / f"{name}-token"
        token_file.write_text(service_account_token(self.cp, namespace, names.runtime_account_name(name)))
        publisher = KubernetesStatusPublisher(
            name,
            namespace,
            self.cp.server,
            token_file,
            ssl.create_default_context(cafile=str(self.cp.ca_file)),
            configmap=names.progress_configmap_name(name),
            min_interval=0.0,
        )
        publisher.publish({"step": step, "totalSteps": 60}, {"rewardMean": reward}, checkpoint)
        publisher.close(timeout=10)


def make_images(story: Story, command: str) -> None:
    """`make images|push VAR=value ...`: make runs hack/images/build.sh with those variables (no engine is needed
    to check that), and the images get the names build.sh gives them, remembered for the commands after."""
    target, *assignments = shlex.split(command)[1:]
    variables = dict(assignment.split("=", 1) for assignment in assignments)
    planned = subprocess.run(["make", "-n", target, *assignments], cwd=REPO, capture_output=True, text=True, check=True)
    step = {"images": "build", "push": "push"}[target]
    assert f"hack/images/build.sh {step}" in planned.stdout, planned.stdout
    for name, value in variables.items():
        assert f'{name}="{value}"' in planned.stdout, f"make {target} does not pass {name} on: {planned.stdout}"
    names = subprocess.run(
        ["hack/images/build.sh", "names"],
        cwd=REPO,
        env={**story.env, **variables, "IMAGES": "operator runtime-cpu runtime"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    story.images = dict(zip(["operator", "runtime-cpu", "runtime"], names, strict=True))


def helm_install(story: Story, command: str) -> None:
    args = shlex.split(command)
    assert args[:4] == ["helm", "install", "kuberl", "charts/kuberl"], command
    values: dict[str, Any] = {}
    namespace, create, rest = "default", False, args[4:]
    while rest:
        flag = rest.pop(0)
        if flag == "--namespace":
            namespace = rest.pop(0)
        elif flag == "--create-namespace":
            create = True
        elif flag == "--set":
            key, _, value = rest.pop(0).partition("=")
            node = values
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value.strip("{}").split(",") if value.startswith("{") else value
        else:
            raise AssertionError(f"{command}: the test does not know the flag {flag}")
    jobs_namespace = story.namespaces[-1]  # the one the README created for its jobs
    story.installation = story.stack.enter_context(
        installed(
            story.cp,
            values,
            release_namespace=namespace,
            jobs_namespace=jobs_namespace,
            folder=story.folder,
            create_namespaces=(namespace,) if create else (),
        )
    )
    # The operator runs the image pushed, and jobs without spec.image get the (GPU) runtime image pushed.
    operator = operator_container(story.installation.objects)
    assert operator["image"] == story.images["operator"], (operator["image"], story.images)
    assert container_env(operator)[RUNTIME_IMAGE_ENV] == story.images["runtime"], story.images


def watch(story: Story, command: str) -> None:
    """`kubectl get rlj -w` while KubeRay starts the RayJob and the runtime reports step 20."""
    namespace = shlex.split(command)[shlex.split(command).index("-n") + 1]
    rayjob = wait_until(lambda: story.rayjobs(namespace).get("tiny-grpo-0"), timeout=30, what="RayJob tiny-grpo-0")
    assert rayjob["metadata"]["ownerReferences"][0]["name"] == "tiny-grpo"
    process = subprocess.Popen(
        shlex.split(command), cwd=REPO, env=story.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1.5)
        story.play_kuberay(namespace, "tiny-grpo-0", "Running", "RUNNING")
        story.wait_phase(namespace, "tiny-grpo", "Running")
        story.publish(namespace, "tiny-grpo", 20, 0.91, None)
        time.sleep(2.0)
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == readme_watch_output()[0], out  # the README shows the columns kubectl prints
    assert ["tiny-grpo", "Starting"] in [row[:2] for row in rows], out
    assert ["tiny-grpo", "Running", "20", "60", "0.91", "0"] in [row[:6] for row in rows], out
    for row in readme_watch_output()[1:]:  # the README's rows fit the columns
        assert row[0] == "tiny-grpo" and row[1] in ("Starting", "Running", "Succeeded"), row


def apply(story: Story, command: str) -> None:
    story.kubectl(command)
    manifest_file = shlex.split(command)[shlex.split(command).index("-f") + 1]
    (manifest,) = [doc for doc in yaml.safe_load_all((REPO / manifest_file).read_text()) if doc]
    namespace = shlex.split(command)[shlex.split(command).index("-n") + 1]
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    plural = {"RLJob": "rljobs", "PersistentVolumeClaim": "persistentvolumeclaims", "Pod": "pods"}[kind]
    group = "/apis/kuberl.io/v1alpha1" if kind == "RLJob" else "/api/v1"
    assert story.get(f"{group}/namespaces/{namespace}/{plural}/{name}"), f"{kind} {name} was not created"
    if kind == "Pod":  # the reader mounts the claim the job checkpoints to
        job = story.rljob(namespace, "tiny-grpo")
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in manifest["spec"]["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims == [job["spec"]["checkpoint"]["pvcClaimName"]]


def apply_with_image(story: Story, command: str) -> None:
    """`sed ... example.yaml | kubectl apply -n ns -f -`: the job applied names the CPU runtime image pushed."""
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=story.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    namespace = shlex.split(command)[shlex.split(command).index("-n") + 1]
    assert story.rljob(namespace, "tiny-grpo")["spec"]["image"] == story.images["runtime-cpu"]


def describe(story: Story, command: str) -> None:
    out = story.kubectl(command)
    assert "Conditions:" in out and "RayJobCreated" in out, out


def suspend(story: Story, command: str) -> None:
    namespace = shlex.split(command)[shlex.split(command).index("-n") + 1]
    story.kubectl(command)
    story.wait_phase(namespace, "tiny-grpo", "Suspended")
    wait_until(lambda: story.rayjobs(namespace) == {}, timeout=30, what="the RayJob deleted")


def resume(story: Story, command: str) -> None:
    """Resume, then let the new RayJob finish as KubeRay and the runtime would: step 60, checkpoint, model."""
    namespace = shlex.split(command)[shlex.split(command).index("-n") + 1]
    story.kubectl(command)
    wait_until(lambda: story.rayjobs(namespace).get("tiny-grpo-1"), timeout=30, what="RayJob tiny-grpo-1")
    story.play_kuberay(namespace, "tiny-grpo-1", "Running", "RUNNING")
    story.wait_phase(namespace, "tiny-grpo", "Running")
    checkpoint = {
        "step": 60,
        "uri": "/checkpoints/rl/tiny-grpo/checkpoints/step-000060",
        "time": "2025-01-01T12:00:00Z",
    }
    story.publish(namespace, "tiny-grpo", 60, 0.98, checkpoint)
    story.play_kuberay(namespace, "tiny-grpo-1", "Complete", "SUCCEEDED")
    story.wait_phase(namespace, "tiny-grpo", "Succeeded")


def last_checkpoint(story: Story, command: str) -> None:
    assert story.kubectl(command) == "/checkpoints/rl/tiny-grpo/checkpoints/step-000060\n"


def namespace_create(story: Story, command: str) -> None:
    story.kubectl(command)
    story.namespaces.append(shlex.split(command)[-1])


def validate_for_the_cluster(story: Story, command: str) -> None:
    """`kuberl validate --cluster`: the manifests pass what the webhook checks for a cluster."""
    from kuberl.cli import main

    args = [str(REPO / arg) if arg.endswith(".yaml") else arg for arg in shlex.split(command)[1:]]
    assert main(args) == 0, command


#: Each kind of command the section may hold, and what the test does with it.
HANDLERS: list[tuple[str, Callable[[Story, str], None]]] = [
    (r"^kubectl create namespace \S+$", namespace_create),
    (r"^helm install ", helm_install),
    (r"^make (images|push)( [A-Z_]+=\S+)*$", make_images),
    (r"^kubectl apply -n \S+ -f \S+$", apply),
    (r"^sed '[^']*' \S+\.yaml \| kubectl apply -n \S+ -f -$", apply_with_image),
    (r"^kubectl get rlj -n \S+ -w$", watch),
    (r"^kubectl describe rlj -n \S+ tiny-grpo$", describe),
    (r"^kubectl patch rlj -n \S+ tiny-grpo --type merge -p .*\"suspend\":true", suspend),
    (r"^kubectl patch rlj -n \S+ tiny-grpo --type merge -p .*\"suspend\":false", resume),
    (r"^kubectl get rlj -n \S+ tiny-grpo -o jsonpath=.*lastCheckpoint\.uri", last_checkpoint),
    (r"^kuberl validate --cluster( \S+\.yaml)+$", validate_for_the_cluster),
]


def handler(command: str) -> Callable[[Story, str], None]:
    found = [run for pattern, run in HANDLERS if re.search(pattern, command)]
    assert len(found) == 1, f"the README command {command!r} matches {len(found)} of this test's handlers"
    return found[0]


@pytest.fixture
def story(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Story]:
    pytest.importorskip("helm_python", reason="rendering the chart needs helm-python-sdk (the dev extra)")
    if shutil.which("kubectl", path="/usr/bin:/bin") is None:
        pytest.skip("kubectl is not installed (Debian: apt-get install kubernetes-client)")
    with contextlib.ExitStack() as stack:
        yield Story(control_plane, tmp_path, stack)


def test_every_command_of_the_section_is_one_this_test_knows():
    commands = readme_commands()
    assert len(commands) >= 10
    for command in commands:
        handler(command)


def test_the_readme_kubernetes_section_runs_against_the_api_server(story: Story):
    for command in readme_commands():
        handler(command)(story, command)
    events = story.cp.request("GET", "/api/v1/namespaces/rl/events")["items"]
    reasons = {event["reason"] for event in events if event["involvedObject"]["name"] == "tiny-grpo"}
    assert {"RayJobCreated", "SuspendedByUser", "ResumedByUser", "RayJobSucceeded"} <= reasons, reasons
    assert json.dumps(readme_section()).count("docs/gitops.md") and "docs/security.md" in readme_section()
