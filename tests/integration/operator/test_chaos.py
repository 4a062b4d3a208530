"""Chaos: SIGKILL the operator at random moments while 50 RLJobs reconcile; it must still end with exactly
one RayJob per RLJob and every status converged.

The operator runs as a real `kuberl operator` subprocess (cwd outside the repo, so the repo's
`operator/` folder cannot shadow the standard library's `operator` module) watching only this
test's `chaos-*` namespace. A fake KubeRay thread gives each new RayJob a status: Running for
even-numbered jobs, Initializing for odd ones, so the RLJobs must end Running and Starting.
The moments are drawn from a seeded generator, so a failure replays.
"""

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kuberl.operator import names
from kuberl.operator.kube import Kube
from tests.integration.envtest import ControlPlane, free_port
from tests.integration.operator.conftest import Cluster, tiny_spec, wait_for
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration

JOBS = 50
KILLS = 5
SEED = 20250101
#: Creation is spread over the kills (50 x 0.12 s = 6 s), so every kill lands while passes are in flight.
CREATE_EVERY_SECONDS = 0.12


def start_operator(namespace: str, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBERL_RESYNC_SECONDS": "1",
        "KUBERL_RECONCILE_WORKERS": "8",
        "KUBERL_RUNTIME_IMAGE": "registry.test/kuberl-runtime:chaos",
        "KUBERL_KUBERAY_NAMESPACE": KUBERAY.namespace,
    }
    command = [sys.executable, "-m", "kuberl", "operator", "--namespace", namespace]
    command += ["--metrics-port", str(free_port())]
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)


def expected_phase(job: str) -> str:
    return "Running" if int(job.rsplit("-", 1)[1]) % 2 == 0 else "Starting"


class FakeKubeRay(threading.Thread):
    """Gives every RayJob without a status the status KubeRay would report for its job, and records names."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(name="fake-kuberay", daemon=True)
        self.cluster, self.stop, self.seen = cluster, threading.Event(), set[str]()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for name, rayjob in self.cluster.rayjobs().items():
                    self.seen.add(name)
                    if rayjob.get("status"):
                        continue
                    job = rayjob["metadata"]["labels"][names.JOB_LABEL]
                    if expected_phase(job) == "Running":
                        self.cluster.kuberay(name, "Running", "RUNNING")
                    else:
                        self.cluster.kuberay(name, "Initializing")
            except Exception:  # noqa: BLE001, S110 - a RayJob deleted under our feet: look again
                pass
            time.sleep(0.2)


def converged(cluster: Cluster, jobs: list[str]) -> bool:
    rayjobs = cluster.rayjobs()
    for job in jobs:
        status = cluster.status(job)
        if status.get("rayJobName") != f"{job}-0" or status.get("phase") != expected_phase(job):
            return False
    return sorted(rayjobs) == sorted(f"{job}-0" for job in jobs)


def test_killing_the_operator_at_random_moments_never_duplicates_a_rayjob(kube: Kube, control_plane: ControlPlane):
    rng = random.Random(SEED)
    namespace = f"chaos-{secrets.token_hex(3)}"
    control_plane.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    cluster = Cluster(kube, namespace)
    jobs = [f"job-{index:02d}" for index in range(JOBS)]
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-chaos-"))
    log = workdir / "operator.log"
    kuberay = FakeKubeRay(cluster)
    kuberay.start()

    def create_all() -> None:
        for job in jobs:
            cluster.create(job, tiny_spec())
            time.sleep(CREATE_EVERY_SECONDS)

    creator = threading.Thread(target=create_all, name="creator")
    process = start_operator(namespace, workdir, log)
    try:
        creator.start()
        kills = []
        for _ in range(KILLS):
            moment = rng.uniform(0.5, 2.5)
            time.sleep(moment)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            kills.append((round(moment, 2), len(cluster.rayjobs())))
            process = start_operator(namespace, workdir, log)
        creator.join(60)
        try:
            wait_for(lambda: converged(cluster, jobs), timeout=90, what=f"convergence after kills at {kills}")
        except AssertionError:
            print(log.read_text(errors="replace")[-4000:])  # noqa: T201 - the operator's last words
            raise
        print("kills (after s, RayJobs then):", kills)  # noqa: T201
        # The fake KubeRay looks every 0.2 s, so an odd job's RayJob (Starting needs no status) can converge
        # before it is looked at: stop it, then count what exists now with what it saw on the way.
        kuberay.stop.set()
        kuberay.join(10)
        seen = kuberay.seen | set(cluster.rayjobs())
        assert seen == {f"{job}-0" for job in jobs}, "a RayJob other than <job>-0 existed at some point"
    finally:
        process.kill()
        process.wait(timeout=10)
        kuberay.stop.set()
        kuberay.join(10)
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}")
        shutil.rmtree(workdir, ignore_errors=True)
