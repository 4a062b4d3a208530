"""The I/O pass and its queue, with a fake API server: the order of writes and the coalescing of triggers."""

import asyncio
import copy
import json
import threading
from typing import Any

import pytest

from kuberl.api.status import RLJobStatus
from kuberl.operator import names
from kuberl.operator.decide import Decision
from kuberl.operator.kube import ApiError
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import (
    RETRY_BASE_SECONDS,
    RETRY_CAP_SECONDS,
    ApplyFailed,
    ReconcileQueue,
    Reconciler,
    retry_delay,
)
from tests.unit.operator.conftest import SETTINGS, at, make_rljob

JOB = names.rljob_path("team-a", "tiny-grpo")


class FakeKube:
    """Records every call; holds one RLJob and whatever was applied."""

    def __init__(self, conflicts: int = 0) -> None:
        self.rljob: dict[str, Any] | None = make_rljob()
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.conflicts = conflicts
        self.refusals: dict[str, ApiError] = {}
        self.created: list[dict[str, Any]] = []
        self.exists: set[str] = (
            set()
        )  # collections where a create answers AlreadyExists  # path -> what the API server answers to an apply there
        self.kuberay_crd_knows_auth = True  # False: a RayJob's rayClusterSpec.authOptions is pruned (KubeRay < 1.5.1)

    def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("GET", path))
        return self.rljob if path == JOB else self.objects.get(path)

    def list(self, path: str, label_selector: str, *, consistent: bool = False) -> list[dict[str, Any]]:
        self.calls.append(("LIST", path))
        key, _, value = label_selector.partition("=")
        found = [o for p, o in self.objects.items() if p.startswith(path + "/")]
        return [o for o in found if o.get("metadata", {}).get("labels", {}).get(key) == value]

    def apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("APPLY", path))
        if path in self.refusals:
            raise self.refusals[path]
        if path.endswith("/status"):
            if self.conflicts:
                self.conflicts -= 1
                raise ApiError(409, "Conflict")
            assert self.rljob is not None
            self.rljob = {**self.rljob, "status": body["status"]}
        else:
            self.objects[path] = body
        return body

    def delete(self, path: str, *, uid: str | None = None) -> bool:
        self.calls.append(("DELETE", path))
        return self.objects.pop(path, None) is not None

    def create(self, path: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        self.calls.append(("DRY RUN" if dry_run else "CREATE", path))
        full = f"{path}/{body['metadata']['name']}" if "name" in body.get("metadata", {}) else path
        if full in self.refusals:
            raise self.refusals[full]
        if path in self.exists or full in self.objects:
            raise ApiError(409, "Conflict", '{"reason": "AlreadyExists"}')
        if body.get("kind") == "RayJob" and not self.kuberay_crd_knows_auth:
            body = copy.deepcopy(body)
            del body["spec"]["rayClusterSpec"]["authOptions"]
        if dry_run:
            return body
        self.created.append(body)
        self.objects[full] = body
        return body


def reconciler(kube: FakeKube) -> Reconciler:
    return Reconciler(kube, SETTINGS, OperatorMetrics(), clock=lambda: at(0))  # type: ignore[arg-type]


def writes(kube: FakeKube) -> list[tuple[str, str]]:
    return [call for call in kube.calls if call[0] != "GET" and call[0] != "LIST"]


def test_the_status_naming_the_rayjob_is_written_before_anything_is_created():
    kube = FakeKube()
    reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert writes(kube) == [
        ("APPLY", JOB + "/status"),
        ("CREATE", names.object_path("ServiceAccount", "team-a")),
        ("CREATE", names.object_path("Role", "team-a")),
        ("CREATE", names.object_path("RoleBinding", "team-a")),
        ("CREATE", names.object_path("Secret", "team-a")),
        ("CREATE", names.object_path("NetworkPolicy", "team-a")),
        ("APPLY", names.configmap_path("team-a", "tiny-grpo-progress")),
        ("APPLY", names.configmap_path("team-a", "tiny-grpo-spec")),
        ("DRY RUN", names.rayjob_path("team-a")),  # the RayJob as it would be stored keeps token authentication
        ("CREATE", names.rayjob_path("team-a")),
    ]


def test_the_ray_token_is_made_when_the_secret_is_created_fresh_each_time():
    tokens = []
    for _ in range(2):
        kube = FakeKube()
        reconciler(kube).run_pass("team-a", "tiny-grpo")
        (secret,) = [body for body in kube.created if body["kind"] == "Secret"]
        tokens.append(secret["stringData"]["auth_token"])
    assert tokens[0] != tokens[1] and min(len(token) for token in tokens) >= 43  # 32 random bytes, base64


def test_only_the_ray_token_secret_gets_a_token_from_the_operator():
    """With an elastic pool the job also gets `<job>-runtime-token`, which Kubernetes' token controller fills."""
    kube = FakeKube()
    assert kube.rljob is not None
    kube.rljob["spec"]["resources"] = {"reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 3}}
    reconciler(kube).run_pass("team-a", "tiny-grpo")
    secrets = {body["metadata"]["name"]: body for body in kube.created if body["kind"] == "Secret"}
    assert sorted(secrets) == ["tiny-grpo-ray-token", "tiny-grpo-runtime-token"]
    assert "auth_token" in secrets["tiny-grpo-ray-token"]["stringData"]
    assert "stringData" not in secrets["tiny-grpo-runtime-token"] and "data" not in secrets["tiny-grpo-runtime-token"]


def test_objects_made_once_are_left_alone_when_they_exist():
    kube = FakeKube()
    kube.exists = {names.object_path("Secret", "team-a")}  # a Secret of this name: AlreadyExists
    reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert names.rayjob_path("team-a", "tiny-grpo-0") in kube.objects  # the pass went on


def test_a_write_conflict_reruns_the_pass_on_fresh_data():
    kube = FakeKube(conflicts=1)
    decision = reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert decision is not None and decision.status.ray_job_name == "tiny-grpo-0"
    assert [call for call in kube.calls if call == ("GET", JOB)] == [("GET", JOB), ("GET", JOB)]
    assert names.rayjob_path("team-a", "tiny-grpo-0") in kube.objects


def test_a_gone_rljob_is_a_pass_that_does_nothing():
    kube = FakeKube()
    kube.rljob = None
    assert reconciler(kube).run_pass("team-a", "tiny-grpo") is None
    assert writes(kube) == []


def test_the_pass_counts_in_the_metrics():
    kube = FakeKube()
    rec = reconciler(kube)
    rec.run_pass("team-a", "tiny-grpo")
    assert rec.metrics.registry.get_sample_value("kuberl_operator_reconciles_total") == 1
    assert rec.metrics.registry.get_sample_value("kuberl_operator_jobs", {"phase": "Starting"}) == 1


class BlockingReconciler:
    """A pass that waits for the test to let it finish, counting how often it ran."""

    def __init__(self) -> None:
        self.passes = 0
        self.release = threading.Event()

    def run_pass(self, namespace: str, name: str) -> Decision:
        self.passes += 1
        self.release.wait(5)
        return Decision(status=RLJobStatus(), write_status=False)


def test_triggers_during_a_pass_make_exactly_one_more_pass():
    blocking = BlockingReconciler()
    queue = ReconcileQueue(blocking, workers=2)  # type: ignore[arg-type]

    async def scenario() -> None:
        first = asyncio.create_task(queue.trigger("ns", "job"))
        await asyncio.sleep(0.05)
        await asyncio.gather(*(queue.trigger("ns", "job") for _ in range(5)))  # return at once: coalesced
        blocking.release.set()
        await first

    asyncio.run(scenario())
    queue.close()
    assert blocking.passes == 2


def test_a_decisions_requeue_after_schedules_the_next_pass():
    class Requeueing(BlockingReconciler):
        def run_pass(self, namespace: str, name: str) -> Decision:
            self.passes += 1
            return Decision(status=RLJobStatus(), write_status=False, requeue_after=0.05 if self.passes == 1 else None)

    requeueing = Requeueing()
    queue = ReconcileQueue(requeueing, workers=1)  # type: ignore[arg-type]

    async def scenario() -> None:
        await queue.trigger("ns", "job")
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    queue.close()
    assert requeueing.passes == 2


def test_retries_of_a_failing_pass_wait_twice_as_long_each_time_up_to_a_cap():
    delays = [retry_delay(failures) for failures in range(1, 13)]
    assert delays[:4] == [RETRY_BASE_SECONDS, 2 * RETRY_BASE_SECONDS, 4 * RETRY_BASE_SECONDS, 8 * RETRY_BASE_SECONDS]
    assert max(delays) == RETRY_CAP_SECONDS == delays[-1]
    assert retry_delay(10**6) == RETRY_CAP_SECONDS  # no overflow however long the outage


def test_a_failing_pass_is_retried_by_the_queue_with_growing_delays_and_never_raises_to_the_caller():
    class FailingTwice(BlockingReconciler):
        def run_pass(self, namespace: str, name: str) -> Decision:
            self.passes += 1
            if self.passes <= 2:
                raise ApiError(503, "Service Unavailable")
            return Decision(status=RLJobStatus(), write_status=False)

    failing = FailingTwice()
    queue = ReconcileQueue(failing, workers=1, resync_seconds=60)  # type: ignore[arg-type]
    waits: list[float] = []
    requeue = queue.requeue

    def recording(namespace: str, name: str, delay: float) -> None:
        waits.append(delay)
        requeue(namespace, name, delay / 100)  # the same order of events, a hundred times faster

    queue.requeue = recording  # type: ignore[method-assign]

    async def scenario() -> None:
        queue.request("ns", "job")  # what the handlers call: returns at once, raises nothing
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    queue.close()
    assert failing.passes == 3
    assert waits == [retry_delay(1), retry_delay(2), 60]  # two retries, then the resync interval


def test_a_status_only_change_of_an_rljob_asks_for_no_pass():
    counting = BlockingReconciler()
    counting.release.set()
    queue = ReconcileQueue(counting, workers=1)  # type: ignore[arg-type]

    async def scenario() -> None:
        for generation in (1, 1, 1, 2, 2):  # created; two status writes; a spec edit; a status write
            queue.notice("ns", "job", generation)
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
    queue.close()
    assert counting.passes == 2


QUOTA = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "message": 'rayjobs.ray.io "tiny-grpo-0" is forbidden: exceeded quota: gpus, requested: 8, limited: 4',
        "reason": "Forbidden",
        "code": 403,
    }
)


