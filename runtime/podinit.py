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
passes SIGTERM on, and from then on checks once a second whether the head's GCS still takes connections: at the
address RAY_ADDRESS (which KubeRay sets in every Ray container; a worker's names the head's Service) resolved to
while the pod ran, looked up again every RESOLVE_SECONDS until then, so a name server or a Service that stops
listing a stopping head cannot make a live head look gone (KubeRay's headless head Service publishes a stopping
head anyway). Once the check has failed GCS_GONE_CHECKS times in a row there is no driver left to save anything
and no GCS to drain with: it kills the node's processes and exits. Until the pod is asked to stop it only waits: a
head lost mid-run is Ray's to notice, as without it. Standard library only: it starts before anything else.
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
#: How often the head's address is looked up while the pod runs (the last answer is the one checked after SIGTERM).
RESOLVE_SECONDS = 10.0

Endpoint = tuple[str, int]


def resolved(address: str) -> Endpoint | None:
    """The IP and port that host:port names now; None when it does not resolve (or is not host:port)."""
    host, _, port = address.rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    ip, number = found[0][4][:2]
    return str(ip), int(number)


def gcs_reachable(endpoint: Endpoint) -> bool:
    """Whether the GCS at `endpoint` takes a TCP connection now."""
    try:
        with socket.create_connection(endpoint, timeout=CONNECT_TIMEOUT_SECONDS):
            return True
    except OSError:
        return False


class Head:
    """Where the head's GCS is: looked up while the pod runs (`follow`), checked once it stops (`reachable`)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.endpoint = resolved(address)
        self.looked_up = time.monotonic()

    def follow(self) -> None:
        """Look the address up again when RESOLVE_SECONDS have passed; an answer replaces the last one."""
        if time.monotonic() - self.looked_up >= RESOLVE_SECONDS:
            self.endpoint = resolved(self.address) or self.endpoint
            self.looked_up = time.monotonic()

    def reachable(self) -> bool:
        """Whether the GCS takes a connection at the last address it was found at (never found: the name now)."""
        endpoint = self.endpoint or resolved(self.address)
        return endpoint is not None and gcs_reachable(endpoint)


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
    child = subprocess.Popen(shlex.split(command))
    stopping: list[float] = []

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(time.monotonic())
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    head = Head(gcs_address) if gcs_address else None
    failed = 0
    while child.poll() is None:
        time.sleep(CHECK_SECONDS)
        if head is None or child.poll() is not None:
            continue
        if not stopping:
            head.follow()
            continue
        failed = 0 if head.reachable() else failed + 1
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
