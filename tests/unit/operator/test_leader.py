"""Leader election without a cluster: the Lease record a replica writes, the fence, and the gated queue.

The protocol against a real API server (two operator processes, the leader killed) is in
tests/integration/operator/test_leader_election.py.
"""

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import Configuration

from kuberl.api.status import RLJobStatus
from kuberl.operator.decide import Decision
from kuberl.operator.kube import ApiUnreachable, Kube
from kuberl.operator.leader import Leadership, LeaseElector, NotLeading, micro_time, next_lease_spec, released_spec
from kuberl.operator.reconcile import ReconcileQueue
from kuberl.operator.settings import LeaderElection, OperatorSettings
from tests.unit.operator.conftest import REQUIRED_ENV, ManualClock

NOW = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
STAMP = "2026-03-01T12:00:00.250000Z"
EARLIER = "2026-03-01T11:00:00.000000Z"


def held_by(holder: str | None, duration: int = 15, transitions: int = 4) -> dict[str, Any]:
    spec = {"leaseDurationSeconds": duration, "acquireTime": EARLIER, "renewTime": EARLIER}
    spec["leaseTransitions"] = transitions
    if holder is not None:
        spec["holderIdentity"] = holder
    return spec


# -- the record -------------------------------------------------------------------------------------------


def test_the_first_replica_creates_the_lease_as_its_holder():
    assert next_lease_spec(None, "a", NOW, 0.0, 15) == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 0,
    }


def test_the_holder_renews_keeping_its_acquire_time_and_transitions():
    renewed = next_lease_spec(held_by("a"), "a", NOW, 14.9, 15)
    assert renewed == {**held_by("a"), "renewTime": STAMP}


def test_a_standby_waits_while_the_holder_renewed_within_the_lease_duration():
    assert next_lease_spec(held_by("a"), "b", NOW, 14.9, 15) is None


def test_a_standby_takes_a_lease_unchanged_for_its_duration_and_counts_the_transition():
    taken = next_lease_spec(held_by("a", transitions=4), "b", NOW, 15.0, 15)
    assert taken == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 5,
    }


def test_the_holders_own_lease_duration_decides_when_it_expires():
    # The holder said 30 s; a standby configured for 15 s still waits the holder's 30.
    assert next_lease_spec(held_by("a", duration=30), "b", NOW, 20.0, 15) is None
    assert next_lease_spec(held_by("a", duration=30), "b", NOW, 30.0, 15) is not None


def test_a_released_lease_is_taken_at_the_next_read():
    released = released_spec(held_by("a", transitions=4), NOW)
    assert "holderIdentity" not in released and released["leaseTransitions"] == 4
    taken = next_lease_spec(released, "b", NOW, 0.0, 15)
    assert taken is not None and taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 5


def test_lease_times_are_microtime_in_utc():
    assert micro_time(NOW) == STAMP


# -- the fence --------------------------------------------------------------------------------------------


def test_without_election_the_replica_always_leads():
    leadership = Leadership.unelected()
    assert leadership.leading
    assert leadership.write_window() == float("inf")


def test_an_elected_replica_writes_only_until_the_renew_deadline_after_its_last_renewal_started():
    clock = ManualClock(100.0)
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    assert not leadership.leading  # nothing acquired yet
    leadership.renewed(started_at=100.0)
    clock.now = 104.0
    assert leadership.write_window() == pytest.approx(6.0)
    clock.now = 110.0
    with pytest.raises(NotLeading):
        leadership.write_window()


def test_closing_the_fence_stops_writes_at_once():
    clock = ManualClock(100.0)
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    leadership.renewed(started_at=100.0)
    leadership.close()
    assert not leadership.leading


def test_a_fenced_kube_sends_no_write_but_still_reads():
    """The API server address is unreachable: a request that was sent fails as ApiUnreachable."""
    configuration = Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    kube = Kube(configuration, timeout=2.0, fence=Leadership(renew_deadline=10.0))
    with pytest.raises(NotLeading):
        kube.create("/api/v1/namespaces/ns/configmaps", {"metadata": {"name": "x"}})
    with pytest.raises(ApiUnreachable):
        kube.get("/api/v1/namespaces/ns/configmaps/x")
    kube.close()


