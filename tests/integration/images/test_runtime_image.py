"""The CPU runtime image runs the demo as a cluster runs it: examples/tiny-grpo-cluster.yaml's head pod.

The operator's own builders render the job's RayJob and spec ConfigMap (as for `kubectl apply` of the
example, shortened to a few steps: the test needs the path to run, not the curve), and the head pod's
container runs the RayJob's entrypoint in the built image under the FAKE kubelet (kubelet_standin.py):
the image's user (uid 10001, `runAsNonRoot`), no capabilities, the spec ConfigMap at /etc/kuberl, the
checkpoint claim at /checkpoints, KubeRay's /dev/shm, and a read-only root filesystem with emptyDirs at
/tmp and /home/kuberl, set through the job's own `spec.resources.head.podTemplate`. Without a Ray address
the runtime starts Ray in the pod (KubeRay would have started it with `ray start --head`); everything else
is what the head pod of the example does, down to the prompts it reads from the image at /opt/kuberl.
"""

import copy
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.manifest import parse_rljob
from kuberl.operator.builders import Owner, build_configmap, build_rayjob
from tests.conftest import REPO
from tests.integration.images.conftest import BuiltImages
from tests.integration.images.kubelet_standin import Node, run_command

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "tiny-grpo-cluster.yaml"
NAMESPACE = "rl"
STEPS = 4
IMAGE_USER = 10001
#: What a read-only root filesystem needs beside the job's mounts (docker/Dockerfile.runtime-cpu's header).
READ_ONLY_HEAD: dict[str, Any] = {
    "spec": {
        "containers": [
            {
                "name": "ray-head",
                "securityContext": {"readOnlyRootFilesystem": True},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": "/home/kuberl"}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "home", "emptyDir": {}}],
    }
}


def shortened_example() -> dict[str, Any]:
    """The cluster example in namespace `rl`, STEPS steps with a checkpoint halfway, its head's root read-only."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    spec = manifest["spec"]
    spec["training"]["totalSteps"] = STEPS
    spec["checkpoint"]["intervalSteps"] = STEPS // 2
    spec["resources"]["head"] = {"podTemplate": copy.deepcopy(READ_ONLY_HEAD)}
    return manifest


def with_kuberay_shared_memory(pod_spec: dict[str, Any], memory_limit: str) -> dict[str, Any]:
    """What KubeRay adds to every Ray pod: an emptyDir in memory at /dev/shm for Ray's object store, as large as
    the container's memory limit (ray-operator/controllers/ray/common/pod.go, addEmptyDir "shared-mem")."""
    pod_spec = copy.deepcopy(pod_spec)
    pod_spec["volumes"].append({"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": memory_limit}})
    pod_spec["containers"][0]["volumeMounts"].append({"name": "shared-mem", "mountPath": "/dev/shm"})
    return pod_spec


def test_the_cluster_demo_trains_to_a_model_in_the_runtime_image_as_its_head_pod(
    built_images: BuiltImages, tmp_path: Path
) -> None:
    manifest = shortened_example()
    manifest["spec"]["image"] = built_images.runtime_cpu  # the example names the image `make images` builds
    job = parse_rljob(manifest, str(EXAMPLE))
    owner = Owner(job.metadata.name, NAMESPACE, "uid-of-tiny-grpo")
    configmap = build_configmap(owner, manifest["spec"], generation=1)
    rayjob = build_rayjob(job, owner, 0, default_image="unused:chart-default", generation=1)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (container,) = head["containers"]
    assert container["image"] == built_images.runtime_cpu
    pod_spec = with_kuberay_shared_memory(head, container["resources"]["limits"]["memory"])

    claim = tmp_path / "claim"
    claim.mkdir()
    claim.chmod(0o777)  # a fresh volume the pod's user may write (what fsGroup or the provisioner grants)
    node = Node(
        claims={manifest["spec"]["checkpoint"]["pvcClaimName"]: claim},
        configmaps={configmap["metadata"]["name"]: configmap["data"]},
    )
    name = f"kuberl-test-head-{tmp_path.name[-12:].lower()}"
    image, engine = built_images.runtime_cpu, built_images.engine
    command = run_command(engine, pod_spec, "ray-head", image=image, node=node, scratch=tmp_path, name=name)
    command[command.index(image) + 1 :] = shlex.split(rayjob["spec"]["entrypoint"])
    command.insert(2, "--rm")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    finally:
        subprocess.run([built_images.engine, "rm", "--force", "--ignore", name], capture_output=True)
    assert done.returncode == 0, f"{shlex.join(command)}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"

    job_folder = claim / NAMESPACE / "tiny-grpo"  # <claim>/<namespace>/<name>: the README's layout on a claim
    steps = [json.loads(line)["step"] for line in (job_folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    assert (job_folder / "checkpoints" / "latest").exists()
    model = job_folder / "model"
    assert model.stat().st_uid == IMAGE_USER, "the model was not written by the image's non-root user"
    assert_model_answers(model)


def assert_model_answers(model: Path) -> None:
    """The exported model loads with transformers outside the image and answers the demo's prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    network = AutoModelForCausalLM.from_pretrained(model)
    prompt = tokenizer("count: 3 4 5", return_tensors="pt")
    output = network.generate(**prompt, max_new_tokens=4, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.split(), f"the exported model answered {answer!r}"
