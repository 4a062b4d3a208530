"""What both elastic pools share: Ray actors started and released as `decide_pool_size` says, by one thread.

The reward pool (rewards/pool.py: reward batches for reward workers) and the separate rollout pool
(rollout_pool.py: prompt chunks for engine replicas) are each a queue of work in front of a set of
workers. `ElasticPool` owns what is the same in both: the first workers, started before the job goes on
(a worker that cannot start fails the job at once); the scheduler thread, which waits for the workers'
calls, hands each finished one to the pool (`_settle`), lets it hand out work (`_schedule`), and every
`ScalePolicy.interval_s` moves the pool to the size `decide_pool_size` (autoscale.py) gives for its queue
and its idle workers; starting and releasing workers, and giving up growing after `max_batch_attempts`
workers in a row failed to start. What a worker does, what it is handed and how a result is kept are the
pool's own.

Releasing a worker. A worker holding what its process's death would not free (a tensor-parallel vLLM
engine's shared-memory queues in /dev/shm: `ray.kill` ends the process before anything unlinks them) gets a
stop call first (`_stop_call`), and its actor is killed once that call ends, or after `STOP_TIMEOUT_S`.
The stop is asked of a worker with no call under way, and of one that scale-down releases while it is still
setting up: such a pool's actors run one call at a time, so its stop runs once the setup ends (a vLLM engine
killed halfway through its start leaves the queues it had made), and the kill waits until `STOP_TIMEOUT_S`
past the end of its start timeout. The workers with another call under way (a chunk, at shutdown), and the
workers of a pool without a stop call, are killed at once. The scheduler thread reaps the stopped ones, so a
release never blocks it; `shutdown` waits for them, for `STOP_TIMEOUT_S` at most. Scale-down releases the
workers still setting up before the idle ready ones, so the workers kept can take work at once.

Each worker asks Ray for a unit of its pool's custom resource (`kuberl_reward`, `kuberl_rollout`) plus its
CPUs and GPUs, as the job's topology says (api/topology.py): on Kubernetes a worker the cluster cannot
place makes the KubeRay autoscaler add a pod of that pool, and a released one leaves its pod idle for
the autoscaler to remove. A local run's Ray offers the same resources, so a pool grows and shrinks
between the same bounds on one machine.
"""

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import GetTimeoutError

from kuberl.api.topology import ActorGroup
from kuberl.runtime.deadline import current_deadline
from kuberl.runtime.pools.autoscale import PoolBounds, ScaleEvent, ScalePolicy, decide_pool_size
from kuberl.runtime.workers.group import call_outcome

log = logging.getLogger(__name__)

#: How long a released worker's stop call may take before its actor is killed regardless.
STOP_TIMEOUT_S = 30.0


@dataclass
class PoolWorker:
    """One worker of a pool: its Ray actor, and since when it has had nothing to do."""

    number: int  # 1, 2, ... in start order; never reused
    actor: Any
    started_at: float
    idle_since: float