# -- settings -------------------------------------------------------------------------------------------


def test_leader_election_is_off_without_a_lease_namespace():
    assert OperatorSettings.from_env(REQUIRED_ENV).leader_election is None


def test_leader_election_settings_come_from_the_environment():
    election = OperatorSettings.from_env(
        {
            **REQUIRED_ENV,
            "KUBERL_LEASE_NAMESPACE": "kuberl-system",
            "KUBERL_LEASE_NAME": "kuberl",
            "KUBERL_LEASE_IDENTITY": "pod-a",
            "KUBERL_LEASE_DURATION_SECONDS": "6",
            "KUBERL_LEASE_RENEW_DEADLINE_SECONDS": "4",
            "KUBERL_LEASE_RETRY_PERIOD_SECONDS": "0.5",
        }
    ).leader_election
    assert election == LeaderElection("kuberl-system", "kuberl", "pod-a", 6, 4.0, 0.5)


def test_each_replica_gets_its_own_identity_by_default():
    env = {**REQUIRED_ENV, "KUBERL_LEASE_NAMESPACE": "kuberl-system"}
    first, second = (OperatorSettings.from_env(env).leader_election for _ in range(2))
    assert first is not None and second is not None
    assert first.identity != second.identity
    assert first.name == "kuberl-operator"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KUBERL_LEASE_RENEW_DEADLINE_SECONDS": "15"}, "KUBERL_LEASE_RENEW_DEADLINE_SECONDS .15.0. must be below"),
        ({"KUBERL_LEASE_RETRY_PERIOD_SECONDS": "10"}, "KUBERL_LEASE_RETRY_PERIOD_SECONDS .10.0. must be below"),
        ({"KUBERL_LEASE_DURATION_SECONDS": "2.5"}, "KUBERL_LEASE_DURATION_SECONDS: '2.5' is not a whole number"),
    ],
    ids=["renew-not-below-duration", "retry-not-below-renew", "fractional-duration"],
)
def test_timing_that_would_let_two_replicas_lead_is_refused_naming_the_variable(env: dict[str, str], message: str):
    with pytest.raises(ValueError, match=message):
        OperatorSettings.from_env({**REQUIRED_ENV, "KUBERL_LEASE_NAMESPACE": "kuberl-system", **env})


# -- the queue of a replica that does not lead -------------------------------------------------------------


class CountingReconciler:
    def __init__(self, requeue_after: float | None = None) -> None:
        self.passes: list[tuple[str, str]] = []
        self.requeue_after = requeue_after

    def run_pass(self, namespace: str, name: str) -> Decision:
        self.passes.append((namespace, name))
        return Decision(status=RLJobStatus(), write_status=False, requeue_after=self.requeue_after)


