"""A leader cut off from the API server stops writing before a standby may take its Lease.

Two electors (operator/leader.py) share one event loop and one monotonic clock, against the real API
server. Once the first leads, its connection is pointed at a port where nothing listens (a real
connection failure, as a network partition gives): it can no longer renew, while the Lease it
wrote stays in the API server. The standby must wait the Lease's duration from when it saw the last
renewal; the cut-off leader's fence closes its renew deadline after that renewal started. Both moments
are on the same clock here, so the order is checked exactly, not by timing luck.
"""

import asyncio
import time

import pytest
from kubernetes.client import Configuration

from kuberl.operator.kube import Kube
from kuberl.operator.leader import Leadership, LeaseElector
from kuberl.operator.settings import LeaderElection
from tests.integration.envtest import ControlPlane

pytestmark = pytest.mark.integration

LEASE_DURATION_SECONDS = 3
RENEW_DEADLINE_SECONDS = 2.0
RETRY_PERIOD_SECONDS = 0.25
NOWHERE = "https://127.0.0.1:9"  # the discard port: connection refused


def connection_to(cp: ControlPlane) -> Configuration:
    """The admin's connection, built by hand: a kubeconfig-loaded one resets its host before every request."""
    configuration = Configuration()
    configuration.host = cp.server
    configuration.ssl_ca_cert = str(cp.ca_file)
    configuration.api_key = {"BearerToken": cp.token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return configuration


class Replica:
    """An elector, its fence and what it was told, in the order it was told."""

    def __init__(self, cp: ControlPlane, identity: str, namespace: str, journal: list[tuple[str, str, float]]) -> None:
        election = LeaderElection(
            namespace, "fence", identity, LEASE_DURATION_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_PERIOD_SECONDS
        )
        self.identity, self.journal = identity, journal
        self.leadership = Leadership(RENEW_DEADLINE_SECONDS)
        self.kube = Kube(connection_to(cp))
        self.elector = LeaseElector(
            self.kube,
            election,
            self.leadership,
            on_started_leading=lambda: self.note("started leading"),
            on_stopped_leading=lambda: self.note("stopped leading"),
        )
        self.stop = asyncio.Event()

    def note(self, what: str) -> None:
        self.journal.append((self.identity, what, time.monotonic()))


async def until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_a_leader_that_cannot_renew_stops_before_the_standby_starts(
    control_plane: ControlPlane, unwatched_namespace: str
):
    journal: list[tuple[str, str, float]] = []
    fence_open_when_b_started: list[float] = []

    async def scenario() -> None:
        a, b = (Replica(control_plane, name, unwatched_namespace, journal) for name in ("a", "b"))

        def b_starts_leading() -> None:
            fence_open_when_b_started.append(a.leadership.remaining())
            b.note("started leading")

        b.elector.on_started_leading = b_starts_leading
        runs = [asyncio.create_task(a.elector.run(a.stop))]
        await until(lambda: a.elector.is_leader, 10, "a leading")
        runs.append(asyncio.create_task(b.elector.run(b.stop)))
        await asyncio.sleep(2 * RETRY_PERIOD_SECONDS)  # b has seen a's renewals
        a.kube.configuration.host = NOWHERE  # a is cut off; its last renewal stays in the API server
        cut_at = time.monotonic()
        await until(lambda: b.elector.is_leader, 15, "b taking over")
        takeover = time.monotonic() - cut_at
        for replica in (a, b):
            replica.stop.set()
        await asyncio.gather(*runs)
        assert takeover <= LEASE_DURATION_SECONDS + 2 * RETRY_PERIOD_SECONDS + 3.0

    asyncio.run(scenario())
    events = [(who, what) for who, what, _ in journal]
    assert events == [
        ("a", "started leading"),
        ("a", "stopped leading"),  # its renew deadline passed
        ("b", "started leading"),  # the Lease expired
        ("b", "stopped leading"),  # the end of the test: b releases it
    ]
    (a_left,) = fence_open_when_b_started
    assert a_left <= 0  # a's fence was already closed when b began: they never both could write
    a_stopped = next(at for who, what, at in journal if (who, what) == ("a", "stopped leading"))
    b_started = next(at for who, what, at in journal if (who, what) == ("b", "started leading"))
    assert b_started > a_stopped
