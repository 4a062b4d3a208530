"""The Ray a local `kuberl run` starts refuses every client without its token (issue #36, item 9).

Ray 2.60 cannot be kept off the network: its GCS, raylet and worker servers bind every interface, and a node
address of 127.0.0.1 is replaced by a reachable one (runtime/pools/launch.py `use_a_token_of_its_own` cites
the source). So the run keeps Ray's token authentication on with a token of its own; before, it set
RAY_AUTH_MODE=disabled and anyone who could reach the machine could join its Ray as a driver and run code.

The run's Ray is started by `start_ray` itself, in a child process (this session's own Ray is already up in
the pytest process), from an environment that says RAY_AUTH_MODE=disabled, as this test session's does.
Clients are real drivers in processes of their own, joining by the GCS address the run's Ray listens on.

The run starts its Ray where a `ray start` recorded another cluster's address in Ray's temp folder (the file a
plain `ray.init()` joins): before, the run joined it and failed ("When connecting to an existing cluster,
num_cpus and num_gpus must not be provided"), on any machine where someone ran `ray start`.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.runtime.jobs import DEMO

pytestmark = pytest.mark.integration

RUN = """
import json, os, sys
import ray
from kuberl.api import load_rljob_file
from kuberl.api.topology import plan_topology
from kuberl.runtime.pools.launch import start_ray

assert start_ray(None, plan_topology(load_rljob_file(sys.argv[1]).spec))
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "token": os.environ.get("RAY_AUTH_TOKEN")}), flush=True)
sys.stdin.readline()
ray.shutdown()
"""

CLIENT = """
import sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("ran", ray.get(ray.remote(lambda: 6 * 7).remote()))
"""


#: How many one-second attempts a client makes to reach the GCS (Ray's default is 20, then it gives up). A refused
#: client tries them all; the token holder, given the same few, gets in at the first.
CONNECT_ATTEMPTS = "5"


def client_env(home: Path, **auth: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    return {
        **env,
        "HOME": str(home),  # no ~/.ray/auth_token to find
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_gcs_server_port_wait_time_s": CONNECT_ATTEMPTS,  # ray/_private/node.py _init_gcs_client
        **auth,
    }


def join(gcs: str, *envs: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """One client per environment, all at once: a refused one waits out its attempts, so in turn they would add up."""
    clients = [
        subprocess.Popen([sys.executable, "-c", CLIENT, gcs], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for env in envs
    ]
    done = []
    try:
        for client in clients:
            stdout, stderr = client.communicate(timeout=180)
            done.append(subprocess.CompletedProcess(client.args, client.returncode, stdout.decode(), stderr.decode()))
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
    return done


def test_a_local_run_s_ray_is_its_own_and_refuses_a_driver_without_its_token(tmp_path: Path, ray_session) -> None:
    # A `ray start` on this machine records its cluster's address in Ray's temp folder (ray_current_cluster),
    # where a plain `ray.init()` would find it and join: here it names the session's live Ray. The run must
    # start its own all the same. A short folder: Ray's sockets go under it, and a socket path holds 107 bytes.
    ray_temp = Path(tempfile.mkdtemp(prefix="kuberl-raytmp-", dir="/tmp"))
    (ray_temp / "ray").mkdir()
    other = ray_session.get_runtime_context().gcs_address
    (ray_temp / "ray" / "ray_current_cluster").write_text(other)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": str(tmp_path),
        "RAY_TMPDIR": str(ray_temp),
    }
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, str(DEMO)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert run.stdout is not None and run.stdin is not None
        started = json.loads(run.stdout.readline())
        gcs, token = started["gcs"], started["token"]
        assert gcs != other, "the run joined the Ray that `ray start` recorded instead of starting its own"

        assert token is not None and len(token) == 64  # 32 random bytes, hex
        anonymous, guessed, holder = join(
            gcs,
            client_env(tmp_path, RAY_AUTH_MODE="disabled"),
            client_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64),
            client_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
        )
        assert anonymous.returncode != 0 and "ran 42" not in anonymous.stdout
        assert guessed.returncode != 0 and "ran 42" not in guessed.stdout
        assert holder.returncode == 0 and "ran 42" in holder.stdout, holder.stderr[-2000:]

        run.stdin.write("\n")
        run.stdin.flush()
        assert run.wait(timeout=120) == 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        shutil.rmtree(ray_temp, ignore_errors=True)
