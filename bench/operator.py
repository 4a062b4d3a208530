"""Benchmark the kuberl operator against a real API server (the envtest control plane).

    .venv/bin/python bench/operator.py [--jobs 200] [--rss-jobs 1000]

Prints three figures:

1. direct: a plain client creates, for each of N jobs, the objects the operator makes for one (built by
   the operator's own builders: the job's ServiceAccount, Role, RoleBinding, Ray token Secret,
   NetworkPolicy, report ConfigMap, spec ConfigMap and RayJob), one request after another — the floor
   for getting those objects into the API server;
2. operator: from the first `create` of N RLJobs (one client, one after another) until all N
   RayJobs exist, with `kuberl operator` running as a subprocess — and the ratio to 1;
3. the operator process's peak resident memory (VmHWM) once it manages M RLJobs, after a few
   resync rounds.

It starts its own etcd + kube-apiserver (tests/integration/envtest.py; no controller-manager: nothing
here needs garbage collection), with the RLJob CRD and the fake KubeRay CRDs, and stops them at the end.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/operator.py` puts bench/ first; tests/ lives at the root
    sys.path.append(str(REPO))

from kuberl.api import parse_rljob  # noqa: E402
from kuberl.operator import names  # noqa: E402
from kuberl.operator.access import KubeRayPeer, build_access, is_ray_token_secret, with_new_token  # noqa: E402
from kuberl.operator.builders import Owner, build_configmap, build_rayjob  # noqa: E402
from kuberl.operator.kube import Kube  # noqa: E402
from tests.integration.envtest import (  # noqa: E402
    FAKE_KUBERAY_CRDS,
    RLJOB_CRD,
    ControlPlane,
    free_port,
    start_control_plane,
)

SPEC = {
    "models": {"actor": {"path": "hf://Qwen/Qwen2.5-0.5B-Instruct"}},
    "data": {"train": "/data/train.jsonl"},
    "reward": {"function": "math_exact"},
    "resources": {"actor": {"replicas": 2, "gpus": 8}, "reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4}},
    "checkpoint": {"pvcClaimName": "ckpt"},
}
RESYNC_SECONDS = 30


def manifest(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": SPEC,
    }


def make_namespace(cp: ControlPlane, name: str) -> None:
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def count_rayjobs(kube: Kube, namespace: str) -> int:
    return len(kube.call("GET", names.rayjob_path(namespace))["items"])


def wait_rayjobs(kube: Kube, namespace: str, expected: int, timeout: float) -> float:
    """Seconds until `expected` RayJobs exist in `namespace` (polled every 50 ms)."""
    start = time.perf_counter()
    while count_rayjobs(kube, namespace) < expected:
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"only {count_rayjobs(kube, namespace)} of {expected} RayJobs after {timeout} s")
        time.sleep(0.05)
    return time.perf_counter() - start


def direct(kube: Kube, cp: ControlPlane, jobs: int) -> float:
    namespace = "bench-direct"
    make_namespace(cp, namespace)
    children = []
    for index in range(jobs):
        name = f"job-{index:04d}"
        owner = Owner(name=name, namespace=namespace, uid=f"00000000-0000-4000-8000-{index:012d}")
        job = parse_rljob(manifest(name, namespace))
        access = [
            with_new_token(c) if is_ray_token_secret(c) else c
            for c in build_access(owner, KubeRayPeer(namespace="kuberay-system"))
        ]
        children.extend(access)
        children.append(build_configmap(owner, SPEC, generation=1))
        children.append(build_rayjob(job, owner, 0, default_image="ghcr.io/kuberl/runtime:bench", generation=1))
    start = time.perf_counter()
    for child in children:
        kube.create(names.object_path(child["kind"], namespace), child)
    return time.perf_counter() - start


def start_operator(kubeconfig: Path, workdir: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERL_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    command = [sys.executable, "-m", "kuberl", "operator", "--metrics-port", str(metrics_port)]
    log = (workdir / "operator.log").open("wb")
    # cwd outside the repo: the repo's operator/ folder must not shadow the standard library's `operator`.
    return subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status")


def wait_metrics(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the operator's metrics endpoint did not come up")


def create_rljobs(kube: Kube, namespace: str, jobs: int) -> float:
    start = time.perf_counter()
    for index in range(jobs):
        kube.create(names.rljob_path(namespace), manifest(f"job-{index:04d}", namespace))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200, help="RLJobs for the timing (default 200)")
    parser.add_argument("--rss-jobs", type=int, default=1000, help="RLJobs for the memory figure (default 1000)")
    args = parser.parse_args()

    cp = start_control_plane([RLJOB_CRD, *FAKE_KUBERAY_CRDS], start_controller_manager=False)
    os.environ["KUBECONFIG"] = str(cp.kubeconfig)
    kube = Kube.from_environment()
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-bench-operator-"))
    operator = None
    try:
        direct_seconds = direct(kube, cp, args.jobs)
        print(f"direct:   the 8 objects of each of {args.jobs} jobs, plain client, one by one: {direct_seconds:.2f} s")

        port = free_port()
        operator = start_operator(cp.kubeconfig, workdir, port)
        wait_metrics(port)
        make_namespace(cp, "bench-warmup")
        kube.create(names.rljob_path("bench-warmup"), manifest("warmup", "bench-warmup"))
        wait_rayjobs(kube, "bench-warmup", 1, timeout=60)
        idle_rss = rss_mib(operator.pid)

        make_namespace(cp, "bench-timing")
        start = time.perf_counter()
        applied = create_rljobs(kube, "bench-timing", args.jobs)
        wait_rayjobs(kube, "bench-timing", args.jobs, timeout=600)
        operator_seconds = time.perf_counter() - start
        print(
            f"operator: {args.jobs} RLJobs applied in {applied:.2f} s; all {args.jobs} RayJobs existed after "
            f"{operator_seconds:.2f} s  (ratio operator/direct = {operator_seconds / direct_seconds:.2f})"
        )

        make_namespace(cp, "bench-rss")
        start = time.perf_counter()
        create_rljobs(kube, "bench-rss", args.rss_jobs)
        wait_rayjobs(kube, "bench-rss", args.rss_jobs, timeout=1200)
        settle = time.perf_counter() - start
        time.sleep(RESYNC_SECONDS + 5)  # a resync round over every job
        total = args.jobs + args.rss_jobs + 1
        print(
            f"memory:   {args.rss_jobs} more RLJobs reconciled in {settle:.1f} s; operator peak RSS (VmHWM) "
            f"{peak_rss_mib(operator.pid):.0f} MiB with {total} RLJobs (idle with 1 job: {idle_rss:.0f} MiB; "
            f"resync every {RESYNC_SECONDS} s)"
        )
    finally:
        if operator is not None:
            operator.kill()
            operator.wait(timeout=10)
        kube.close()
        cp.stop()
        print(f"operator log: {workdir / 'operator.log'}")


if __name__ == "__main__":
    main()
