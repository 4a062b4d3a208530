"""Asynchronous rollout (spec.rollout.maxStaleness = k >= 1): generation overlaps the update, within a bound.

    producer = AsyncRollout(pool, start_step=0, end_step=100, max_staleness=1)
    with producer:                                     # a thread on the driver generates ahead
        for step in range(100):
            generated = producer.take(step)            # step's batch, generated with weights >= step - k
            ... train on it (weights step -> step + 1) ...
            producer.publish(buckets, step + 1)        # the pool loads them between two generations

The trainer holds weight version j while it trains step j (version = updates done; 0 is the initial
model), so a sample generated with version g trains a policy j - g versions newer. The producer starts
batch j only once the trainer has published version j - k, and loads the newest published weights
before each generation; `take` checks the versions the batch records, row by row, and generates it
again (with the newest weights) should any row be older than j - k. The bound is enforced there, in one
place: no sample ever trains a policy more than k versions newer than the one that generated it.

Weights reach the pool between generations, never during one: one lock is held for every generation
and every load, and loads run on the producer's thread, so the trainer publishes and goes on without
waiting for a generation to end. With k = 1 this is verl's one-step-off-policy pipeline; larger k lets
the pool run further ahead (AReaL, arXiv 2505.24298, bounds staleness the same way). k = 0 is the
synchronous loop on two threads: step j waits for version j (the driver runs `Controller` instead; the
tests hold the two to the same losses).

Resume: the checkpoint of step N holds the trainer after N updates and the data position of the last
batch trained (steps are a pure function of the step number, runtime/data.py), never of a batch only
generated. Batches in flight when the run stops are dropped and generated again, with the resumed
weights, by the resumed run: no sample trains twice and none is skipped.

Off-policy correction is the controller's own (spec.algorithm.rolloutCorrection, rollout.useEngineLogprobs):
with useEngineLogprobs false the trainer recomputes log pi_old with the current policy (with one PPO epoch
over one mini-batch, in the update's own forward pass) and the truncated weight pi_old / pi_engine corrects
for the stale engine as well: AReaL's decoupled PPO objective, the recommended form. A reference model on a
pool of its own runs its forward on the producer's side, overlapping the update too (AsyncController.generate).
The rules (api/rules.py) refuse k >= 1 with neither.
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from kuberl.runtime.deadline import current_deadline, step_deadline
from kuberl.runtime.loop.controller import Controller, Generated, StageTimes, StepResult
from kuberl.runtime.report.telemetry import (
    GENERATED_TOKENS_PER_SECOND,
    REGENERATED,
    ROLLOUT_IDLE_FRACTION,
    ROLLOUT_VERSION,
    STALENESS_MAX,
    STALENESS_MEAN,
    TRAINER_IDLE_FRACTION,
    TRAINER_VERSION,
)

#: How long `close` waits for a generation under way to end before leaving the thread behind.
CLOSE_WAIT_SECONDS = 60.0


class StalenessBoundError(RuntimeError):
    """A batch was still older than the bound after being generated again with the newest weights."""


class RolloutPool(Protocol):
    """What the producer drives: the engines, their weight version, and a step's scored rollout."""

    @property
    def version(self) -> int:
        """The weight version the engines hold."""
        ...

    def load(self, weights: Any, version: int) -> None:
        """Load `weights` (what the trainer published) into every engine, which then holds `version`."""
        ...

    def generate(self, step: int) -> Generated:
        """Step `step`'s rollout, scored; its rows record the weight version that generated them."""
        ...


def staleness(generated: Generated, trained_version: int) -> torch.Tensor:
    """(N,) how many versions older than `trained_version` each row's generating weights are."""
    versions = generated.generated.weight_version
    if versions is None:
        raise ValueError(f"step {generated.step}'s batch records no weight versions (RolloutBatch.weight_version)")
    return trained_version - versions  # (N,)


