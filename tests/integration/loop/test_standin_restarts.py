"""The KubeRay stand-in's restart of a pod whose `ray start` gave up (tests/integration/kuberay_standin.py): under
load, `ray start` ends when its node took longer than Ray's fixed 30 s to register with the head's GCS, and the
node often registers just after. The GCS then counts that node alive until it misses its health checks, with the
same resources as the pod started again. A job submitted meanwhile can be placed on it, and fails with "health
check failed due to missing too many heartbeats" (seen once in a fresh-clone run, as a restart of a loop job).
The stand-in provokes that on purpose here: the worker's first start ends just after its node registered.
"""

import secrets
import shlex
import textwrap

import pytest

from kuberl.operator import names
from tests.integration.envtest import ControlPlane, control_plane, wait_until  # noqa: F401
from tests.integration.kuberay_standin import KubeRayStandIn

pytestmark = [pytest.mark.integration]

#: What the job checks once it runs: every node the GCS counts alive is one of the cluster's two pods, and a
#: task that needs the worker group's resource runs.
ENTRYPOINT = textwrap.dedent(
    """
    import ray
    ray.init()
    alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    print("alive nodes:", len(alive), flush=True)

    @ray.remote(num_cpus=0, resources={"kuberl_actor": 1})
    def where():
        return ray.get_runtime_context().get_node_id()

    print("the actor's task ran on", ray.get(where.remote(), timeout=120), flush=True)
    assert len(alive) == 2, f"the job started beside a node that is no pod's: {len(alive)} alive, 2 pods"
    """
)


def container(name: str) -> dict[str, object]:
    return {"name": name, "image": "kuberl", "resources": {"requests": {"cpu": "1"}}}


def rayjob(name: str) -> dict[str, object]:
    pod = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": f"python -c {shlex.quote(ENTRYPOINT)}",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {"spec": {**pod, "containers": [container("ray-head")]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "actor",
                        "replicas": 1,
                        "rayStartParams": {"resources": '"{\\"kuberl_actor\\": 1}"'},
                        "template": {"spec": {**pod, "containers": [container("ray-worker")]}},
                    }
                ],
            },
        },
    }


def test_a_job_starts_only_once_the_node_of_a_pod_that_failed_its_start_is_gone(control_plane: ControlPlane):  # noqa: F811
    namespace = f"standin-{secrets.token_hex(3)}"
    control_plane.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    try:
        with KubeRayStandIn(control_plane, {namespace}, fail_first_start=frozenset({"actor"})) as standin:
            control_plane.request("POST", names.rayjob_path(namespace), rayjob("restarted"))

            def finished() -> dict[str, object] | None:
                status = control_plane.request("GET", names.rayjob_path(namespace, "restarted")).get("status") or {}
                return status if status.get("jobDeploymentStatus") in ("Complete", "Failed") else None

            status = wait_until(finished, timeout=300, what="the RayJob finished")
            log = standin.driver_log(namespace, "restarted")
            failed = [problem for problem in standin.problems if "this start fails on purpose" in problem]
            assert failed and "ended before it was ready" in failed[0], standin.problems
            # what its raylet logged on the pod's private /tmp, which went with the pod, to tell why a start failed
            assert "the last lines of the pod's /tmp/ray/session_latest/logs/raylet.out" in failed[0], failed[0]
            assert status["jobStatus"] == "SUCCEEDED", f"{status}\n{log}"
            assert "alive nodes: 2" in log, log
    finally:
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}")