@dataclass(kw_only=True)
class PendingCall:
    """One caller's request (a `score`, a `generate`): done once each of its pieces has a result, or failed."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    waits: list[float] = field(default_factory=list)  # seconds each of its pieces waited in the queue


@dataclass
class _Stopping:
    """A released worker whose stop call is under way: killed once it ends, or at `kill_at`."""

    number: int
    actor: Any
    call: Any
    kill_at: float


W = TypeVar("W", bound=PoolWorker)


class ElasticPool(Generic[W]):
    """The workers of one elastic pool and the thread that schedules and scales them (see the module).

    A pool defines: `_launch` (start an actor and its setup), `_setup_call`, `_is_ready`, `_mark_ready`,
    `_calls_of` (the calls under way), `_settle`, `_schedule`, `_queue_state` and `_idle`; `_is_starting`
    when more than the workers still setting up cannot take work yet; `_stop_call` when killing a worker
    is not enough to free what it holds. Callers' requests wait in `_waiting` (`_await`), their pieces in
    `_queue`.
    The subclass's __init__ ends with `_start(first)`. Everything but __init__ runs under `_lock`.
    """

    noun = "worker"  # how logs and errors name one worker ("reward worker", "rollout replica")
    error_type: type[Exception] = RuntimeError  # what the pool raises when it cannot go on
    slots_per_worker = 1  # pieces of work one worker runs at once

    def __init__(self, group: ActorGroup, policy: ScalePolicy | None) -> None:
        self.bounds = PoolBounds.of(group)
        self.policy = policy or ScalePolicy()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every tick of the scheduler
        self._stop = threading.Event()
        self._workers: dict[int, W] = {}
        self._stopping: list[_Stopping] = []  # released workers finishing their stop call
        self._numbered = 0
        self._started_at = time.monotonic()
        self._events: list[ScaleEvent] = []
        self._counts: dict[str, int] = {"failed_starts": 0}
        self._failed_starts_in_row = 0
        self._growth_stopped = False
        self._broken: BaseException | None = None
        self._peak = 0
        self._queue: deque[Any] = deque()  # pieces of work waiting for a worker
        self._waiting: list[PendingCall] = []  # the callers' requests under way
        self._last_waits: list[float] = []  # the queue waits of the latest request's pieces
        self._thread = threading.Thread(target=self._run, name=f"kuberl-{group.name}-pool", daemon=True)

    # -- what each pool defines ----------------------------------------------------------------------
    def _launch(self, number: int, now: float) -> W:
        raise NotImplementedError

    def _setup_call(self, worker: W) -> Any:
        raise NotImplementedError

    def _is_ready(self, worker: W) -> bool:
        raise NotImplementedError

    def _mark_ready(self, worker: W, now: float) -> None:
        raise NotImplementedError

    def _calls_of(self, worker: W) -> list[Any]:
        raise NotImplementedError

    def _settle(self, worker: W, ref: Any, value: Any, error: BaseException | None, now: float) -> None:
        raise NotImplementedError

    def _schedule(self, now: float) -> None:
        raise NotImplementedError

    def _queue_state(self, now: float) -> tuple[int, float]:
        """(pieces of work queued, seconds the oldest has waited)."""
        raise NotImplementedError

    def _idle(self) -> list[W]:
        """Ready workers with nothing to do, which scale-down may release."""
        raise NotImplementedError

    def _is_starting(self, worker: W) -> bool:
        """Asked for but not able to take work yet (what a growing pool need not ask for again)."""
        return not self._is_ready(worker)

    def _stop_call(self, worker: W) -> Any | None:
        """The call that makes a released worker free what its killed process would leave behind; None: a
        kill is enough. A pool with one runs its actors one call at a time (max_concurrency=1), so a stop
        asked of a worker still setting up runs after its setup."""
        return None

    # -- shared --------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Workers running or starting now."""
        with self._lock:
            return len(self._workers)

    @property
    def scale_events(self) -> list[ScaleEvent]:
        with self._lock:
            return list(self._events)

    def shutdown(self) -> None:
        """Stops the scheduler, then every worker (their stop calls, within STOP_TIMEOUT_S, then their
        actors); pending calls fail. Safe to call twice."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            self._broken = self._broken or self.error_type(f"the {self.bounds.pool} pool was shut down")
            self._fail_waiting(self._broken)
            self._release_all()
            stopping, self._stopping = self._stopping, []
        if stopping:
            ray.wait([s.call for s in stopping], num_returns=len(stopping), timeout=STOP_TIMEOUT_S)
        for worker in stopping:
            self._kill(worker.number, worker.actor)

    def metrics(self) -> dict[str, float]:
        """`<pool>/pool_size` now (telemetry's REWARD_POOL_SIZE, ROLLOUT_POOL_SIZE) and at its largest during
        the latest request; scale-ups and -downs and the pool's counters (deaths, requeues, failed starts ...)
        since it started; the queue waits (mean, max) of the latest request's pieces."""
        prefix = self.bounds.pool
        with self._lock:
            waits = self._last_waits
            return {
                f"{prefix}/pool_size": float(len(self._workers)),
                f"{prefix}/pool_size_peak": float(max(self._peak, len(self._workers))),
                f"{prefix}/scale_ups": float(sum(event.after > event.before for event in self._events)),
                f"{prefix}/scale_downs": float(sum(event.after < event.before for event in self._events)),
                f"{prefix}/queue_wait_seconds": statistics.fmean(waits) if waits else 0.0,
                f"{prefix}/queue_wait_max_seconds": max(waits, default=0.0),
                **{f"{prefix}/{name}": float(count) for name, count in self._counts.items()},
            }

    def _await(self, call: PendingCall, progress: Callable[[], str]) -> None:
        """Waits for `call` (already in `_waiting`, its pieces queued) within the step's deadline; past it the
        call fails with StepTimeoutError naming `progress()` (what got done) and its queued pieces are dropped."""
        deadline = current_deadline()
        call.done.wait(deadline.time_left() if deadline is not None else None)
        with self._lock:
            self._waiting.remove(call)
            self._last_waits = call.waits
            if not call.done.is_set():
                assert deadline is not None
                call.error = deadline.exceeded(progress())
                call.done.set()

    def _fail_waiting(self, error: BaseException) -> None:
        """Every request still waiting fails with `error`; the queue empties."""
        for call in self._waiting:
            if not call.done.is_set():
                call.error = error
                call.done.set()
        self._queue.clear()

    def _start(self, count: int) -> None:
        """The first `count` workers, ready (start-up fails fast: a typo, a missing package raise here), then the
        scheduler."""
        workers = [self._start_worker(time.monotonic()) for _ in range(count)]
        try:
            ray.get([self._setup_call(worker) for worker in workers], timeout=self.policy.start_timeout_s)
        except GetTimeoutError:
            self._release_all()
            pool = self.bounds.pool
            raise self.error_type(
                f"no {self.noun} was ready within {self.policy.start_timeout_s:g} s: the cluster may lack the "
                f"CPUs/GPUs of spec.resources.{pool} (or a {pool} pod to put them on)"
            ) from None
        except BaseException:
            self._release_all()
            raise
        now = time.monotonic()
        for worker in workers:
            self._mark_ready(worker, now)
        self._thread.start()

    def _start_worker(self, now: float) -> W:
        self._numbered += 1
        worker = self._launch(self._numbered, now)
        self._workers[worker.number] = worker
        self._peak = max(self._peak, len(self._workers))
        return worker

    def _release(self, worker: W, *, after_setup: bool = False) -> None:
        """No longer the pool's: stopped, then killed, when it has no call under way, or when `after_setup` and
        the call under way is its setup (the stop waits behind it, up to the end of its start timeout); killed
        at once otherwise."""
        self._workers.pop(worker.number, None)
        now = time.monotonic()
        kill_at = now + STOP_TIMEOUT_S
        if not self._calls_of(worker):
            call = self._stop_call(worker)
        elif after_setup and not self._is_ready(worker):
            call = self._stop_call(worker)
            kill_at = max(kill_at, worker.started_at + self.policy.start_timeout_s + STOP_TIMEOUT_S)
        else:
            call = None
        if call is None:
            self._kill(worker.number, worker.actor)
        else:
            self._stopping.append(_Stopping(worker.number, worker.actor, call, kill_at))

    def _kill(self, number: int, actor: Any) -> None:
        try:
            ray.kill(actor)
        except Exception as error:  # an actor that is already gone cannot be killed again
            log.debug("%s %d was already gone: %s", self.noun, number, error)

    def _reap(self, now: float) -> None:
        """Kills the released workers whose stop call ended (or failed), or ran past STOP_TIMEOUT_S."""
        if not self._stopping:
            return
        ended, _ = ray.wait([s.call for s in self._stopping], num_returns=len(self._stopping), timeout=0)
        for worker in list(self._stopping):
            if worker.call in ended or now >= worker.kill_at:
                if worker.call not in ended:
                    log.warning("%s %d did not stop in time: killed", self.noun, worker.number)
                self._stopping.remove(worker)
                self._kill(worker.number, worker.actor)

    def _release_all(self) -> None:
        for worker in list(self._workers.values()):
            self._release(worker)

    def _settle_setup(self, worker: W, error: BaseException | None, now: float) -> None:
        """A worker's setup ended: it is ready, or it failed to start (after too many in a row, growth stops)."""
        if error is None:
            self._mark_ready(worker, now)
            self._failed_starts_in_row = 0
            log.info("%s %d ready after %.1f s", self.noun, worker.number, now - worker.started_at)
            return
        self._counts["failed_starts"] += 1
        self._failed_starts_in_row += 1
        log.warning("%s %d failed to start: %s", self.noun, worker.number, error)
        self._release(worker)
        if self._failed_starts_in_row >= self.policy.max_batch_attempts:
            if not self._growth_stopped:
                log.error(
                    "%s pool stops growing: %d in a row failed to start", self.bounds.pool, self._failed_starts_in_row
                )
            self._growth_stopped = True
            if not any(self._is_ready(other) for other in self._workers.values()):
                self._broken = error
                self._fail_waiting(error)

    # -- the scheduler thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._tick()
        except BaseException as error:  # a bug here must not leave a caller waiting forever
            log.exception("the %s pool's scheduler stopped", self.bounds.pool)
            with self._lock:
                self._broken = error
                self._fail_waiting(error)
                self._changed.notify_all()

    def _tick(self) -> None:
        with self._lock:
            owners = {ref: worker for worker in self._workers.values() for ref in self._calls_of(worker)}
        ready: list[Any] = []
        if owners:
            refs = list(owners)
            ready, _ = ray.wait(refs, num_returns=1, timeout=self.policy.interval_s)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            self._stop.wait(self.policy.interval_s)
        outcomes = [(ref, *call_outcome(ref)) for ref in ready]
        with self._lock:
            now = time.monotonic()
            for ref, value, error in outcomes:
                worker = owners[ref]
                if self._workers.get(worker.number) is worker:  # else released or lost already
                    self._settle(worker, ref, value, error, now)
            self._schedule(now)
            self._rescale(now)
            self._reap(now)
            self._changed.notify_all()

    def _rescale(self, now: float) -> None:
        if self._broken is not None or self._stop.is_set():
            return
        for worker in list(self._workers.values()):
            if not self._is_ready(worker) and now - worker.started_at > self.policy.start_timeout_s:
                # the cluster never placed it (no room, no pod): stop counting it as on its way
                self._settle_setup(worker, TimeoutError(f"not ready within {self.policy.start_timeout_s:g} s"), now)
        if self._broken is not None:
            return
        current = len(self._workers)
        idle = self._idle()
        queued, oldest_wait = self._queue_state(now)
        target = decide_pool_size(
            current,
            queued,
            oldest_wait,
            [now - worker.idle_since for worker in idle],
            self.bounds,
            self.policy,
            starting=sum(self._is_starting(worker) for worker in self._workers.values()),
            slots_per_worker=self.slots_per_worker,
        )
        if self._growth_stopped:
            target = min(target, current)
            if target == 0 and queued:
                self._broken = self.error_type(f"no {self.noun} is running and new ones keep failing to start")
                self._fail_waiting(self._broken)
                return
        if target == current:
            return
        if target > current:
            reason = f"{queued} queued, the oldest waited {oldest_wait:.2f} s"
            if current < self.bounds.min_size:
                reason = f"below minReplicas {self.bounds.min_size}"
            for _ in range(target - current):
                self._start_worker(now)
        else:
            # Workers still setting up go first: the work they were asked for is gone, and a ready worker kept
            # instead takes the next request at once (releasing the ready ones left a pool whose one worker
            # was still starting, and the next step waited for it).
            setting_up = [worker for worker in self._workers.values() if not self._is_ready(worker)]
            idle.sort(key=lambda worker: worker.idle_since)
            for worker in (setting_up + idle)[: current - target]:
                self._release(worker, after_setup=True)
            reason = f"{current - target} idle for {self.policy.idle_release_s:g} s or more"
        event = ScaleEvent(now - self._started_at, current, len(self._workers), reason)
        self._events.append(event)
        log.info("%s pool %d -> %d: %s", self.bounds.pool, event.before, event.after, reason)
