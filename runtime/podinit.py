"""A worker pod's first process: KubeRay's `ray start`, ended at once when the pod is stopping and its head is gone.

    python -m kuberl.runtime.podinit        # in a worker pod; KubeRay puts `ray start ...` in KUBERAY_GEN_RAY_START_CMD

Kubernetes stops a pod with SIGTERM. `ray start --block` then marks its node draining in the head's GCS and keeps
the node's processes for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (the job's stop window), so the driver can save the
step under way (checkpoint/preemption.py). But when the RayCluster is deleted (a suspend, a spec change, the RLJob
deleted) every pod gets SIGTERM at about the same time, and a head that ends first takes the GCS with it: a
worker whose drain request comes later waits the whole window for a GCS that is gone, and one whose drain was under
way keeps its node until its raylet gives up on the GCS (60 s). Ray 2.60, python/ray/_private/node.py
`_drain_node_before_shutdown`: measured on this machine with two `ray start --block` nodes and a 60 s window, a
worker told to stop after its head had ended took 60.6 s ("Timed out while waiting for GCS to become available").
The pod holds its node (its GPUs) all that time, and the job's next RayJob waits for it.

So the operator runs this instead of `ray start` in worker pods (KubeRay's `ray.io/overwrite-container-cmd`): it
runs KubeRay's command as KubeRay would (its open-files limit, then the command, split as bash would split it:
KubeRay builds it from the operator's rayStartParams, which hold constants and a JSON resource, no `$` to expand),
passes SIGTERM on, and from then on checks once a second whether the head's GCS (RAY_ADDRESS, which KubeRay sets
in every Ray container) still takes connections. KubeRay's head Service publishes a head that is stopping, so the
check holds while the head drains. Once it has failed GCS_GONE_CHECKS times in a row there is no driver left to save
anything and no GCS to drain with: it kills the node's processes and exits. Until the pod is asked to stop it only
waits: a head lost mid-run is Ray's to notice, as without it. Standard library only: it starts before anything else.
"""

import logging
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

log = logging.getLogger("kuberl.podinit")

#: KubeRay's generated `ray start ...` (common/pod.go `setContainerEnvVars`), set in every Ray container.
RAY_START_COMMAND_ENV = "KUBERAY_GEN_RAY_START_CMD"
#: The head's GCS, host:port (KubeRay's RAY_ADDRESS; a worker's names the head's Service).
GCS_ADDRESS_ENV = "RAY_ADDRESS"
#: KubeRay runs `ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}` before `ray start` (common/pod.go `BuildPod`).
OPEN_FILES_ENV = "RAY_START_ULIMIT_OPEN_FILES"
DEFAULT_OPEN_FILES = 65536
#: Checks of the GCS in a row that must fail before the head counts as gone (one a second), so that a connection
#: refused once, under load, does not cut a drain short.
GCS_GONE_CHECKS = 3
CHECK_SECONDS = 1.0
#: How long one check may wait for a connection.
CONNECT_TIMEOUT_SECONDS = 1.0


def gcs_reachable(address: str) -> bool:
    """Whether the GCS at host:port takes a TCP connection now (a name that no longer resolves: it does not)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_SECONDS):
            return True
    except (OSError, ValueError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process started under `pid`, however deep (`ray start` starts the raylet, which starts the workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_all(pid: int) -> None:
    """SIGKILL `pid` and everything under it: collected first, so that none is reparented out of reach."""
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def raise_open_files_limit(wanted: int) -> None:
    """KubeRay's `ulimit -n N`: soft and hard limit N; a pod not allowed that (its hard limit is lower and it may not
    raise it) keeps its limits, as bash's ulimit does, with a warning."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    except (ValueError, OSError) as error:
        log.warning(
            "could not set the open-files limit to %d (%s); keeping %s",
            wanted,
            error,
            resource.getrlimit(resource.RLIMIT_NOFILE),
        )


def run(command: str, gcs_address: str | None) -> int:
    """Run `command` and wait for it; after SIGTERM, end it once the GCS is gone. Its exit code."""
    child = subprocess.Popen([*shlex.split(command)])
    stopping: list[float] = []

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(time.monotonic())
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    failed = 0
    while child.poll() is None:
        time.sleep(CHECK_SECONDS)
        if not stopping or gcs_address is None or child.poll() is not None:
            continue
        failed = 0 if gcs_reachable(gcs_address) else failed + 1
        if failed >= GCS_GONE_CHECKS:
            waited = time.monotonic() - stopping[0]
            log.warning(
                "the head's GCS (%s) is gone %.0f s after this pod was asked to stop: nothing left to drain for, "
                "ending the node's processes now",
                gcs_address,
                waited,
            )
            kill_all(child.pid)
            child.wait()
            return 0
    return child.returncode


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = os.environ.get(RAY_START_COMMAND_ENV)
    if not command:
        log.error("%s is not set: run this as a Ray container's command under KubeRay", RAY_START_COMMAND_ENV)
        return 2
    raise_open_files_limit(int(os.environ.get(OPEN_FILES_ENV) or DEFAULT_OPEN_FILES))
    return run(command, os.environ.get(GCS_ADDRESS_ENV))


if __name__ == "__main__":
    sys.exit(main())
