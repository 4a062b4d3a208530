"""Reward functions for the reward-pool tests, importable in Ray workers as `tests.integration.runtime.slow_rewards`.

The score is the sample's index, so a test can check that every result belongs to its sample.
"""

import os
import time
from typing import Any

SECONDS_PER_SAMPLE = 0.2


def slow_score(completion: str, sample: dict[str, Any]) -> float:
    """Sleeps (a reward that waits on something, not the CPU), then scores the sample by its index."""
    time.sleep(SECONDS_PER_SAMPLE)
    return float(sample["index"])


def crash_on_index_3(completion: str, sample: dict[str, Any]) -> float:
    """Kills its worker process on sample 3 (a reward that segfaults or runs out of memory); scores the rest."""
    if sample["index"] == 3:
        os._exit(1)
    return float(sample["index"])
