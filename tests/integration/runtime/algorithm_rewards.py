"""Rewards for the algorithm runs, importable in Ray workers as `tests.integration.runtime.algorithm_rewards`."""

from typing import Any

from kuberl.runtime.rewards.builtin import tiny_task


def flaky_tiny_task(completion: str, sample: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The demo task's reward, except that it fails (raises) on about one response in seven: a reward service
    that times out now and then. Deterministic in the completion, so a run replays."""
    if len(completion) % 7 == 3:
        raise TimeoutError("the reward service did not answer (flaky_tiny_task)")
    return tiny_task(completion, sample)
