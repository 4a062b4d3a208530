"""A worker pod that stops mid-run (issue #36, item 5): the job saves the step in progress when it can, and
always exits resumable (75) from a committed checkpoint, naming what it lost.

Two ways a trainer rank's pod goes, on a real two-node Ray on this machine, each node a `ray start --block` of
its own as KubeRay runs them: a head offering the head's resource, and an "actor pod" offering `kuberl_actor`,
so the demo's one actor rank lands there. `kuberl run --address` runs the demo against it in a process of its
own, as KubeRay's entrypoint does.
- Evicted: SIGTERM to the actor pod's first process (what the kubelet sends), runtime/podinit.py around `ray
  start` as in the operator's worker pods, which passes it on while the head lives. Ray drains the node for
  RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (the operator sets it to the stop window) and then kills its
  processes; the driver notices the drain after the step under way, saves that step and exits 75. Before, it
  trained on until the node went, then failed (70) with nothing of those steps saved.
- Lost: the rank's process killed outright (an OOM kill, a node gone). Its shard of the step dies with it, so
  nothing of the step can be saved: the job exits 75 naming the worker and the checkpoint it resumes from.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import ray
import yaml

from kuberl.api.contract import ExitCode, ray_resource
from kuberl.api.topology import HEAD_POOL
from kuberl.runtime import podinit
from tests.integration.runtime.autoscaling_cluster import free_port, listening, stop_process_tree, wait_for
from tests.integration.runtime.jobs import DEMO, apply_changes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
ENV = {
    **{name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"},
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
#: What the actor pod's `ray start` gives its processes after SIGTERM: far more than a step and a save take.
DRAIN_WINDOW_S = 90


class RayNode:
    """One `ray start --block` (a pod's first process), started and stopped by this test and nothing else. With
    `podinit`, as a worker pod runs it (operator/builders.py): runtime/podinit.py first, with the command in
    KUBERAY_GEN_RAY_START_CMD as KubeRay hands it over and the head's address in RAY_ADDRESS."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], *, podinit_of: str | None = None) -> None:
        command = [RAY, "start", "--block", "--disable-usage-stats", *args]
        if podinit_of is not None:
            env = {**env, podinit.RAY_START_COMMAND_ENV: shlex.join(command), podinit.GCS_ADDRESS_ENV: podinit_of}
            command = [sys.executable, "-m", "kuberl.runtime.podinit"]
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def processes(self) -> list[psutil.Process]:
        try:
            return [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        stop_process_tree(self.process)


@pytest.fixture(scope="module")
def head() -> Iterator[str]:
    """The Ray head, offering the head's resource (the reward worker goes there) but no `kuberl_actor`."""
    folder = Path(tempfile.mkdtemp(prefix="kuberl-evict-"))
    ip = ray.util.get_node_ip_address()
    address = f"{ip}:{free_port()}"
    node = RayNode(
        [
            "--head", f"--port={address.rsplit(':', 1)[1]}", f"--node-ip-address={ip}", "--num-cpus=2",
            f"--resources={json.dumps({ray_resource(HEAD_POOL): 4})}", "--include-dashboard=false",
            f"--temp-dir={folder / 'ray'}",
        ],
        folder / "head.log",
        {**ENV, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
    )  # fmt: skip
    try:
        wait_for(lambda: listening(ip, int(address.rsplit(":", 1)[1])), "the head's GCS to listen", 120)
        yield address
    finally:
        node.stop()
        shutil.rmtree(folder, ignore_errors=True)


def actor_pod(head: str, log: Path) -> RayNode:
    """A pod of the actor's worker group: one rank's worth of `kuberl_actor`, its Ray under podinit."""
    return RayNode(
        [f"--address={head}", "--num-cpus=1", f"--resources={json.dumps({ray_resource('actor'): 1})}"],
        log,
        {**ENV, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(DRAIN_WINDOW_S)},
        podinit_of=head,
    )


@contextmanager
def demo_on_an_actor_pod(head: str, folder: Path, **changes: object) -> Iterator[tuple[RayNode, subprocess.Popen[str]]]:
    """The demo's job (`kuberl run --address`) with its actor rank on a pod of its own; both stopped afterwards."""
    manifest = yaml.safe_load(DEMO.read_text())
    apply_changes(
        manifest["spec"],
        {
            "data.train": str(DEMO.parent / manifest["spec"]["data"]["train"]),
            "resources.actor.replicas": 1,
            "training.totalSteps": 2000,  # far longer than the drain window: the job only ends by the pod's going
            **changes,
        },
    )
    spec = folder / "job.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    pod = actor_pod(head, folder / "actor-pod.log")
    command = [sys.executable, "-m", "kuberl.runtime", "--spec", str(spec), "--address", head]
    job = subprocess.Popen(
        [*command, "--output", str(folder / "out")], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield pod, job
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        pod.stop()


def steps_done(output: Path) -> int:
    metrics = output / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def latest_checkpoint(output: Path) -> int | None:
    latest = output / "checkpoints" / "latest"
    return int(latest.read_text().strip().removeprefix("step-")) if latest.exists() else None


def finish(job: subprocess.Popen[str], timeout_s: float) -> tuple[int, str]:
    try:
        out, err = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
        raise AssertionError(f"the job did not end within {timeout_s:g} s:\n{err[-3000:]}") from None
    return job.returncode, out + err


def test_an_evicted_worker_pod_gets_the_step_under_way_saved_and_the_job_exits_resumable(head, tmp_path):
    with demo_on_an_actor_pod(head, tmp_path, checkpoint={"intervalSteps": 1000, "exportHf": False}) as (pod, job):
        wait_for(lambda: steps_done(tmp_path / "out") >= 2 or job.poll() is not None, "two steps", 600)
        assert job.poll() is None, job.communicate()[1][-3000:]
        evicted_after = steps_done(tmp_path / "out")
        pod.process.send_signal(signal.SIGTERM)  # the kubelet stopping the pod
        code, printed = finish(job, DRAIN_WINDOW_S + 60)
    saved = latest_checkpoint(tmp_path / "out")
    assert code == ExitCode.RESUMABLE, printed[-3000:]
    assert "the node of actor worker 0 is being drained (its pod is stopping" in printed
    # intervalSteps 1000: the one checkpoint is the drain's, of the last step the job ran, and after the signal
    assert saved is not None and saved == steps_done(tmp_path / "out") >= evicted_after
    assert f"after step {saved}; saved to {tmp_path / 'out' / 'checkpoints' / f'step-{saved:06d}'}" in printed


def test_a_rank_killed_outright_ends_the_job_resumable_naming_it_and_the_checkpoint_kept(head, tmp_path):
    checkpoint = {"intervalSteps": 1, "keepLast": 2, "exportHf": False}
    with demo_on_an_actor_pod(head, tmp_path, checkpoint=checkpoint) as (pod, job):
        wait_for(lambda: (latest_checkpoint(tmp_path / "out") or 0) >= 2 or job.poll() is not None, "a save", 600)
        assert job.poll() is None, job.communicate()[1][-3000:]
        (rank,) = [p for p in pod.processes() if p.name().startswith("ray::ModelWorker")]
        rank.kill()  # an OOM kill: the rank's process, and its shards, gone at once
        code, printed = finish(job, 180)
    saved = latest_checkpoint(tmp_path / "out")
    assert code == ExitCode.RESUMABLE, printed[-3000:]
    assert "worker 0's actor died" in printed and "no save can recover" in printed
    assert saved is not None and saved >= 2
    kept = tmp_path / "out" / "checkpoints" / f"step-{saved:06d}"
    assert f"the latest checkpoint, kept: {kept} (step {saved})" in printed