class BusyClock:
    """Seconds spent busy so far, the interval under way included: sampled at any time, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0.0
        self._since: float | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            self._since = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                assert self._since is not None
                self._total += time.monotonic() - self._since
                self._since = None

    def total(self) -> float:
        with self._lock:
            ongoing = time.monotonic() - self._since if self._since is not None else 0.0
            return self._total + ongoing


class AsyncRollout:
    """The producer: a thread generating steps [start_step, end_step) ahead of the trainer (see the module)."""

    def __init__(
        self,
        pool: RolloutPool,
        *,
        start_step: int,
        end_step: int,
        max_staleness: int,
        step_timeout_seconds: float | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness {max_staleness}: a sample cannot be generated by a newer policy")
        self.pool = pool
        self.max_staleness = max_staleness
        self.start_step, self.end_step = start_step, end_step
        self.step_timeout_seconds = step_timeout_seconds
        self.engine_lock = threading.Lock()  # held by every generation and every load: they never interleave
        self._changed = threading.Condition()  # guards what follows; notified on every change of it
        self.capacity = max(1, max_staleness)  # batches ready at most: the bound allows no more ahead
        self._ready: deque[Generated] = deque()
        # The newest weights the trainer published, kept until the next ones (one copy of the model in the
        # object store) so that a batch generated again can reload them.
        self._newest: tuple[Any, int] | None = None
        self._published_version = pool.version
        self._error: BaseException | None = None
        self._stopping = False
        self.generating = BusyClock()  # the pool generating or loading
        self.waiting = BusyClock()  # the trainer waiting for a batch
        self.regenerated = 0  # batches generated again because a row broke the bound
        self._thread = threading.Thread(target=self._produce, name="kuberl-async-rollout", daemon=True)

    # -- the trainer's side -------------------------------------------------------------------------
    def __enter__(self) -> "AsyncRollout":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop generating; batches in flight are dropped (a resumed run generates them again)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(CLOSE_WAIT_SECONDS)

    def publish(self, weights: Any, version: int) -> None:
        """The trainer's weights of `version`; the pool loads them before its next generation (older ones it
        has not loaded yet are dropped). Returns at once."""
        with self._changed:
            if version <= self._published_version:
                raise ValueError(f"published weight version {version} after {self._published_version}")
            self._newest, self._published_version = (weights, version), version
            self._changed.notify_all()

    def take(self, step: int) -> Generated:
        """Step `step`'s batch, every row generated with weights no older than step - k (the trainer holds
        version `step`). Waits for it within the step's deadline; raises what the producer raised."""
        deadline = current_deadline()
        with self.waiting.busy(), self._changed:
            while not self._ready and self._error is None:
                left = deadline.time_left() if deadline is not None else None
                if left == 0.0:
                    assert deadline is not None
                    raise deadline.exceeded(f"step {step + 1}'s batch from the asynchronous rollout")
                self._changed.wait(left)
            if self._error is not None:
                raise self._error
            generated = self._ready.popleft()
            self._changed.notify_all()
        if generated.step != step:
            raise RuntimeError(f"the asynchronous rollout handed over step {generated.step + 1} for step {step + 1}")
        if int(staleness(generated, step).max()) > self.max_staleness:
            generated = self._regenerate(step)
        return generated

    @contextmanager
    def newest_weights(self) -> Iterator[None]:
        """The engines to themselves, holding the newest published weights (validation runs in here)."""
        with self.engine_lock:
            self._load_newest()
            yield

    # -- the producer's side ------------------------------------------------------------------------
    def _produce(self) -> None:
        try:
            for step in range(self.start_step, self.end_step):
                if not self._wait_for_turn(step):
                    return
                generated = self._generate(step)
                with self._changed:
                    self._ready.append(generated)
                    self._changed.notify_all()
        except BaseException as error:  # handed to the trainer, which raises it from take()
            with self._changed:
                self._error = error
                self._changed.notify_all()

    def _wait_for_turn(self, step: int) -> bool:
        """Until the queue has room and the trainer has published version step - k; False when stopping."""
        with self._changed:
            while not self._stopping and (
                len(self._ready) >= self.capacity or self._published_version < step - self.max_staleness
            ):
                self._changed.wait()
            return not self._stopping

    def _generate(self, step: int) -> Generated:
        with self.engine_lock, self.generating.busy():
            self._load_newest()
            if self.step_timeout_seconds is None:
                return self.pool.generate(step)
            with step_deadline(step + 1, self.step_timeout_seconds):  # this thread's own deadline
                return self.pool.generate(step)

    def _load_newest(self) -> None:
        """Load the newest published weights if the pool holds others; the caller holds the engine lock."""
        with self._changed:
            newest = self._newest
        if newest is not None and newest[1] != self.pool.version:
            weights, version = newest
            self.pool.load(weights, version)

    def _regenerate(self, step: int) -> Generated:
        """Step `step` generated again, on the trainer's thread, with the newest weights."""
        self.regenerated += 1
        generated = self._generate(step)
        oldest = int(staleness(generated, step).max())
        if oldest > self.max_staleness:
            raise StalenessBoundError(
                f"step {step + 1}: generated again, a sample still comes from weights {oldest} versions older "
                f"than the policy it would train (spec.rollout.maxStaleness {self.max_staleness}); the rollout "
                "pool does not hold the weights it was sent"
            )
        return generated


