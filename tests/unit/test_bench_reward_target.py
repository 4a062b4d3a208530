"""bench/reward_target.py: the step a run reaches a target reward, and the median over repeats (bench/async.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reward_target import first_step_reaching, median_reached  # noqa: E402


def test_first_step_whose_trailing_mean_reaches_the_target() -> None:
    rewards = [0.4, 0.5, 0.9, 0.8, 0.9, 1.0]
    # trailing 3-step means: -, -, 0.6, 0.733, 0.867, 0.9 -> step 4 is the first at >= 0.85
    assert first_step_reaching(rewards, 0.85) == 4
    assert first_step_reaching(rewards, 0.85, window=1) == 2  # one batch at 0.9 is enough with a window of 1
    assert first_step_reaching(rewards, 0.6) == 2  # exactly the target counts


def test_one_lucky_batch_does_not_reach_the_target() -> None:
    assert first_step_reaching([0.4, 1.0, 0.4, 0.5], 0.85) is None


def test_a_run_shorter_than_the_window_never_reaches() -> None:
    assert first_step_reaching([1.0, 1.0], 0.85) is None
    assert first_step_reaching([], 0.85) is None


def test_a_window_below_one_step_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        first_step_reaching([1.0], 0.5, window=0)


def test_median_counts_a_run_that_did_not_reach_as_the_latest() -> None:
    assert median_reached([12.0, None, 10.0]) == 12.0  # 10, 12, never -> the middle run reached at 12
    assert median_reached([10.0, 14.0]) == 12.0
    assert median_reached([10.0, None]) is None  # the median lies halfway to a run that never reached
    assert median_reached([None, None, 3.0]) is None
    assert median_reached([]) is None
