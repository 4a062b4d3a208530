"""One level-triggered reconcile pass per RLJob: observe -> decide (pure) -> apply; and the queue that runs them.

`Reconciler.run_pass` is synchronous I/O (it runs in a worker thread): it reads the RLJob, the
RayJobs labelled with its name, its spec ConfigMap and the runtime's report, calls `decide`, then
acts in an order that keeps a crash harmless:

1. the status (server-side apply under FIELD_MANAGER, with the observed resourceVersion as a
   precondition): a new RayJob's name is committed here, before the RayJob exists. Only the
   operator's fields are sent, so the runtime's progress/metrics/lastCheckpoint are untouched.
   A conflict (someone wrote the RLJob meanwhile) re-runs the pass on fresh data.
2. deletions of old RayJobs, 3. the children: the job's access objects (access.py; created once,
   the Ray token Secret with a fresh random token), the ConfigMaps and the RayJob (server-side apply:
   applying the same name twice is one object), 4. the RLJob itself when its TTL is up, 5. Events.

A child the API server refuses (a quota, a policy engine, KubeRay's schema, a missing CRD) ends the
pass with a second status write, Created=False with the API server's message and one Warning event
(`report_failure`), and the queue retries it with a growing delay. Errors with no answer or a 5xx
are transient: retried the same way, with no condition.

`ReconcileQueue` gives each RLJob at most one pass at a time: a trigger that arrives during a pass
(a RayJob status change, an edit, a timer) makes exactly one more pass after it; a decision's
`requeue_after` schedules the next pass (backoff, deadline, TTL), the resync interval bounds it, and
a failed pass is retried with an exponential backoff.

With leader election (leader.py) the queue runs passes only while this replica leads. A standby's queue
still hears every trigger and keeps the jobs concerned `waiting`; `start_leading` gives each of them a
pass, so the jobs created, changed or half-reconciled while the old leader died are all taken up.
`stop_leading` cancels the timers and puts their jobs back to waiting; a pass in flight then finds its
next write refused by the fence (kube.py) and its job waits too.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kuberl.api import KIND
from kuberl.api.enums import ConditionReason
from kuberl.api.status import RLJobStatus
from kuberl.operator import names
from kuberl.operator.access import CREATE_ONLY, KUBERAY_TOO_OLD, is_ray_token_secret, token_auth_kept, with_new_token
from kuberl.operator.builders import Owner, build_event
from kuberl.operator.decide import (
    KUBERAY_MISSING,
    Decision,
    Event,
    Observed,
    apply_failed,
    decide,
    name_taken,
    owned_by,
    transition_events,
)
from kuberl.operator.kube import ApiError, Kube
from kuberl.operator.leader import Leadership
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.status import format_time, status_manifest

logger = logging.getLogger("kuberl.operator")

Key = tuple[str, str]  # (namespace, name)
#: Passes in a row that may hit a write conflict before the error goes to the caller (and kopf retries).
CONFLICT_RETRIES = 3
#: Retries of a failed pass wait RETRY_BASE_SECONDS, then twice as long each time, at most RETRY_CAP_SECONDS.
RETRY_BASE_SECONDS = 1.0
RETRY_CAP_SECONDS = 300.0


def utcnow() -> datetime:
    return datetime.now(UTC)


class ApplyFailed(Exception):
    """The API server refused to create or change a child for a reason retrying as is will not fix (or, with
    another `reason`, the child would not be what the job needs: KubeRayTooOld)."""

    def __init__(
        self, kind: str, name: str, message: str, reason: ConditionReason = ConditionReason.APPLY_FAILED
    ) -> None:
        self.kind, self.name, self.message, self.reason = kind, name, message, reason
        super().__init__(f"{kind} {name}: {message}")


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube, self.settings, self.metrics, self.clock = kube, settings, metrics, clock
        self.instance = socket.gethostname()

    def observe(self, namespace: str, name: str) -> Observed | None:
        rljob = self.kube.get(names.rljob_path(namespace, name))
        if rljob is None or rljob["metadata"].get("deletionTimestamp"):
            return None
        try:
            rayjobs = self.kube.list(names.rayjob_path(namespace), f"{names.JOB_LABEL}={name}")
        except ApiError as error:
            if error.status != 404:
                raise
            return Observed(rljob=rljob, kuberay_missing=True)
        configmap = self.kube.get(names.configmap_path(namespace, names.configmap_name(name)))
        progress = self.kube.get(names.configmap_path(namespace, names.progress_configmap_name(name)))
        return Observed(rljob=rljob, rayjobs=tuple(rayjobs), configmap=configmap, progress=progress)

    def write_status(self, rljob: dict[str, Any], status: RLJobStatus, resource_version: str) -> None:
        """Apply the operator's status fields; a conflict (409) if the RLJob moved past `resource_version`."""
        meta = rljob["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        self.kube.apply(
            names.rljob_path(namespace, name) + "/status",
            {
                "apiVersion": names.RLJOB_API_VERSION,
                "kind": KIND,
                "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
                "status": status_manifest(status),
            },
        )

    def act(self, observed: Observed, decision: Decision) -> None:
        """Carry the decision out; ApplyFailed when the API server refuses a child (after the status write)."""
        meta = observed.rljob["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if decision.write_status:
            self.write_status(observed.rljob, decision.status, str(meta["resourceVersion"]))
        for rayjob in decision.delete_rayjobs:
            # foreground: the RayJob stays until its pods are gone, and the next one waits for that
            self.kube.delete(names.rayjob_path(namespace, rayjob), foreground=True)
        for child in decision.apply:
            self.apply_child(namespace, child)
        if decision.delete_rljob:
            self.kube.delete(names.rljob_path(namespace, name), uid=meta["uid"])
        self.post_events(observed.rljob, decision.events)

    def apply_child(self, namespace: str, child: dict[str, Any]) -> None:
        """Server-side apply, or for access.CREATE_ONLY kinds a create that leaves an existing object alone.

        An existing RayJob of the name that is not this job's is an ApplyFailed (NameTaken): never taken over."""
        kind, name = child["kind"], child["metadata"]["name"]
        try:
            if kind in CREATE_ONLY:
                self.create_once(namespace, child)
            else:
                self.kube.apply(names.object_path(kind, namespace, name), child)
        except ApiError as error:
            if error.conflict or error.transient:
                raise
            if error.status == 404 and kind == "RayJob":
                raise ApplyFailed(kind, name, KUBERAY_MISSING) from error
            raise ApplyFailed(kind, name, error.message) from error

    def create_once(self, namespace: str, child: dict[str, Any]) -> None:
        kind, name = child["kind"], child["metadata"]["name"]
        if is_ray_token_secret(child):  # the Ray token is made here, at the edge, and never read back
            child = with_new_token(child)
        if kind == "RayJob":
            self.require_token_auth(namespace, child)
        try:
            self.kube.create(names.object_path(kind, namespace), child)
        except ApiError as error:
            if error.status != 409:
                raise
            if kind == "RayJob" and not self.owns_rayjob(namespace, child):
                raise ApplyFailed(kind, name, name_taken(kind, name)) from error
            # AlreadyExists otherwise: made by an earlier pass, or by someone else, and left as it is either way

    def require_token_auth(self, namespace: str, rayjob: dict[str, Any]) -> None:
        """A dry run of the RayJob's create first: the API server answers with the object as it would store it,
        less the fields KubeRay's CRD does not know. KubeRay before 1.5.1 does not know `authOptions` (checked
        against its 1.4.2 and 1.5.1 CRDs): its RayJob would lose it and its Ray cluster run without
        authentication, so nothing is created and the job says why (ApplyFailed, KubeRayTooOld)."""
        try:
            stored = self.kube.create(names.object_path("RayJob", namespace), rayjob, dry_run=True)
        except ApiError as error:
            if error.status == 409:
                return  # it exists: made by an earlier pass, checked then (or not the job's: create_once says so)
            raise
        if not token_auth_kept(stored):
            raise ApplyFailed("RayJob", rayjob["metadata"]["name"], KUBERAY_TOO_OLD, ConditionReason.KUBERAY_TOO_OLD)

    def owns_rayjob(self, namespace: str, rayjob: dict[str, Any]) -> bool:
        """Whether the RayJob of that name is this job's (the watch cache may not show one just created)."""
        owner = rayjob["metadata"]["ownerReferences"][0]["uid"]
        job = rayjob["metadata"]["labels"][names.JOB_LABEL]
        ours = self.kube.list(names.rayjob_path(namespace), f"{names.JOB_LABEL}={job}", consistent=True)
        return any(r["metadata"]["name"] == rayjob["metadata"]["name"] and owned_by(r, owner) for r in ours)

    def post_events(self, rljob: dict[str, Any], events: Sequence[Event]) -> None:
        owner = Owner.of(rljob)
        namespace, name = owner.namespace, owner.name
        for event in events:
            body = build_event(
                owner,
                kind=event.type,
                reason=event.reason,
                message=event.message,
                time=format_time(self.clock()),
                instance=self.instance,
            )
            try:
                self.kube.create(names.events_path(namespace), body)
            except ApiError as error:  # events are best effort: never fail a pass for one
                logger.warning("event %s for %s/%s not posted: %s", event.reason, namespace, name, error)

    def report_failure(self, observed: Observed, decision: Decision, failure: ApplyFailed) -> None:
        """Status follows what happened: Created=False with the API server's message, and a Warning event once."""
        meta = observed.rljob["metadata"]
        current = self.kube.get(names.rljob_path(meta["namespace"], meta["name"]))  # after this pass's status write
        if current is None:
            return
        failed = apply_failed(
            decision.status, failure.kind, failure.name, failure.message, self.clock(), reason=failure.reason
        )
        self.write_status(current, failed, str(current["metadata"]["resourceVersion"]))
        self.post_events(observed.rljob, transition_events(decision.status, failed))

    def run_pass(self, namespace: str, name: str) -> Decision | None:
        """Observe, decide, act; None when the RLJob is gone. Write conflicts re-run the pass."""
        started = time.perf_counter()
        self.metrics.reconciles.inc()
        try:
            for attempt in range(CONFLICT_RETRIES):
                observed = self.observe(namespace, name)
                if observed is None:
                    self.metrics.job_phase((namespace, name), None)
                    return None
                decision = decide(observed, self.clock(), self.settings)
                try:
                    self.act(observed, decision)
                except ApiError as error:
                    if error.conflict and attempt + 1 < CONFLICT_RETRIES:
                        continue
                    raise
                except ApplyFailed as failure:
                    self.report_failure(observed, decision, failure)
                    raise
                self.metrics.job_phase((namespace, name), decision.status.phase.value)
                return decision
            raise AssertionError("unreachable")  # the loop returns or raises
        except Exception:
            self.metrics.errors.inc()
            raise
        finally:
            self.metrics.seconds.observe(time.perf_counter() - started)


def retry_delay(failures: int) -> float:
    """The wait before retrying a pass that failed `failures` times in a row: 1, 2, 4 ... at most RETRY_CAP_SECONDS."""
    return float(min(RETRY_BASE_SECONDS * 2 ** min(max(failures - 1, 0), 32), RETRY_CAP_SECONDS))


class ReconcileQueue:
    """At most one pass per RLJob at a time, coalescing triggers; requeues by the decisions' timing.

    Every job known to the queue gets a pass at least every `resync_seconds` (the safety net beside the
    watch events), and a pass that fails is retried after `retry_delay(failures)`, so an API server that
    keeps refusing is asked less and less often rather than every few seconds forever.
    """

    def __init__(
        self,
        reconciler: Reconciler,
        workers: int,
        resync_seconds: float = 300.0,
        leadership: Leadership | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.resync_seconds = resync_seconds
        self.leadership = leadership or Leadership.unelected()
        #: Jobs that asked for a pass while this replica did not lead: each gets one when it starts leading.
        self.waiting: set[Key] = set()
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kuberl-reconcile")
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._generations: dict[Key, object] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def notice(self, namespace: str, name: str, generation: object) -> None:
        """An RLJob event: a pass when the job is new here or its spec changed; none for a status-only change."""
        key = (namespace, name)
        if key in self._generations and self._generations[key] == generation:
            return
        self._generations[key] = generation
        self.request(namespace, name)

    def request(self, namespace: str, name: str) -> None:
        """A pass soon, in the background; returns at once and never raises (failures are retried).
        While this replica does not lead, the job waits for it to."""
        if not self.leadership.leading:
            self.waiting.add((namespace, name))
            return
        task = asyncio.get_running_loop().create_task(self._quietly(namespace, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quietly(self, namespace: str, name: str) -> None:
        try:
            await self.trigger(namespace, name)
        except Exception:  # noqa: BLE001 - trigger logged it and scheduled the retry
            pass

    async def trigger(self, namespace: str, name: str) -> None:
        """Run a pass now (or right after the one in flight). Raises what the pass raised, after scheduling
        its retry."""
        key = (namespace, name)
        if key in self._running:
            self._dirty.add(key)
            return
        if not self.leadership.leading:
            self.waiting.add(key)
            return
        self._running.add(key)
        loop = asyncio.get_running_loop()
        decision: Decision | None = None
        try:
            while True:
                self._dirty.discard(key)
                decision = await loop.run_in_executor(self.executor, self.reconciler.run_pass, namespace, name)
                if key not in self._dirty:
                    break
        except Exception as error:
            if not self.leadership.leading:  # fenced mid-pass: the next leader takes the job up
                logger.info("pass of %s/%s stopped: this replica no longer leads (%s)", namespace, name, error)
                self.waiting.add(key)
                return
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = retry_delay(failures)
            logger.warning(
                "reconcile of %s/%s failed (%d in a row), retrying in %g s: %s", namespace, name, failures, delay, error
            )
            self.requeue(namespace, name, delay)
            raise
        finally:
            self._running.discard(key)
        self._failures.pop(key, None)
        if decision is None:
            self.forget(namespace, name)
            return
        due = decision.requeue_after
        self.requeue(namespace, name, self.resync_seconds if due is None else min(due, self.resync_seconds))

    def requeue(self, namespace: str, name: str, delay: float) -> None:
        key = (namespace, name)
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._due, namespace, name)

    def _due(self, namespace: str, name: str) -> None:
        self._timers.pop((namespace, name), None)
        self.request(namespace, name)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)
        self._generations.pop(key, None)
        self.waiting.discard(key)

    def start_leading(self) -> None:
        """This replica holds the Lease (newly, or renewed): a pass for every job that waited (in the event loop)."""
        if not self.waiting:
            return
        waiting, self.waiting = sorted(self.waiting), set()
        logger.info("leading: a pass for each of %d waiting RLJobs", len(waiting))
        for namespace, name in waiting:
            self.request(namespace, name)

    def stop_leading(self) -> None:
        """This replica lost the Lease: no more timed passes; their jobs wait for the next lead."""
        for key, timer in self._timers.items():
            timer.cancel()
            self.waiting.add(key)
        self._timers.clear()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            if not task.get_loop().is_closed():  # asyncio.run cancels what is left when kopf's loop ends
                task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)
