"""The elastic reward pool: reward work goes through a queue to a set of reward workers that grows and shrinks.

    pool = RewardPool(spec.reward.to_manifest(), plan.models.get("reward"), topology.reward)
    results = pool.score(prompts, completions, samples)   # one RewardResult per sample, in order
    pool.metrics()                                          # reward/pool_size, reward/scale_ups, ...
    pool.shutdown()

`score` cuts the samples into batches of `reward.batchSize`, queues them and blocks until every
sample has exactly one result. A scheduler thread in the controller's process hands queued batches
to ready workers (RewardWorker Ray actors holding a reward model, a function, or an HTTP endpoint
client; an endpoint worker takes up to maxConcurrency batches at once), collects their answers, and
every `ScalePolicy.interval_s` asks `decide_pool_size` (runtime/pools/autoscale.py, pure) how many workers there
should be, then starts or releases actors. It runs between `score` calls too, so idle workers are
released while the trainer works.

Exactly once. Results are keyed by sample index (ledger.py). A batch whose worker dies is queued
again, at the front, for another worker; a result for an index already filled is dropped. A batch
whose workers died `max_batch_attempts` times, or whose worker raised that often, fails its samples
(score 0.0 with the reason) instead of the job. A worker that fails to start is dropped; after
`max_batch_attempts` such failures in a row the pool stops growing, and with no worker left it
fails the pending `score` calls with the reason.

Starting, releasing and scaling the workers is shared with the rollout pool (elastic_pool.py): each
worker asks Ray for a unit of `kuberl_reward` (api/topology.py `reward_group`), offered one unit per
reward pod, so on Kubernetes an actor the cluster cannot place makes the KubeRay autoscaler add a
reward pod, and a released actor leaves its pod idle for the autoscaler to remove. Without a reward
pool the one worker lives on the head (`kuberl_head`).

Bounded. A worker still busy with a batch `reward.batchTimeoutSeconds` after it was handed over is
stuck (a reward model that never returns, an endpoint that never answers): it is replaced, and its
batches go back to the queue, the late one counting as a failed attempt. Inside a training step,
`score` itself waits at most the step's time left (runtime/deadline.py) and then raises
StepTimeoutError.
"""

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from kuberl.api import RewardSpec
from kuberl.api.topology import ActorGroup
from kuberl.runtime.deadline import StepTimeoutError
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.pools.autoscale import ScalePolicy
from kuberl.runtime.pools.elastic import ElasticPool, PendingCall, PoolWorker
from kuberl.runtime.rewards.functions import RewardResult
from kuberl.runtime.rewards.ledger import ResultLedger
from kuberl.runtime.workers.group import ray_actor_options
from kuberl.runtime.workers.reward_worker import RewardWorker

log = logging.getLogger(__name__)


class RewardPoolError(RuntimeError):
    """The pool cannot score: no reward worker could start, or the pool was shut down."""


@dataclass
class _Job(PendingCall):
    """One `score` call: its samples and their results so far."""

    prompts: list[str]
    completions: list[str]
    samples: list[dict[str, Any]]
    ledger: ResultLedger


@dataclass
class _Batch:
    job: _Job
    indices: list[int]
    enqueued_at: float
    failures: int = 0  # times a worker died, raised or ran out of time holding it
    dispatched_at: float = 0.0  # when the worker now holding it got it


@dataclass
class _Worker(PoolWorker):
    setup_ref: Any | None = None  # the pending setup call; None once the worker is ready
    running: dict[Any, _Batch] = field(default_factory=dict)  # score-call ref -> its batch

    @property
    def ready(self) -> bool:
        return self.setup_ref is None


