"""How long a worker pod takes to end when it is told to stop after its head has ended: Ray's `ray start --block`
alone against the same under runtime/podinit.py, as the operator's worker pods run it.

    .venv/bin/python bench/worker_stop.py              # a 30 s drain window, 2 repeats
    .venv/bin/python bench/worker_stop.py --quick      # a 10 s window, 1 repeat

The pods of a deleted RayCluster (a suspend, a spec change, a deleted RLJob) get SIGTERM together, and the head can
end first. Each repeat starts two real Ray nodes as a RayCluster's pods start them (a head, then a worker joined to
it, `RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S` the window, as the operator sets it), ends the head with SIGTERM, then
sends the worker SIGTERM and times until its first process has ended. Both layouts in turn, in the same run.
Nothing here needs Kubernetes: the pod is its first process and what it started.
"""

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kuberl.runtime import podinit

RAY = str(Path(sys.executable).parent / "ray")
READY_LINE = "Ray runtime started"
ENV = {
    **{key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"},
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ended_within(process: subprocess.Popen[bytes], timeout: float) -> float | None:
    started = time.monotonic()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - started


def one_stop(under_podinit: bool, window: int, folder: Path) -> float:
    """Seconds from the worker's SIGTERM to its end, its head having ended first."""
    port = free_port()
    env = {**ENV, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(window)}
    head_command = [RAY, "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"]
    head = subprocess.Popen(
        [*head_command, f"--temp-dir={folder}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    worker_command = [RAY, "start", "--block", f"--address=127.0.0.1:{port}", "--num-cpus=1"]
    if under_podinit:  # the operator's worker pod: podinit, with KubeRay's command and RAY_ADDRESS in env
        worker_env = {
            **env,
            podinit.RAY_START_COMMAND_ENV: shlex.join(worker_command),
            podinit.GCS_ADDRESS_ENV: f"127.0.0.1:{port}",
        }
        worker_command = [sys.executable, "-m", "kuberl.runtime.podinit"]
    else:
        worker_env = env
    worker = None
    try:
        deadline = time.monotonic() + 120
        while not podinit.gcs_reachable(("127.0.0.1", port)):
            assert time.monotonic() < deadline and head.poll() is None, "the head did not start"
            time.sleep(0.2)
        log = folder / f"worker-{under_podinit}.log"
        with log.open("wb") as output:
            worker = subprocess.Popen(worker_command, env=worker_env, stdout=output, stderr=subprocess.STDOUT)
        while READY_LINE not in log.read_text(errors="replace"):  # printed once the node registered with the GCS
            assert time.monotonic() < deadline and worker.poll() is None, "the worker did not join"
            time.sleep(0.2)
        head.send_signal(signal.SIGTERM)
        assert ended_within(head, 120) is not None, "the head did not end"
        worker.send_signal(signal.SIGTERM)
        took = ended_within(worker, window + 90)
        assert took is not None, f"the worker did not end within {window + 90} s"
        return took
    finally:
        for process in (worker, head):  # what is left of them (never `ray stop`: other Rays share the machine)
            if process is not None:
                podinit.kill_all(process.pid)
                process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=30, help="RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, seconds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a 10 s window, one repeat")
    args = parser.parse_args()
    window, repeats = (10, 1) if args.quick else (args.window, args.repeats)
    results: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="kuberl-worker-stop-") as temp:
        for _ in range(repeats):
            for under_podinit in (False, True):
                results[under_podinit].append(one_stop(under_podinit, window, Path(temp)))
    plain, guarded = min(results[False]), min(results[True])
    print(f"drain window {window} s, best of {repeats}; the worker told to stop after its head ended:")
    print("| worker pod | seconds to end | vs ray start alone |")
    print("|---|---:|---:|")
    print(f"| `ray start --block` alone (baseline) | {plain:.1f} | 1.00x |")
    print(f"| under runtime/podinit.py | {guarded:.1f} | {guarded / plain:.2f}x |")


if __name__ == "__main__":
    main()