class ControllerPool:
    """The job's separate rollout pool, as the producer drives it: the controller's generate and pool load."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    @property
    def version(self) -> int:
        return int(self.controller.engines.version)

    def load(self, weights: Any, version: int) -> None:
        self.controller.load_pool(weights, version)

    def generate(self, step: int) -> Generated:
        return self.controller.generate(step)


class AsyncController(Controller):
    """The controller with the rollout up to spec.rollout.maxStaleness versions ahead of the update.

    The stages are the synchronous loop's; only where they run differs: `generate` on the producer's
    thread, `train` on the driver's, and the sync publishes the weights for the producer to load.
    """

    producer: AsyncRollout | None = None

    def generate(self, step: int) -> Generated:
        """The step's rollout and rewards and, with a reference pool of its own, the reference log-probs.

        The reference never changes, so its forward needs no trainer weights: on a pool of its own it runs
        here, on the producer's thread while the trainer updates, instead of before the update. On the
        actor's ranks it stays in `train` (calls from two threads could reach the ranks in different
        orders and cross their collectives).
        """
        generated = super().generate(step)
        if generated.batch is not None and self.groups.reference is not None:
            StageTimes(generated.timings)("reference", self.reference_logprobs, generated.batch)
        return generated

    def run(self, start_step: int, on_step: Callable[[StepResult], None]) -> None:
        if start_step > 0:  # the pool starts from the initial model; the resumed weights are newer
            self.load_pool(self.publish_weights(), start_step)
            self.weight_version = start_step
        producer = AsyncRollout(
            ControllerPool(self),
            start_step=start_step,
            end_step=self.plan.total_steps,
            max_staleness=self.spec.rollout.max_staleness,
            step_timeout_seconds=self.spec.training.step_timeout_seconds,
        )
        self.producer = producer
        window = Window(producer)
        with producer:
            for step in range(start_step, self.plan.total_steps):
                with step_deadline(step + 1, self.spec.training.step_timeout_seconds):
                    generated = producer.take(step)
                    result = self.train(generated)
                result.metrics.update(self.async_metrics(generated, window))
                self.validate_when_due(result)
                on_step(result)

    def train(self, generated: Generated) -> StepResult:
        result = super().train(generated)
        if generated.batch is None:  # dynamic sampling left nothing to train: the same weights go out as the
            # next version, or the producer would wait forever for a version the trainer never publishes
            result.metrics.update(self.sync(None, generated.step + 1))
        return result

    def sync(self, batch: Any, version: int) -> dict[str, float]:
        """The new weights published for the producer, which loads them between two generations."""
        assert self.producer is not None
        started = time.perf_counter()
        self.producer.publish(self.publish_weights(), version)
        self.weight_version = version
        return {"sync/publish_seconds": time.perf_counter() - started}

    def validate(self, step: int) -> dict[str, float]:
        """Validation of the policy after step `step`: the pool loads it first, and generates nothing else meanwhile."""
        assert self.producer is not None
        with self.producer.newest_weights():
            return super().validate(step)

    def async_metrics(self, generated: Generated, window: "Window") -> dict[str, float]:
        """Staleness of the step's samples, idle fractions and versions of both sides, wall-clock throughput."""
        assert self.producer is not None
        lag = staleness(generated, generated.step).float()  # (N,)
        seconds, rollout_busy, trainer_waiting = window.advance()
        tokens = float(generated.generated.response_mask.sum())
        return {
            STALENESS_MEAN: float(lag.mean()),
            STALENESS_MAX: float(lag.max()),
            ROLLOUT_IDLE_FRACTION: max(0.0, 1.0 - rollout_busy / seconds),
            TRAINER_IDLE_FRACTION: min(1.0, trainer_waiting / seconds),
            TRAINER_VERSION: float(generated.step),
            ROLLOUT_VERSION: float(self.engines.version),
            REGENERATED: float(self.producer.regenerated),
            GENERATED_TOKENS_PER_SECOND: tokens / seconds,
            "time/step": seconds,  # wall clock: the stages overlap, so their sum would overstate it
        }


class Window:
    """Consecutive spans of wall-clock time, one per step, and what each side did in each."""

    def __init__(self, producer: AsyncRollout) -> None:
        self.producer = producer
        self.started = time.monotonic()
        self.busy = producer.generating.total()
        self.waiting = producer.waiting.total()

    def advance(self) -> tuple[float, float, float]:
        """(seconds, of which the pool was generating, of which the trainer waited) since the last call."""
        now, busy, waiting = time.monotonic(), self.producer.generating.total(), self.producer.waiting.total()
        span = (max(now - self.started, 1e-9), busy - self.busy, waiting - self.waiting)
        self.started, self.busy, self.waiting = now, busy, waiting
        return span
