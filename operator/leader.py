"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it, and the fence
that stops a replica writing once it may no longer lead.

Every replica watches (kopf's streams stay open, so a standby knows every RLJob and takes over without
a relist) and serves the admission webhook (admission needs no leader); only the replica holding the
Lease reconciles: the queue (reconcile.py) runs passes only while `Leadership.leading`, and every write
of a pass asks the fence first (kube.py). This is controller-runtime's split too: caches run on every
replica, controllers only on the leader.

The protocol, client-go's `tryAcquireOrRenew`, every `retry_period` on every replica:
- Read the Lease. A replica measures how long the record has gone unchanged on its own monotonic
  clock, from the moment it *saw* the last change: clocks of different machines are never compared.
- The holder renews: it writes `renewTime`. A candidate takes the Lease when it has no holder, or when
  the record has not changed for the Lease's `leaseDurationSeconds`; it writes itself as `holderIdentity`
  with `acquireTime` and `leaseTransitions` + 1. Every write carries the resourceVersion it read
  (a PUT), so of two replicas writing at once one gets a conflict and stays a standby.
- The holder may write only until `renew_deadline` after the start of its last successful renewal
  (`Leadership`). renew_deadline < lease_duration and a standby saw that renewal at the earliest when it
  was written, after it started: the old leader's fence closes before any standby may take over. The
  margin between the two (5 s with the defaults) covers a write sent just before the fence closed (its
  timeout is cut to the time left, kube.py). Beyond the fence, an overlap stays harmless by design:
  names are deterministic, status writes carry the resourceVersion they read, children are created once.
- On a clean shutdown the holder closes its fence, then releases the Lease (no holder), so a standby
  takes over at its next read instead of after lease_duration.

The elector runs in kopf's event loop, its requests in a thread of its own (never queued behind the
reconcile passes). A wedged loop therefore stops renewing and the replica loses the Lease within
renew_deadline, while /healthz (health.py) asks the kubelet to restart it.
"""

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kuberl.operator.kube import ApiError, Kube
from kuberl.operator.settings import LeaderElection

logger = logging.getLogger("kuberl.operator.leader")

LEASE_API_VERSION = "coordination.k8s.io/v1"


class NotLeading(Exception):
    """A write refused before it was sent: this replica does not hold the Lease (or no longer may act on it)."""


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return base if name is None else f"{base}/{name}"


def micro_time(moment: datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    """Whether this replica may write now. The elector opens it (each renewal); reconcile threads read it.

    `deadline` is on this process's monotonic clock: the start of the last successful renewal plus the
    renew deadline. Without an election (`Leadership.unelected()`) it is always open.
    """

    def __init__(self, renew_deadline: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.renew_deadline, self.clock = renew_deadline, clock
        self._deadline = math.inf if renew_deadline is None else -math.inf
        self._lock = threading.Lock()

    @classmethod
    def unelected(cls) -> "Leadership":
        return cls(None)

    def renewed(self, started_at: float) -> None:
        """A renewal (or acquisition) that started at `started_at` (clock()) succeeded."""
        assert self.renew_deadline is not None, "an unelected replica has nothing to renew"
        with self._lock:
            self._deadline = max(self._deadline, started_at + self.renew_deadline)

    def close(self) -> None:
        """Stop writing now (the Lease was lost, taken or is being released)."""
        if self.renew_deadline is not None:
            with self._lock:
                self._deadline = -math.inf

    def remaining(self) -> float:
        with self._lock:
            return self._deadline - self.clock()

    @property
    def leading(self) -> bool:
        return self.remaining() > 0

    def write_window(self) -> float:
        """kube.WriteFence: the seconds left to write in; NotLeading when there are none."""
        left = self.remaining()
        if left <= 0:
            raise NotLeading("this replica does not hold the operator's Lease: it does not write")
        return left


def next_lease_spec(
    spec: dict[str, Any] | None,
    identity: str,
    now: datetime,
    unchanged_for: float,
    lease_duration_seconds: int,
) -> dict[str, Any] | None:
    """The Lease spec this replica writes now, or None when another holds the Lease and it has not expired.

    `spec`: the Lease's spec as read (None: there is no Lease). `unchanged_for`: seconds, on this
    replica's clock, since it saw the spec change. The holder's own leaseDurationSeconds decides expiry.

    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> next_lease_spec({"holderIdentity": "a", "leaseDurationSeconds": 15}, "b", t, 3.0, 15) is None
    True
    >>> next_lease_spec({"holderIdentity": "a", "leaseDurationSeconds": 15}, "b", t, 16.0, 15)["holderIdentity"]
    'b'
    """
    stamp = micro_time(now)
    if spec is None:
        return {
            "holderIdentity": identity,
            "leaseDurationSeconds": lease_duration_seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
    holder = spec.get("holderIdentity")
    if holder == identity:
        return {**spec, "leaseDurationSeconds": lease_duration_seconds, "renewTime": stamp}
    held_for = spec.get("leaseDurationSeconds") or lease_duration_seconds
    if holder and unchanged_for < held_for:
        return None
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": lease_duration_seconds,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
    }


def released_spec(spec: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The spec a leader leaves on a clean shutdown: no holder, so a standby takes the Lease at its next read."""
    stamp = micro_time(now)
    return {
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": spec.get("leaseTransitions") or 0,
    }