def test_a_refused_rayjob_leaves_created_false_with_the_api_servers_message_and_one_warning():
    kube = FakeKube()
    kube.refusals[names.rayjob_path("team-a", "tiny-grpo-0")] = ApiError(403, "Forbidden", QUOTA)
    with pytest.raises(ApplyFailed):  # the queue retries it with a growing delay
        reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert kube.rljob is not None
    (created,) = [c for c in kube.rljob["status"]["conditions"] if c["type"] == "Created"]
    assert (created["status"], created["reason"]) == ("False", "ApplyFailed")
    assert created["message"] == (
        "the API server refused RayJob tiny-grpo-0: "
        'rayjobs.ray.io "tiny-grpo-0" is forbidden: exceeded quota: gpus, requested: 8, limited: 4'
    )
    events = [e for e in kube.created if e["kind"] == "Event"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "ApplyFailed")]
    with pytest.raises(ApplyFailed):  # refused again: the condition stands, no second event
        reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert len([e for e in kube.created if e["kind"] == "Event"]) == 1


def test_a_rayjob_that_would_lose_token_authentication_is_not_created_and_the_job_says_kuberay_is_too_old():
    kube = FakeKube()
    kube.kuberay_crd_knows_auth = False  # KubeRay 1.4's CRD: the API server drops authOptions
    with pytest.raises(ApplyFailed):  # retried with a growing delay: a KubeRay upgrade lets it through
        reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert ("CREATE", names.rayjob_path("team-a")) not in kube.calls
    assert not [o for o in kube.created if o["kind"] == "RayJob"]
    assert kube.rljob is not None
    (created,) = [c for c in kube.rljob["status"]["conditions"] if c["type"] == "Created"]
    assert (created["status"], created["reason"]) == ("False", "KubeRayTooOld")
    assert created["message"].startswith("KubeRay too old for token auth")
    assert [(e["type"], e["reason"]) for e in kube.created if e["kind"] == "Event"] == [("Warning", "KubeRayTooOld")]