async def until(check: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_a_standby_runs_no_pass_and_runs_every_waiting_job_once_it_leads():
    clock = ManualClock(100.0)
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    counting = CountingReconciler()
    queue = ReconcileQueue(counting, workers=2, leadership=leadership)  # type: ignore[arg-type]

    async def scenario() -> None:
        for name in ("a", "b", "a"):
            queue.request("ns", name)
        queue.notice("ns", "c", 1)
        await asyncio.sleep(0.1)
        assert counting.passes == []
        assert queue.waiting == {("ns", "a"), ("ns", "b"), ("ns", "c")}
        leadership.renewed(started_at=clock.now)
        queue.start_leading()
        await until(lambda: len(counting.passes) == 3)
        await asyncio.sleep(0.05)  # and no more (the next pass is due in the resync interval)

    asyncio.run(scenario())
    queue.close()
    assert sorted(counting.passes) == [("ns", "a"), ("ns", "b"), ("ns", "c")]


def test_a_replica_that_stops_leading_runs_no_more_timed_passes_and_keeps_the_jobs_waiting():
    clock = ManualClock(100.0)
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    leadership.renewed(started_at=clock.now)
    counting = CountingReconciler(requeue_after=0.05)  # every pass asks for the next in 0.05 s
    queue = ReconcileQueue(counting, workers=1, leadership=leadership)  # type: ignore[arg-type]

    async def scenario() -> None:
        queue.request("ns", "a")
        await until(lambda: ("ns", "a") in queue._timers)  # the pass ran and scheduled the next
        leadership.close()
        queue.stop_leading()
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    queue.close()
    assert counting.passes == [("ns", "a")]
    assert queue.waiting == {("ns", "a")}


def test_a_pass_fenced_mid_way_leaves_its_job_waiting_without_counting_a_failure():
    clock = ManualClock(100.0)
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    leadership.renewed(started_at=clock.now)

    class FencedMidPass(CountingReconciler):
        def run_pass(self, namespace: str, name: str) -> Decision:
            self.passes.append((namespace, name))
            leadership.close()  # the Lease is lost while the pass runs: its next write is refused
            leadership.write_window()
            raise AssertionError("unreachable")

    fenced = FencedMidPass()
    queue = ReconcileQueue(fenced, workers=1, leadership=leadership)  # type: ignore[arg-type]

    async def scenario() -> None:
        await queue.trigger("ns", "a")  # returns: no exception reaches the caller

    asyncio.run(scenario())
    queue.close()
    assert queue.waiting == {("ns", "a")}
    assert queue._failures == {}


class SlowLeaseServer:
    """An in-memory stand-in for the API server's Lease endpoint (a test double: one object, no conflicts) whose
    read runs `during_read` first, so a test can act while a renewal is in flight."""

    def __init__(self, during_read: Any) -> None:
        self.lease: dict[str, Any] | None = None
        self.during_read = during_read

    def get(self, path: str) -> dict[str, Any] | None:
        self.during_read()
        return self.lease

    def create(self, path: str, body: dict[str, Any]) -> None:
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    def call(self, method: str, path: str, body: dict[str, Any]) -> None:
        self.create(path, body)


def test_a_job_set_aside_while_a_slow_renewal_outlasted_the_deadline_runs_when_that_renewal_lands():
    """The renewal keeps the Lease but lands after the renew deadline: for that moment the fence was closed,
    and a timed pass that came then waited. The old elector ran waiting jobs only on a new lead, so that job
    was never reconciled again (the loop test's restart after a killed pod hung on a loaded machine)."""
    clock = ManualClock(100.0)
    election = LeaderElection(namespace="ops", identity="me", renew_deadline_seconds=10.0, retry_period_seconds=2.0)
    leadership = Leadership(renew_deadline=election.renew_deadline_seconds, clock=clock)
    counting = CountingReconciler()
    queue = ReconcileQueue(counting, workers=1, leadership=leadership)  # type: ignore[arg-type]
    slow = {"on": False}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def during_read() -> None:
            if slow["on"]:  # the renewal started at 105 is still in flight at 111, past the deadline of 110
                clock.now = 111.0
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result()  # the loop runs meanwhile
                loop.call_soon_threadsafe(queue.request, "ns", "a")
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop).result()

        server = SlowLeaseServer(during_read)
        elector = LeaseElector(
            server,  # type: ignore[arg-type]
            election,
            leadership,
            on_started_leading=queue.start_leading,
            on_stopped_leading=queue.stop_leading,
            on_renewed=queue.start_leading,  # as operator/main.py wires it
            clock=clock,
            wall_clock=lambda: NOW,
        )
        await elector.try_acquire_or_renew()  # acquires at 100: may write until 110
        assert elector.is_leader and leadership.leading
        clock.now, slow["on"] = 105.0, True
        await elector.try_acquire_or_renew()
        await until(lambda: counting.passes == [("ns", "a")])
        assert elector.is_leader and leadership.leading and queue.waiting == set()

    asyncio.run(scenario())
    queue.close()
