"""Reward functions for the reward-pool and job tests, importable in Ray workers (and in the child process a
reward function runs in) as `tests.integration.runtime.slow_rewards`.

Most score the sample's index, so a test can check that every result belongs to its sample.
"""

import os
import signal
import time
from typing import Any

SECONDS_PER_SAMPLE = 0.2


def slow_score(completion: str, sample: dict[str, Any]) -> float:
    """Sleeps (a reward that waits on something, not the CPU), then scores the sample by its index."""
    time.sleep(SECONDS_PER_SAMPLE)
    return float(sample["index"])


def kill_worker_on_index_3(completion: str, sample: dict[str, Any]) -> float:
    """Kills its reward worker (the parent of the process a reward function runs in) on sample 3: the
    worker's process dies, as when the OOM killer or a lost node takes it; scores the rest."""
    if sample["index"] == 3:
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    return float(sample["index"])


def sleep_forever_on_index_1(completion: str, sample: dict[str, Any]) -> float:
    """Never returns on sample 1 (a reward stuck on a socket or in a loop); scores the rest by index."""
    while sample["index"] == 1:
        time.sleep(3600)
    return float(sample["index"])


def exit_on_index_1(completion: str, sample: dict[str, Any]) -> float:
    """Ends its process on sample 1 (a segfault in a native library); scores the rest by index."""
    if sample["index"] == 1:
        os._exit(3)
    return float(sample["index"])


def overflow_on_poison(completion: str, sample: dict[str, Any]) -> float:
    """The demo reward, but 1e39 for records marked "poison": finite here, infinite as a float32 score, so the
    advantages and the loss of that step are NaN (a reward model emitting an enormous logit does the same)."""
    from kuberl.runtime.rewards.builtin import tiny_task

    return 1e39 if sample.get("poison") else tiny_task(completion, sample)[0]


def always_raises(completion: str, sample: dict[str, Any]) -> float:
    """A reward that fails on every sample (a judge whose API key expired)."""
    raise PermissionError("the judge refused the API key")


def sleep_forever(completion: str, sample: dict[str, Any]) -> float:
    """Never returns (a judge that hangs on every request)."""
    while True:
        time.sleep(3600)