def test_an_unreachable_or_failing_api_server_is_transient_and_writes_no_condition():
    kube = FakeKube()
    kube.refusals[names.rayjob_path("team-a", "tiny-grpo-0")] = ApiError(503, "Service Unavailable")
    with pytest.raises(ApiError) as raised:
        reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert raised.value.transient
    assert kube.rljob is not None
    assert not [c for c in kube.rljob["status"].get("conditions", []) if c["reason"] == "ApplyFailed"]


def test_a_rayjob_of_the_name_that_is_not_the_jobs_is_never_taken_over():
    kube = FakeKube()
    theirs = {"metadata": {"name": "tiny-grpo-0"}, "spec": {"entrypoint": "python theirs.py"}}
    kube.objects[names.rayjob_path("team-a", "tiny-grpo-0")] = theirs  # unlabelled, no owner
    with pytest.raises(ApplyFailed) as failure:
        reconciler(kube).run_pass("team-a", "tiny-grpo")
    assert "does not belong to this RLJob" in failure.value.message
    assert kube.objects[names.rayjob_path("team-a", "tiny-grpo-0")] is theirs  # untouched
    assert kube.rljob is not None
    (created,) = [c for c in kube.rljob["status"]["conditions"] if c["type"] == "Created"]
    assert (created["status"], created["reason"]) == ("False", "ApplyFailed")
