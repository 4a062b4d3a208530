"""The asynchronous rollout's staleness bound (spec.rollout.maxStaleness), with the races provoked on purpose.

The trainer holds weight version j while it trains step j, so a row generated with version g lags it by
j - g versions; the bound says j - g <= k for every row of every step. The pool here is a stand-in
(`RecordingPoolStandIn`): a unit test cannot start Ray replicas with engines. It records every generation
and weight load in order, with the version it held, so a test sees exactly what the producer made it do.
"""

import threading
import time

import pytest
import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.deadline import StepTimeoutError, step_deadline
from kuberl.runtime.loop.async_controller import AsyncRollout, StalenessBoundError
from kuberl.runtime.loop.controller import Generated

ROWS = 4
WAIT = 5.0  # seconds a test waits for something that must happen; a correct producer takes milliseconds


class RecordingPoolStandIn:
    """Stands in for the separate rollout pool: holds a weight version, stamps it on the rows it "generates",
    and records every generation and load (with the version held) in the order they ran.

    `gates[step]`: that step's generation waits for the event. `forget_weights_at[step]`: during that step's
    generation the pool falls back to the initial model (version 0), as a replica that restarted would.
    """

    def __init__(self, version: int = 0, generate_seconds: float = 0.0, load_seconds: float = 0.0) -> None:
        self.version = version
        self.generate_seconds, self.load_seconds = generate_seconds, load_seconds
        self.events: list[tuple[str, int, int]] = []  # (what, step or loaded version, version held)
        self.started: dict[int, threading.Event] = {}
        self.gates: dict[int, threading.Event] = {}
        self.forget_weights_at: set[int] = set()
        self.failure_at: dict[int, Exception] = {}
        self.overlaps = 0  # a load and a generation (or two of either) that ran at the same time
        self._engine = threading.Lock()

    def started_event(self, step: int) -> threading.Event:
        return self.started.setdefault(step, threading.Event())

    def _enter(self) -> None:
        if not self._engine.acquire(blocking=False):
            self.overlaps += 1
            self._engine.acquire()

    def load(self, weights: object, version: int) -> None:
        self._enter()
        try:
            self.events.append(("load", version, self.version))
            time.sleep(self.load_seconds)
            self.version = version
        finally:
            self._engine.release()

    def generate(self, step: int) -> Generated:
        self._enter()
        try:
            if step in self.forget_weights_at:
                self.forget_weights_at.discard(step)
                self.version = 0
            held = self.version
            self.events.append(("generate-start", step, held))
            self.started_event(step).set()
            if step in self.gates:
                assert self.gates[step].wait(WAIT)
            time.sleep(self.generate_seconds)
            if step in self.failure_at:
                raise self.failure_at[step]
            self.events.append(("generate-end", step, self.version))
            return generated_batch(step, held)
        finally:
            self._engine.release()

    def generated_steps(self) -> list[int]:
        return [step for what, step, _ in self.events if what == "generate-end"]


def generated_batch(step: int, version: int) -> Generated:
    rows = RolloutBatch(
        prompt_ids=torch.zeros(ROWS, 2, dtype=torch.long),
        prompt_mask=torch.ones(ROWS, 2, dtype=torch.long),
        response_ids=torch.zeros(ROWS, 3, dtype=torch.long),
        response_mask=torch.ones(ROWS, 3),
        group_index=torch.arange(ROWS),
        weight_version=torch.full((ROWS,), version, dtype=torch.long),
    )
    return Generated(step, 0, rows, rows, {}, {})


def take(producer: AsyncRollout, step: int, seconds: float = WAIT) -> Generated:
    with step_deadline(step + 1, seconds):  # a producer that never delivers fails the test instead of hanging it
        return producer.take(step)


def train(producer: AsyncRollout, steps: range, train_seconds: float) -> dict[int, list[int]]:
    """The trainer's loop: take step j, "update" (sleep), publish version j + 1. Each step's row versions."""
    trained = {}
    for step in steps:
        generated = take(producer, step)
        assert generated.generated.weight_version is not None
        trained[step] = generated.generated.weight_version.tolist()
        time.sleep(train_seconds)
        producer.publish(object(), step + 1)
    return trained


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize(
    ("generate_seconds", "train_seconds"), [(0.0, 0.02), (0.02, 0.0)], ids=["slow-trainer", "slow-generator"]
)
def test_no_sample_trains_a_policy_more_than_k_versions_newer_than_its_generator(k, generate_seconds, train_seconds):
    pool = RecordingPoolStandIn(generate_seconds=generate_seconds)
    with AsyncRollout(pool, start_step=0, end_step=10, max_staleness=k) as producer:
        trained = train(producer, range(10), train_seconds)
    lags = {step: [step - version for version in versions] for step, versions in trained.items()}
    assert all(0 <= lag <= k for step_lags in lags.values() for lag in step_lags), lags
    assert pool.overlaps == 0  # no load ever ran inside a generation


def test_the_pool_generates_the_next_batch_while_the_trainer_trains():
    pool = RecordingPoolStandIn()
    with AsyncRollout(pool, start_step=0, end_step=4, max_staleness=1) as producer:
        assert take(producer, 0).step == 0
        # step 0 is "training" and publishes nothing yet: step 1 is generated meanwhile, with version 0
        assert pool.started_event(1).wait(WAIT)
        producer.publish(object(), 1)
        step1 = take(producer, 1)
    assert step1.generated.weight_version.tolist() == [0] * ROWS  # one version behind the policy it trains