class RewardPool(ElasticPool[_Worker]):
    """An autoscaled set of reward workers behind a queue; `score` blocks until every sample has one result."""

    noun = "reward worker"
    error_type = RewardPoolError

    def __init__(
        self,
        reward_manifest: dict[str, Any],
        model: ModelLocation | None,
        group: ActorGroup,
        *,
        policy: ScalePolicy | None = None,
    ) -> None:
        super().__init__(group, policy)
        spec = RewardSpec.model_validate(reward_manifest)
        self.batch_size = spec.batch_size
        self.batch_timeout_s = spec.batch_timeout_seconds
        self.slots = spec.endpoint.max_concurrency if spec.endpoint is not None else 1
        self.slots_per_worker = self.slots
        self._manifest = reward_manifest
        self._model = model  # spec.reward.model's location: each worker resolves it on its own node
        self._remote: Any = ray.remote(RewardWorker).options(**ray_actor_options(group), max_concurrency=self.slots)
        self._counts.update(requeued_batches=0, worker_deaths=0, duplicates_dropped=0, batch_timeouts=0)
        self._last_failure: str | None = None
        self._start(group.actors)

    # -- public -----------------------------------------------------------------------------------
    def score(self, prompts: list[str], completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
        """One result per sample, in order; completions[i] answers prompts[i] for samples[i]."""
        if not len(prompts) == len(completions) == len(samples):
            raise ValueError(
                f"{len(prompts)} prompts, {len(completions)} completions, {len(samples)} samples; they must pair up"
            )
        if not completions:
            return []
        job = _Job(prompts, completions, samples, ResultLedger(len(completions)))
        with self._lock:
            if self._broken is not None:
                raise RewardPoolError(f"the reward pool cannot score: {self._broken}") from self._broken
            now = time.monotonic()
            for start in range(0, len(completions), self.batch_size):
                indices = list(range(start, min(start + self.batch_size, len(completions))))
                self._queue.append(_Batch(job, indices, now))
            self._waiting.append(job)
            self._peak = len(self._workers)
            self._dispatch(now)

        def scored() -> str:  # what a step out of time got done
            return f"the reward pool ({len(completions) - job.ledger.missing} of {len(completions)} samples scored)"

        self._await(job, scored)
        if isinstance(job.error, StepTimeoutError):
            raise job.error
        if job.error is not None:
            raise RewardPoolError(f"the reward pool cannot score: {job.error}") from job.error
        results = job.ledger.results()
        self._last_failure = next((result.error for result in reversed(results) if result.error), None)
        return results

    @property
    def last_failure(self) -> str | None:
        """The reason of the last failed sample of the latest `score` call, if one failed."""
        return self._last_failure

    def actors(self, *, busy: bool | None = None) -> list[Any]:
        """Handles of the ready workers' actors; busy=True: only those scoring a batch now, False: only idle ones."""
        with self._lock:
            return [
                worker.actor
                for worker in self._workers.values()
                if worker.ready and (busy is None or bool(worker.running) == busy)
            ]

    # -- the elastic pool's hooks ---------------------------------------------------------------------
    def _launch(self, number: int, now: float) -> _Worker:
        actor = self._remote.remote(number)
        return _Worker(number, actor, now, now, setup_ref=actor.setup.remote(self._manifest, self._model))

    def _setup_call(self, worker: _Worker) -> Any:
        return worker.setup_ref

    def _is_ready(self, worker: _Worker) -> bool:
        return worker.ready

    def _mark_ready(self, worker: _Worker, now: float) -> None:
        worker.setup_ref, worker.idle_since = None, now

    def _calls_of(self, worker: _Worker) -> list[Any]:
        return [worker.setup_ref] if worker.setup_ref is not None else list(worker.running)

    def _queue_state(self, now: float) -> tuple[int, float]:
        return len(self._queue), max((now - batch.enqueued_at for batch in self._queue), default=0.0)

    def _idle(self) -> list[_Worker]:
        return [w for w in self._workers.values() if w.ready and not w.running]

    def _schedule(self, now: float) -> None:
        self._replace_stuck(now)
        self._dispatch(now)

    def _settle(self, worker: _Worker, ref: Any, value: Any, error: BaseException | None, now: float) -> None:
        """Takes in one finished call: a setup or a batch."""
        if worker.setup_ref is not None and ref == worker.setup_ref:
            self._settle_setup(worker, error, now)
            return
        batch = worker.running.pop(ref)
        if error is None:
            try:
                self._counts["duplicates_dropped"] += batch.job.ledger.fill(batch.indices, value)
            except ValueError as mismatch:
                error = mismatch
            else:
                self._finish_if_complete(batch.job)
        if isinstance(error, RayActorError):
            worker.running[ref] = batch
            self._lose(worker, error)
        elif error is not None:
            self._retry_or_fail(batch, f"reward worker {worker.number} raised: {error}")
        if not worker.running:
            worker.idle_since = now

    def _lose(self, worker: _Worker, error: BaseException) -> None:
        """A worker died: its batches go back to the queue for the others."""
        self._counts["worker_deaths"] += 1
        log.warning(
            "reward worker %d died with %d batches in flight; requeued: %s", worker.number, len(worker.running), error
        )
        self._release(worker)
        for batch in worker.running.values():
            self._retry_or_fail(batch, f"reward worker {worker.number} died: {error}")
        worker.running.clear()

    def _replace_stuck(self, now: float) -> None:
        """A worker holding a batch past reward.batchTimeoutSeconds is released; its batches are queued again."""
        for worker in list(self._workers.values()):
            late = {ref for ref, b in worker.running.items() if now - b.dispatched_at > self.batch_timeout_s}
            if not late:
                continue
            self._counts["batch_timeouts"] += len(late)
            reason = (
                f"reward worker {worker.number} was still busy with the batch after {self.batch_timeout_s:g} s "
                "(spec.reward.batchTimeoutSeconds) and was replaced"
            )
            log.warning("%s; %d batches requeued", reason, len(worker.running))
            self._release(worker)
            for ref, batch in worker.running.items():
                if ref in late:
                    self._retry_or_fail(batch, reason)
                elif not batch.job.done.is_set():
                    self._queue.appendleft(batch)  # not its fault: no attempt counted
            worker.running.clear()

    def _retry_or_fail(self, batch: _Batch, reason: str) -> None:
        batch.failures += 1
        if batch.job.done.is_set():
            return
        if batch.failures < self.policy.max_batch_attempts:
            self._queue.appendleft(batch)
            self._counts["requeued_batches"] += 1
            return
        message = f"gave up after {batch.failures} attempts; last: {reason}"
        log.warning("%d samples scored 0.0: %s", len(batch.indices), message)
        batch.job.ledger.fill(batch.indices, [RewardResult(0.0, {}, error=message) for _ in batch.indices])
        self._finish_if_complete(batch.job)

    def _finish_if_complete(self, job: _Job) -> None:
        if job.ledger.complete:
            job.done.set()

    def _dispatch(self, now: float) -> None:
        """Queued batches to ready workers with a free slot, the least loaded first."""
        while self._queue:
            free = [w for w in self._workers.values() if w.ready and len(w.running) < self.slots]
            if not free:
                return
            worker = min(free, key=lambda w: len(w.running))
            batch = self._queue.popleft()
            if batch.job.done.is_set() or all(batch.job.ledger.is_filled(i) for i in batch.indices):
                continue
            batch.job.waits.append(now - batch.enqueued_at)
            batch.dispatched_at = now
            job = batch.job
            ref = worker.actor.score.remote(
                [job.prompts[i] for i in batch.indices],
                [job.completions[i] for i in batch.indices],
                [job.samples[i] for i in batch.indices],
            )
            worker.running[ref] = batch
