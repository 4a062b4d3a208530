"""Two operator replicas and a Lease: SIGKILL the leader while it reconciles a burst of new RLJobs; the
standby takes over within the bound the Lease timing gives, every RLJob ends with exactly one RayJob, and
the standby wrote nothing before it held the Lease. A leader stopped with SIGTERM (a rolling update, a
drain) hands the Lease over at once instead of letting it expire.

Both replicas are real `kuberl operator` subprocesses (as in test_chaos.py) in this test's own `lease-*`
namespace, with test-sized Lease timing, authenticated as one ServiceAccount (as the Deployment's pods
are): the API server's audit log then records each request with the replica's identity in its user
agent, which is how "who wrote what, when" is read back, not from the operators' own word.
"""

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.operator.kube import Kube
from kuberl.operator.leader import lease_path
from tests.integration.envtest import ControlPlane, free_port, kubeconfig_for, wait_until
from tests.integration.operator.conftest import Cluster, tiny_spec
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration

JOBS = 24
CREATE_EVERY_SECONDS = 0.1
LEASE = "kuberl-operator"
LEASE_DURATION_SECONDS = 3
RENEW_DEADLINE_SECONDS = 2.0
RETRY_PERIOD_SECONDS = 0.5
#: From the kill to the standby holding the Lease: the standby saw the last renewal at most one retry period
#: after it was written, waits the lease duration from then, and acquires at its next try; plus the API
#: server's and a busy machine's latency.
TAKEOVER_BOUND_SECONDS = LEASE_DURATION_SECONDS + 2 * RETRY_PERIOD_SECONDS + 3.0
WRITES = {"create", "update", "patch", "delete"}


@pytest.fixture
def operator_kubeconfig(control_plane: ControlPlane, unwatched_namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig with a real token of a ServiceAccount `operator` (bound to cluster-admin for this test):
    the audit log records ServiceAccounts' requests only."""
    cp, ns = control_plane, unwatched_namespace
    cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "operator"}})
    binding = f"lease-test-{ns}"
    cp.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}],
        },
    )
    token_request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    token = cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/operator/token", token_request)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig_for(cp.server, token["status"]["token"], cp.ca_file)))
    yield path
    cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")