def test_the_pool_runs_no_more_than_k_steps_ahead_of_the_published_weights():
    pool = RecordingPoolStandIn()
    with AsyncRollout(pool, start_step=0, end_step=6, max_staleness=2) as producer:
        for step in range(3):  # nothing is published: steps 0, 1 and 2 may use version 0 (2 - 0 <= k)
            assert take(producer, step).generated.weight_version.tolist() == [0] * ROWS
        with pytest.raises(StepTimeoutError, match="asynchronous rollout"):
            take(producer, 3, seconds=0.3)  # step 3 needs version 1, which never came
    assert pool.generated_steps() == [0, 1, 2]


def test_a_weight_update_that_lands_mid_generation_waits_for_the_generation_to_end():
    pool = RecordingPoolStandIn()
    release = threading.Event()
    pool.gates[1] = release
    with AsyncRollout(pool, start_step=0, end_step=3, max_staleness=1) as producer:
        take(producer, 0)
        assert pool.started_event(1).wait(WAIT)
        producer.publish(object(), 1)  # returns at once: the trainer never waits for a generation
        release.set()
        step1 = take(producer, 1)
        producer.publish(object(), 2)
        step2 = take(producer, 2)
    assert (
        pool.events[2:7]
        == [
            ("generate-start", 1, 0),
            ("generate-end", 1, 0),  # the version it started with: the load did not land inside it
            ("load", 1, 0),
            ("generate-start", 2, 1),
            ("generate-end", 2, 1),
        ]
        or pool.events[2:7]
        == [
            ("generate-start", 1, 0),
            ("generate-end", 1, 0),
            ("load", 2, 0),  # the trainer was quicker: version 1 was never loaded, 2 replaced it
            ("generate-start", 2, 2),
            ("generate-end", 2, 2),
        ]
    )
    assert step1.generated.weight_version.tolist() == [0] * ROWS
    assert min(step2.generated.weight_version.tolist()) >= 1
    assert pool.overlaps == 0


def test_validation_gets_the_engines_to_itself_with_the_newest_weights():
    pool = RecordingPoolStandIn()
    release = threading.Event()
    pool.gates[1] = release
    with AsyncRollout(pool, start_step=0, end_step=3, max_staleness=1) as producer:
        take(producer, 0)
        assert pool.started_event(1).wait(WAIT)
        producer.publish(object(), 1)
        threading.Timer(0.1, release.set).start()
        with producer.newest_weights():  # waits for generation 1 to end, then loads version 1
            held = pool.version
            events = list(pool.events)
    assert held == 1
    assert events[-3:] == [("generate-start", 1, 0), ("generate-end", 1, 0), ("load", 1, 0)]
    assert pool.overlaps == 0


def test_a_batch_that_breaks_the_bound_is_generated_again_with_the_newest_weights():
    pool = RecordingPoolStandIn()
    pool.forget_weights_at.add(3)  # step 3 comes back generated by the initial model: 3 versions behind
    with AsyncRollout(pool, start_step=0, end_step=5, max_staleness=1) as producer:
        trained = train(producer, range(5), train_seconds=0.01)
        regenerated = producer.regenerated
    assert regenerated == 1
    assert all(step - version <= 1 for step, versions in trained.items() for version in versions), trained
    assert pool.generated_steps().count(3) == 2


def test_a_pool_that_cannot_hold_the_weights_fails_the_step_naming_the_bound():
    pool = RecordingPoolStandIn()
    pool.forget_weights_at.add(2)
    original = pool.load

    def load_that_forgets(weights: object, version: int) -> None:
        original(weights, version)
        if version == 2:
            pool.forget_weights_at.add(2)  # the reload does not stick either

    pool.load = load_that_forgets  # type: ignore[method-assign]
    with AsyncRollout(pool, start_step=0, end_step=4, max_staleness=1) as producer:
        with pytest.raises(StalenessBoundError, match="maxStaleness 1"):
            train(producer, range(4), train_seconds=0.0)


def test_an_error_in_the_producer_is_raised_by_the_trainers_take():
    pool = RecordingPoolStandIn()
    pool.failure_at[1] = RuntimeError("the reward pool is gone")
    with AsyncRollout(pool, start_step=0, end_step=3, max_staleness=1) as producer:
        take(producer, 0)
        with pytest.raises(RuntimeError, match="the reward pool is gone"):
            take(producer, 1)


def test_a_resumed_producer_starts_at_the_checkpoint_and_drops_what_was_in_flight():
    first = RecordingPoolStandIn()
    with AsyncRollout(first, start_step=0, end_step=6, max_staleness=2) as producer:
        trained = train(producer, range(2), train_seconds=0.0)  # stopped (preempted) after step 2
    resumed_pool = RecordingPoolStandIn(version=2)  # the resumed pool holds the checkpoint's weights
    with AsyncRollout(resumed_pool, start_step=2, end_step=6, max_staleness=2) as producer:
        trained.update(train(producer, range(2, 6), train_seconds=0.0))
    assert sorted(trained) == list(range(6))  # every step trained once, none skipped
    assert resumed_pool.generated_steps() == [2, 3, 4, 5]  # steps generated before the stop, generated again
    assert trained[2] == [2] * ROWS  # with the resumed weights


def test_close_returns_while_the_producer_waits_for_weights():
    pool = RecordingPoolStandIn()
    producer = AsyncRollout(pool, start_step=0, end_step=10, max_staleness=1)
    with producer:
        take(producer, 0)
        take(producer, 1)  # step 2 needs version 1: the producer waits
    assert not producer._thread.is_alive()
