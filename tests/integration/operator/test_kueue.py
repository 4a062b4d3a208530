"""A queued RLJob (spec.queueName) through Kueue's admission and preemption, on a real API server.

Fakes, as the rest of this folder: the tests play Kueue (admitting a RayJob is setting its
`spec.suspend` to false, preempting it is setting it back to true, as Kueue's job reconciler does)
and KubeRay (the RayJob's status). The pod is real: the RayJob's own entrypoint, the runtime
reading the spec from the job's ConfigMap, runs as a process joined to the session's Ray, and
Kueue's preemption reaches it as KubeRay's would, by deleting the pod: SIGTERM.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api import contract
from kuberl.operator import names
from tests.integration.envtest import ControlPlane
from tests.integration.operator.conftest import Cluster, wait_for
from tests.integration.operator.test_operator import TABLE
from tests.integration.runtime.jobs import DEMO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE = "team-a-cpus"
STEPS = 4
EXIT_RESUMABLE = 75


def queued_demo_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEMO.read_text())["spec"]
    spec["queueName"] = QUEUE
    spec["data"]["train"] = str(DEMO.parent / spec["data"]["train"])  # the pod has no examples/ beside its spec
    spec["training"]["totalSteps"] = STEPS
    spec["resources"]["actor"]["replicas"] = 1  # one rank: the pod starts faster, and Kueue sees no difference
    # A folder both pods see stands in for the claim (the pods' --output): checkpoints and metrics.jsonl outlive
    # a pod. The relative uri puts the checkpoints in it, at <claim>/checkpoints.
    spec["checkpoint"] = {"pvcClaimName": "queued-claim", "uri": "checkpoints", "intervalSteps": 2, "exportHf": False}
    spec["runPolicy"] = {"maxRestarts": 1, "backoffSeconds": 0}
    return spec


def kueue_sets_suspend(cluster: Cluster, rayjob: str, suspend: bool) -> None:
    """What Kueue's job reconciler writes: the RayJob's spec.suspend, under its own field manager."""
    cluster.kube.call(
        "PATCH",
        names.rayjob_path(cluster.ns, rayjob) + "?fieldManager=kueue",
        body={"spec": {"suspend": suspend}},
        content_type="application/merge-patch+json",
    )


def start_pod(cluster: Cluster, rayjob: dict[str, Any], folder: Path, claim: Path, address: str) -> subprocess.Popen:
    """The head pod KubeRay would start: the RayJob's entrypoint, its spec read from the job's ConfigMap."""
    configmap = cluster.configmap("queued")
    assert configmap is not None
    folder.mkdir()
    spec_file = folder / "rljob.yaml"
    spec_file.write_text(configmap["data"][contract.SPEC_KEY])
    args = [str(spec_file) if arg == contract.SPEC_PATH else arg for arg in shlex.split(rayjob["spec"]["entrypoint"])]
    assert args[:3] == ["python", "-m", "kuberl.runtime"]
    return subprocess.Popen(
        [sys.executable, *args[1:], "--output", str(claim), "--address", address],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def steps_logged(claim: Path) -> list[int]:
    path = claim / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def operator_owns_suspend(rayjob: dict[str, Any]) -> bool:
    entries = [e for e in rayjob["metadata"].get("managedFields", []) if e["manager"] == names.FIELD_MANAGER]
    return any("f:suspend" in json.dumps(entry.get("fieldsV1", {})) for entry in entries)


def test_kueue_admits_the_job_preempts_it_and_it_resumes_from_its_checkpoint(
    cluster: Cluster,
    control_plane: ControlPlane,
    ray_session,
    tmp_path: Path,
):
    address = ray_session.get_runtime_context().gcs_address
    claim = tmp_path / "claim"
    cluster.create("queued", queued_demo_spec())

    # Created suspended, in the queue: the RLJob is Queued and kubectl shows it.
    status = cluster.wait_status("queued", phase="Queued", rayJobName="queued-0")
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForAdmission")
    rayjob = wait_for(lambda: cluster.rayjobs().get("queued-0"), what="RayJob queued-0")
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    table = control_plane.request("GET", names.rljob_path(cluster.ns, "queued"), accept=TABLE)
    columns = [column["name"] for column in table["columnDefinitions"]]
    row = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert (row["Phase"], row["Queue"]) == ("Queued", QUEUE)

    # Kueue admits it; KubeRay starts the cluster and the pod runs the entrypoint.
    kueue_sets_suspend(cluster, "queued-0", False)
    cluster.kuberay("queued-0", "Initializing")
    cluster.wait_status("queued", phase="Starting")
    first = start_pod(cluster, rayjob, tmp_path / "pod-1", claim, address)
    cluster.kuberay("queued-0", "Running", "RUNNING")
    status = cluster.wait_status("queued", phase="Running")
    admitted = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert (admitted["status"], admitted["reason"]) == ("False", "Admitted")
    # Preempted after its first step: 3 steps from the end, so it cannot finish before the signal arrives.
    wait_for(lambda: steps_logged(claim), timeout=240, what="the first pod's first step")
    live = cluster.rayjobs()["queued-0"]
    assert live["spec"]["suspend"] is False and not operator_owns_suspend(live)  # the operator leaves it to Kueue

    # Kueue preempts it: suspend again; KubeRay deletes the cluster, the pod gets SIGTERM and saves.
    kueue_sets_suspend(cluster, "queued-0", True)
    status = cluster.wait_status("queued", phase="Queued")
    preempted = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert (preempted["status"], preempted["reason"]) == ("True", "Preempted")
    first.send_signal(signal.SIGTERM)
    log, _ = first.communicate(timeout=120)
    assert first.returncode == EXIT_RESUMABLE, log
    saved = int((claim / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    assert 1 <= saved < STEPS and steps_logged(claim) == list(range(1, saved + 1)), log
    cluster.kuberay("queued-0", "Suspended")
    assert (cluster.status("queued")["restarts"], list(cluster.rayjobs())) == (0, ["queued-0"])

    # Kueue admits it again: the same RayJob, a new pod, which resumes from the checkpoint to the end.
    kueue_sets_suspend(cluster, "queued-0", False)
    cluster.kuberay("queued-0", "Initializing")
    second = start_pod(cluster, cluster.rayjobs()["queued-0"], tmp_path / "pod-2", claim, address)
    cluster.kuberay("queued-0", "Running", "RUNNING")
    cluster.wait_status("queued", phase="Running")
    log, _ = second.communicate(timeout=300)
    assert second.returncode == 0, log
    assert f"resumed from the checkpoint of step {saved}" in log
    assert steps_logged(claim) == list(range(1, STEPS + 1))
    cluster.kuberay("queued-0", "Complete", "SUCCEEDED")
    status = cluster.wait_status("queued", phase="Succeeded")
    assert status["restarts"] == 0 and os.path.exists(claim / "checkpoints" / f"step-{STEPS:06d}")