def utcnow() -> datetime:
    return datetime.now(UTC)


class LeaseElector:
    """Holds or waits for the Lease, opening and closing `leadership`, and tells the queue when it leads.

    `on_started_leading` / `on_stopped_leading` (and `on_renewed`, after each renewal of a held Lease) run in
    the event loop. `kube` must be a Kube without a
    fence: the Lease's own writes are what open the fence.
    """

    def __init__(
        self,
        kube: Kube,
        election: LeaderElection,
        leadership: Leadership,
        *,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        on_leading_changed: Callable[[bool], None] = lambda leading: None,
        on_renewed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube, self.election, self.leadership = kube, election, leadership
        self.on_started_leading, self.on_stopped_leading = on_started_leading, on_stopped_leading
        self.on_leading_changed, self.on_renewed = on_leading_changed, on_renewed
        self.clock, self.wall_clock = clock, wall_clock
        self.path = lease_path(election.namespace, election.name)
        self.is_leader = False
        self._seen: dict[str, Any] | None = None  # the spec as last read or written
        self._seen_at = clock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuberl-lease")

    async def run(self, stop: asyncio.Event) -> None:
        """Try to acquire or renew every retry period until `stop` is set; then release the Lease if held."""
        try:
            while not stop.is_set():
                try:
                    await self.try_acquire_or_renew()
                except Exception:  # a Lease not shaped as expected: keep trying, the fence closes by itself
                    logger.exception("leader election for the Lease %s failed", self.path)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.election.retry_period_seconds)
                except TimeoutError:
                    pass
        finally:
            await self.release()
            self._executor.shutdown(wait=False)

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def try_acquire_or_renew(self) -> None:
        if self.is_leader and not self.leadership.leading:  # the loop or the API server was too slow to renew
            self._lose("its renewal deadline passed")
        started = self.clock()
        try:
            lease = await self._call(self.kube.get, self.path)
            spec = None if lease is None else dict(lease.get("spec") or {})
            if spec != self._seen:
                self._seen, self._seen_at = spec, self.clock()
            wanted = next_lease_spec(
                spec,
                self.election.identity,
                self.wall_clock(),
                self.clock() - self._seen_at,
                self.election.lease_duration_seconds,
            )
            if wanted is None:
                self._lose(f"the Lease is held by {spec and spec.get('holderIdentity')}")
                return
            await self._call(self._write, lease, wanted)
            self._seen, self._seen_at = wanted, self.clock()
        except ApiError as error:  # a conflict (another replica wrote first), or the API server failing
            log = logger.info if error.conflict else logger.warning
            log("Lease %s not acquired or renewed: %s", self.path, error)
            if not self.leadership.leading:
                self._lose("its renewal deadline passed")
            return
        self.leadership.renewed(started)
        if not self.is_leader:
            self.is_leader = True
            logger.info("became the leader (Lease %s, identity %s)", self.path, self.election.identity)
            self.on_leading_changed(True)
            self.on_started_leading()
        else:
            # A renewal slow enough to outlast the renew deadline closed the fence for a moment while this
            # replica kept the Lease; a trigger in that moment was set aside to wait, and nothing else would
            # run it: a job whose timed pass waited would never be reconciled again.
            self.on_renewed()

    def _write(self, lease: dict[str, Any] | None, spec: dict[str, Any]) -> None:
        meta = {"name": self.election.name, "namespace": self.election.namespace}
        body = {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": meta, "spec": spec}
        if lease is None:
            self.kube.create(lease_path(self.election.namespace), body)
        else:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]  # a conflict if someone wrote since
            self.kube.call("PUT", self.path, body=body)

    def _lose(self, why: str) -> None:
        self.leadership.close()
        if self.is_leader:
            self.is_leader = False
            logger.warning("stopped leading (Lease %s): %s", self.path, why)
            self.on_leading_changed(False)
            self.on_stopped_leading()

    async def release(self) -> None:
        """Close the fence, then hand the Lease back if this replica still holds it (best effort)."""
        was_leader = self.is_leader
        self._lose("the operator is shutting down")
        if not was_leader:
            return
        try:
            lease = await self._call(self.kube.get, self.path)
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.election.identity:
                await self._call(self._write, lease, released_spec(spec, self.wall_clock()))
                logger.info("released the Lease %s", self.path)
        except ApiError as error:
            logger.warning("the Lease %s was not released (a standby takes it when it expires): %s", self.path, error)