class Replica:
    """One `kuberl operator` process with leader election, as one pod of the chart's Deployment runs it."""

    def __init__(
        self,
        identity: str,
        namespace: str,
        kubeconfig: Path,
        workdir: Path,
        lease_duration_seconds: int = LEASE_DURATION_SECONDS,
        renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
    ) -> None:
        self.identity, self.metrics_port = identity, free_port()
        self.log = workdir / f"{identity}.log"
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "KUBERL_RESYNC_SECONDS": "2",
            "KUBERL_RECONCILE_WORKERS": "8",
            "KUBERL_RUNTIME_IMAGE": "registry.test/kuberl-runtime:lease",
            "KUBERL_KUBERAY_NAMESPACE": KUBERAY.namespace,
            "KUBERL_LEASE_NAMESPACE": namespace,
            "KUBERL_LEASE_NAME": LEASE,
            "KUBERL_LEASE_IDENTITY": identity,
            "KUBERL_LEASE_DURATION_SECONDS": str(lease_duration_seconds),
            "KUBERL_LEASE_RENEW_DEADLINE_SECONDS": str(renew_deadline_seconds),
            "KUBERL_LEASE_RETRY_PERIOD_SECONDS": str(RETRY_PERIOD_SECONDS),
        }
        command = [sys.executable, "-m", "kuberl", "operator", "--namespace", namespace]
        command += ["--metrics-port", str(self.metrics_port)]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)

    def leader_gauge(self) -> float | None:
        """kuberl_operator_leader from the replica's /metrics; None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        (line,) = [line for line in text.splitlines() if line.startswith("kuberl_operator_leader ")]
        return float(line.split()[1])

    def kill(self, how: signal.Signals = signal.SIGKILL) -> None:
        os.kill(self.process.pid, how)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def last_words(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def start_replica(unwatched_namespace: str, operator_kubeconfig: Path) -> Iterator[Callable[..., Replica]]:
    """Starts replicas of the operator in the test's namespace; stops them all after the test, showing
    their last log lines (pytest prints them when the test failed)."""
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-lease-"))
    started: list[Replica] = []

    def start(identity: str, **timing: Any) -> Replica:
        started.append(Replica(identity, unwatched_namespace, operator_kubeconfig, workdir, **timing))
        return started[-1]

    yield start
    for replica in started:
        replica.stop()
        print(f"--- {replica.identity}:\n{replica.last_words()}")  # noqa: T201
    shutil.rmtree(workdir, ignore_errors=True)


def lease_holder(kube: Kube, namespace: str) -> str | None:
    lease = kube.get(lease_path(namespace, LEASE))
    return None if lease is None else lease["spec"].get("holderIdentity")


def audit_events(cp: ControlPlane, identity: str) -> list[dict[str, Any]]:
    """The completed requests a replica sent (its user agent names its Lease identity)."""
    events = (json.loads(line) for line in cp.audit_log.read_text().splitlines())
    return [
        event
        for event in events
        if event.get("stage") == "ResponseComplete" and f"({identity})" in event.get("userAgent", "")
    ]


def moment(event: dict[str, Any], key: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event[key])


def rayjob_creates(cp: ControlPlane, namespace: str, identities: tuple[str, ...]) -> int:
    """RayJobs created (not the dry run before each create, which stores nothing: reconcile.py)."""
    return sum(
        1
        for identity in identities
        for event in audit_events(cp, identity)
        if event["verb"] == "create"
        and event["objectRef"].get("resource") == "rayjobs"
        and event["objectRef"].get("namespace") == namespace
        and event["responseStatus"]["code"] == 201
        and "dryRun=" not in event["requestURI"]
    )


def test_the_standby_takes_over_from_a_killed_leader_and_no_rayjob_is_duplicated_or_lost(
    kube: Kube, control_plane: ControlPlane, unwatched_namespace: str, start_replica: Callable[..., Replica]
):
    ns, cp = unwatched_namespace, control_plane
    cluster = Cluster(kube, ns)
    jobs = [f"job-{index:02d}" for index in range(JOBS)]
    leader = start_replica("replica-a")
    wait_until(lambda: lease_holder(kube, ns) == "replica-a", timeout=30, what="replica-a holding the Lease")
    standby = start_replica("replica-b")
    wait_until(lambda: standby.leader_gauge() == 0.0, timeout=30, what="replica-b up, as a standby")

    def create_all() -> None:
        for job in jobs:
            cluster.create(job, tiny_spec())
            time.sleep(CREATE_EVERY_SECONDS)

    creator = threading.Thread(target=create_all, name="creator")
    creator.start()
    # Kill the leader mid-reconcile: some jobs have their RayJob, the rest are being created.
    wait_until(lambda: len(cluster.rayjobs()) >= JOBS // 4, timeout=30, what="the leader creating RayJobs")
    leader.kill()
    killed_at, rayjobs_at_kill = time.monotonic(), len(cluster.rayjobs())
    assert rayjobs_at_kill < JOBS, "the kill came after the leader had finished: nothing was mid-reconcile"

    wait_until(lambda: lease_holder(kube, ns) == "replica-b", timeout=30, what="replica-b taking the Lease")
    takeover = time.monotonic() - killed_at
    assert takeover <= TAKEOVER_BOUND_SECONDS, f"took {takeover:.1f} s (bound {TAKEOVER_BOUND_SECONDS} s)"
    print(f"killed with {rayjobs_at_kill}/{JOBS} RayJobs; replica-b led after {takeover:.1f} s")  # noqa: T201
    lease = kube.get(lease_path(ns, LEASE))
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1  # a -> b, what `kubectl get lease` shows
    creator.join(30)

    def converged() -> bool:
        statuses = [cluster.status(job).get("rayJobName") for job in jobs]
        return statuses == [f"{job}-0" for job in jobs] and sorted(cluster.rayjobs()) == [f"{j}-0" for j in jobs]

    wait_until(converged, timeout=30, what=f"every one of {JOBS} RLJobs with exactly its RayJob <job>-0")
    assert standby.leader_gauge() == 1.0

    # The audit log: each RayJob created exactly once over both replicas (none created twice, whoever did it) ...
    wait_until(
        lambda: rayjob_creates(cp, ns, ("replica-a", "replica-b")) >= JOBS, timeout=10, what="the audit log written"
    )
    assert rayjob_creates(cp, ns, ("replica-a", "replica-b")) == JOBS
    # ... and replica-b wrote nothing but its Lease before it held the Lease.
    events = audit_events(cp, "replica-b")
    lease_writes = [
        e
        for e in events
        if e["objectRef"].get("resource") == "leases" and e["verb"] in WRITES and e["responseStatus"]["code"] < 300
    ]
    acquired = moment(lease_writes[0], "stageTimestamp")
    early = [
        f"{e['verb']} {e['objectRef'].get('resource')}/{e['objectRef'].get('name', '')}"
        for e in events
        if e["verb"] in WRITES
        and e["objectRef"].get("resource") != "leases"
        and moment(e, "requestReceivedTimestamp") < acquired
    ]
    assert early == []
    assert rayjob_creates(cp, ns, ("replica-b",)) > 0  # it did take over the work


def test_a_leader_stopped_with_sigterm_releases_the_lease_and_the_standby_leads_without_waiting_for_expiry(
    kube: Kube, unwatched_namespace: str, start_replica: Callable[..., Replica]
):
    ns = unwatched_namespace
    lease_duration = 60  # an expiry takeover would take a minute: a quick one can only come from the release
    timing = {"lease_duration_seconds": lease_duration, "renew_deadline_seconds": 40.0}
    leader = start_replica("replica-a", **timing)
    wait_until(lambda: lease_holder(kube, ns) == "replica-a", timeout=30, what="replica-a holding the Lease")
    standby = start_replica("replica-b", **timing)
    wait_until(lambda: standby.leader_gauge() == 0.0, timeout=30, what="replica-b up, as a standby")
    stopped_at = time.monotonic()
    leader.kill(signal.SIGTERM)  # what the kubelet sends first
    wait_until(lambda: lease_holder(kube, ns) == "replica-b", timeout=30, what="replica-b taking the Lease")
    handover = time.monotonic() - stopped_at
    assert handover < lease_duration / 4, f"took {handover:.1f} s: the Lease was not released"
    print(f"replica-b led {handover:.1f} s after SIGTERM to the leader")  # noqa: T201
    assert leader.process.returncode == 0
    assert "released the Lease" in leader.last_words()
