"""When a run reaches a target reward: the step, and the median over repeated runs.

A step "reaches" the target when the mean reward of it and the steps just before it (a trailing window,
3 steps by default) is at least the target: one lucky batch does not count. A run that never reaches it
within its step budget has no time to the target; over repeats it counts as later than every run that did,
so the median is a time only when more than half of the runs reached the target.
"""

import math
import statistics
from collections.abc import Sequence


def first_step_reaching(rewards: Sequence[float], target: float, window: int = 3) -> int | None:
    """The index of the first step whose `window`-step trailing mean reward reaches `target`; None if none does."""
    if window < 1:
        raise ValueError(f"window must be at least 1 step, got {window}")
    for end in range(window, len(rewards) + 1):
        if statistics.fmean(rewards[end - window : end]) >= target:
            return end - 1
    return None


def median_reached(values: Sequence[float | None]) -> float | None:
    """The median of per-run figures (seconds or steps to the target), a run that did not reach it (None) counting
    as later than any that did; None when the median run did not reach it (or there are no runs)."""
    if not values:
        return None
    middle = statistics.median(math.inf if value is None else value for value in values)
    return None if math.isinf(middle) else middle
