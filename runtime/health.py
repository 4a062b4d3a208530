"""Whether a run is still worth running, judged after every step: non-finite updates and failing rewards.

    health = RunHealth.from_spec(job.spec)
    health.restore(checkpointing.resumed_state)              # a resumed run goes on with the window it saved
    failure = health.observe(step, metrics, reward_error)   # None, or the JobFailed that ends the job
    health.may_checkpoint                                    # False while non-finite steps are in a row
    health.state()                                           # saved with each checkpoint

Pure: fed one step's metrics at a time, no clock, no I/O. The driver (runtime/main.py) saves a
checkpoint only when `may_checkpoint`, so `checkpoint.keepLast` never rotates out the checkpoints from
before a run of NaN steps in favour of ones written during it; on a failure it publishes the newest
checkpoint in status and raises.

Non-finite. The trainer (engines/fsdp.py) skips an optimiser step whose loss or gradient norm is NaN
or infinite and reports the share it skipped as `actor/update_skipped` (`critic/...`). A training step
with any skipped update counts; `training.maxNonFiniteSteps` of them in a row fail the job.

Reward failures. A sample whose reward failed (raised, timed out, returned no finite number) scores
0.0 and teaches nothing. Over the last `reward.failureWindowSteps` steps, a failed share above
`reward.maxFailureFraction` fails the job with a reason that names the reward, once the window is full,
and at the run's last step over the steps it has: a run shorter than the window is judged too, so a job
whose rewards all failed never ends as a success with an exported model. The window is saved with each
checkpoint (`state`), so a resumed run judges the same steps as one that never stopped.
The driver saves no checkpoint of a step that fails the job: a restart runs that step again and judges it
again, instead of finding a finished run to export.
"""

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kuberl.api.spec import RewardSpec, RLJobSpec

#: The key of the reward window in a checkpoint's train state.
REWARD_WINDOW_KEY = "reward_failure_window"
#: Per-step metrics (updates.py) with the share of optimiser updates skipped for a non-finite loss or norm.
SKIPPED_UPDATE_METRICS = ("actor/update_skipped", "critic/update_skipped")


class RunStopped(RuntimeError):
    """The run stops here: the message says why. The driver adds the newest committed checkpoint to it."""

    def with_checkpoint(self, ref: Any) -> "RunStopped":
        """The same stop, naming the newest committed checkpoint (a CheckpointRef, or None)."""
        kept = f"the latest checkpoint, kept: {ref.uri} (step {ref.step})" if ref else "no checkpoint was saved"
        return type(self)(f"{self}; {kept}")


class JobFailed(RunStopped):
    """The job cannot go on: the message says why and names the spec field that set the limit."""


class NonFiniteUpdatesError(JobFailed):
    """training.maxNonFiniteSteps steps in a row had a NaN or infinite loss or gradient norm."""


class RewardFailureError(JobFailed):
    """More than reward.maxFailureFraction of the samples' rewards failed over the window."""


def reward_name(spec: RewardSpec) -> str:
    """What a reason calls the reward: the function, the model's location, or the endpoint's URL."""
    if spec.function is not None:
        return f"function {spec.function}"
    if spec.model is not None:
        return f"model {spec.model.path}"
    assert spec.endpoint is not None
    return f"endpoint {spec.endpoint.url.split('?', 1)[0]}"  # a query may carry a key


@dataclass
class NonFiniteSteps:
    limit: int
    streak: list[int] = field(default_factory=list)  # the steps of the current run of non-finite ones

    def observe(self, step: int, metrics: Mapping[str, float]) -> NonFiniteUpdatesError | None:
        skipped = [metrics.get(name, 0.0) for name in SKIPPED_UPDATE_METRICS]
        if not any(share != 0.0 for share in skipped):  # a NaN share counts as skipped too
            self.streak.clear()
            return None
        self.streak.append(step)
        if len(self.streak) < self.limit:
            return None
        return NonFiniteUpdatesError(
            f"steps {self.streak[0]} to {step}: the loss or gradient norm was NaN or infinite in {len(self.streak)} "
            f"steps in a row (spec.training.maxNonFiniteSteps: {self.limit}); their updates were skipped and no "
            f"checkpoint was saved after step {self.streak[0] - 1}"
        )


@dataclass
class RewardFailures:
    max_fraction: float
    window: int
    samples_per_step: int  # what a step scores without dynamic sampling's extra rounds
    name: str
    steps: deque[tuple[float, float]] = field(init=False)  # (failed, scored) of the last `window` steps

    def __post_init__(self) -> None:
        self.steps = deque(maxlen=self.window)

    def restore(self, steps: list[list[float]]) -> None:
        """The window as a checkpoint saved it: (failed, scored) of its last steps, oldest first."""
        self.steps.extend((float(failed), float(scored)) for failed, scored in steps)

    def observe(
        self, step: int, metrics: Mapping[str, float], example: str | None, final: bool = False
    ) -> RewardFailureError | None:
        """Takes in step `step`; judged once the window is full, and at the run's `final` step whatever it holds."""
        self.steps.append((metrics.get("reward/failed", 0.0), metrics.get("reward/samples", self.samples_per_step)))
        if len(self.steps) < self.window and not final:
            return None
        failed, scored = sum(f for f, _ in self.steps), sum(n for _, n in self.steps)
        if not failed / scored > self.max_fraction:
            return None
        last = f"; the last failure: {example}" if example else ""
        return RewardFailureError(
            f"reward {self.name} failed on {failed:g} of {scored:g} samples ({failed / scored:.0%}) in steps "
            f"{step - len(self.steps) + 1} to {step}, more than spec.reward.maxFailureFraction "
            f"({self.max_fraction:g}){last}"
        )


@dataclass
class RunHealth:
    non_finite: NonFiniteSteps
    rewards: RewardFailures

    @staticmethod
    def from_spec(spec: RLJobSpec) -> "RunHealth":
        assert spec.algorithm.group_size is not None  # the API fills it from the algorithm's preset
        return RunHealth(
            NonFiniteSteps(spec.training.max_non_finite_steps),
            RewardFailures(
                spec.reward.max_failure_fraction,
                spec.reward.failure_window_steps,
                spec.data.batch_size * spec.algorithm.group_size,
                reward_name(spec.reward),
            ),
        )

    def observe(
        self, step: int, metrics: Mapping[str, float], reward_error: str | None = None, *, final: bool = False
    ) -> JobFailed | None:
        """Takes in step `step` (1-based), `final` when it is the run's last; the failure that ends the job, or None."""
        return self.non_finite.observe(step, metrics) or self.rewards.observe(step, metrics, reward_error, final)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run's health: the reward window (a run of NaN steps is never saved)."""
        return {REWARD_WINDOW_KEY: [list(step) for step in self.rewards.steps]}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Goes on from a checkpoint's `state` (a checkpoint an older kuberl wrote has none: an empty window)."""
        self.rewards.restore(state.get(REWARD_WINDOW_KEY, []))

    @property
    def may_checkpoint(self) -> bool:
        """False while the latest steps were non-finite: their state is not one to keep over older ones."""
        return not self.non_finite.streak
