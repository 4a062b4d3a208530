"""A reward pool on a local Ray whose own autoscaler adds and removes nodes, run as a script:

    python -m tests.integration.runtime.autoscaling_cluster     # prints one JSON line of what it saw

test_ray_autoscaler.py runs it in a child process, because the RewardPool talks to whatever Ray the process
has initialised, and the test session's own Ray (conftest.py) may already be up in the pytest process.

The cluster is Ray's fake multi-node provider (what Ray tests its autoscaler with): the head offers no CPU,
and the one worker node type offers what a reward pod offers, `{"CPU": 1, "kuberl_reward": 1}`, between 0
and 1 nodes. A node exists only while an actor asks for `kuberl_reward`, as a reward pod under the KubeRay
autoscaler.

Ray's `ray.cluster_utils.AutoscalingCluster` is not used: it reads an example yaml the wheel does not ship,
and starts and stops with `ray stop --force`, which kills every Ray on the machine (other tests', other
users'). This one starts `ray start --head --block` on a free port in its own session and stops exactly the
processes it started.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import ray

from kuberl.api.resources import RoleResources
from kuberl.api.topology import reward_group
from kuberl.runtime.pools.autoscale import ScalePolicy
from kuberl.runtime.pools.reward import RewardPool

REWARD_NODE_TYPE = "ray.worker.reward"
SLOW_REWARD = {"function": "tests.integration.runtime.slow_rewards:slow_score", "batchSize": 2}
BURST = 8  # samples: 4 batches of 2, 0.4 s each
POLICY = ScalePolicy(target_wait_s=0.2, idle_release_s=1.0)
WAIT_S = 180.0  # for a node to come or go on a loaded 2-core machine


def autoscaling_config(gcs_address: str) -> dict[str, Any]:
    """Ray's fake multi-node cluster config: a head with no CPU, and 0..1 reward nodes removed after 3 s idle."""
    return {
        "cluster_name": "kuberl-fake-multinode",
        "max_workers": 1,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            REWARD_NODE_TYPE: {
                "resources": {"CPU": 1, "kuberl_reward": 1},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 1,
            },
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.05,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class FakeMultiNodeCluster:
    """A Ray head with the autoscaler on the fake multi-node provider, started and stopped by this process."""

    def __init__(self) -> None:
        self.ip = ray.util.get_node_ip_address()
        self.address = f"{self.ip}:{free_port()}"
        self._dir = Path(tempfile.mkdtemp(prefix="kuberl-as-"))
        self._head: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self._dir / "autoscaling.json"
        config.write_text(json.dumps(autoscaling_config(self.address)))
        env = {
            **{name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"},
            "RAY_FAKE_CLUSTER": "1",  # the fake provider refuses to run without it
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
        command = [
            ray_cli, "start", "--head", "--block", f"--port={self.address.rsplit(':', 1)[1]}",
            f"--node-ip-address={self.ip}", f"--autoscaling-config={config}", "--num-cpus=0",
            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self._dir / 'ray'}",
        ]  # fmt: skip
        log = (self._dir / "head.log").open("wb")
        self._head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        host, port = self.address.rsplit(":", 1)
        wait_for(lambda: listening(host, int(port)), "the head's GCS to listen", 120.0)

    def shutdown(self) -> None:
        """Stops the head (which stops the autoscaler), then kills whatever it had started that is left:
        the fake nodes' raylets are the autoscaler's children and may outlive it."""
        if self._head is None:
            return
        stop_process_tree(self._head)
        self._head = None
        shutil.rmtree(self._dir, ignore_errors=True)


def stop_process_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `process` (a `ray start --block`), then SIGKILL to whatever it had started that is left: the
    processes this test started, and no others (never `ray stop`, which stops every Ray on the machine)."""
    try:
        started = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    _, alive = psutil.wait_procs(started, timeout=30)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=30)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.2)


def alive_nodes() -> int:
    return sum(bool(node["Alive"]) for node in ray.nodes())


def reward_units() -> float:
    return float(ray.cluster_resources().get("kuberl_reward", 0.0))


class PeakWatcher:
    """Samples the cluster's node count and `kuberl_reward` units while a burst is scored."""

    def __init__(self) -> None:
        self.nodes = 0
        self.units = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "PeakWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.nodes = max(self.nodes, alive_nodes())
            self.units = max(self.units, reward_units())
            self._stop.wait(0.1)


def observe() -> dict[str, Any]:
    """Starts a 0..1 reward pool on an empty cluster, lets it go idle, scores a burst, lets it go idle again."""
    seen: dict[str, Any] = {"nodes_at_start": alive_nodes(), "reward_units_at_start": reward_units()}
    pool = RewardPool(
        SLOW_REWARD,
        None,
        reward_group(RoleResources(replicas=1, minReplicas=0, maxReplicas=1, cpus=0.5)),
        policy=POLICY,
    )
    try:
        seen["nodes_with_first_worker"] = alive_nodes()
        wait_for(lambda: pool.size == 0 and alive_nodes() == 1, "the idle pool and its node to go")
        seen["pool_size_idle"] = pool.size
        seen["nodes_idle"] = alive_nodes()
        seen["reward_units_idle"] = reward_units()
        with PeakWatcher() as peak:
            results = pool.score(
                [f"prompt {i}" for i in range(BURST)],
                [f"response {i}" for i in range(BURST)],
                [{"index": i} for i in range(BURST)],
            )
        seen["burst_peak_nodes"] = peak.nodes
        seen["burst_peak_reward_units"] = peak.units
        seen["scores"] = [result.score for result in results]
        seen["errors"] = [result.error for result in results]
        wait_for(lambda: pool.size == 0 and alive_nodes() == 1, "the pool and its node to go after the burst")
        seen["pool_size_after_burst"] = pool.size
        seen["nodes_after_burst"] = alive_nodes()
        seen["reward_units_after_burst"] = reward_units()
        seen["metrics"] = pool.metrics()
    finally:
        pool.shutdown()
    return seen


def main() -> None:
    cluster = FakeMultiNodeCluster()
    cluster.start()
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            seen = observe()
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
    sys.stdout.write(json.dumps(seen) + "\n")


if __name__ == "__main__":
    main()
