"""Finding a reward function by name and calling it so that one bad sample never ends the job.

`reward.function` in a manifest is a built-in name (`tiny_task`) or `package.module:function`.
`load_reward_function` resolves it once at start, so a typo fails the job before any GPU time
is spent. `score_safely` wraps every call: a user's function that raises, returns NaN, a
string or a malformed tuple fails that one sample (score 0.0, the reason in `error`, one log
line) and the batch goes on; the controller counts the failures in its metrics.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from kuberl.runtime.rewards.builtin import BUILTIN_REWARDS, RewardFn
from kuberl.runtime.user_code import resolve_reference

logger = logging.getLogger(__name__)


class RewardConfigError(ValueError):
    """A reward named in the manifest cannot be used; the message names the field and what to do."""


@dataclass(frozen=True)
class RewardResult:
    """One sample's reward. `error` set means the function failed on this sample and `score` is 0.0."""

    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def load_reward_function(ref: str, field: str = "spec.reward.function") -> RewardFn:
    """The reward function a manifest names: a built-in, or `package.module:function` imported from the image."""
    function = resolve_reference(ref, BUILTIN_REWARDS, field, "reward", RewardConfigError, "function")
    if not callable(function):
        raise RewardConfigError(
            f"{field}: {ref!r} is a {type(function).__name__}, not a function; "
            "name a function (completion, sample) -> score"
        )
    return function  # type: ignore[no-any-return]


class _MalformedReturn(ValueError):
    """A reward function returned something that is not a score or (score, metrics)."""


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_float(value: Any) -> float | None:
    """A finite float from a score or metric value; None if it is not a number (strings are not numbers)."""
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        return None
    try:
        number = float(value)  # bool -> 0.0/1.0, numpy and 0-d torch scalars convert too
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _check_result(result: Any) -> RewardResult:
    """RewardResult for a well-formed return value; raises _MalformedReturn naming what is wrong otherwise."""
    if isinstance(result, tuple):
        if len(result) != 2 or not isinstance(result[1], dict):
            raise _MalformedReturn(f"returned {_preview(result)}; expected a score or (score, {{metric: value}})")
        raw_score, raw_metrics = result
    else:
        raw_score, raw_metrics = result, {}
    score = _as_float(raw_score)
    if score is None:
        raise _MalformedReturn(
            f"returned score {_preview(raw_score)} ({type(raw_score).__name__}); expected a finite number"
        )
    metrics: dict[str, float] = {}
    for name, raw_value in raw_metrics.items():
        value = _as_float(raw_value)
        if not isinstance(name, str) or value is None:
            raise _MalformedReturn(
                f"returned metric {_preview(name)}: {_preview(raw_value)}; metrics must map names to finite numbers"
            )
        metrics[name] = value
    return RewardResult(score, metrics)


def checked_reward(value: Any, source: str) -> RewardResult:
    """A RewardResult from what a reward (or an environment's `reward`) returned; never raises.

    A value that is not a finite score or (score, metrics) fails the sample, the reason naming `source`.
    """
    try:
        return _check_result(value)
    except _MalformedReturn as error:
        logger.warning("%s failed on a sample, scored 0.0: %s", source, error)
        return RewardResult(0.0, {}, error=f"{source} {error}")


def score_safely(fn: RewardFn, completion: str, sample: dict[str, Any]) -> RewardResult:
    """Calls a reward function on one sample; never raises. A failure scores 0.0 and carries its reason."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        return _check_result(fn(completion, sample))
    except Exception as error:  # a user's function may raise anything; the job must go on
        reason = str(error) if isinstance(error, _MalformedReturn) else f"{type(error).__name__}: {error}"
        logger.warning("reward %s failed on a sample, scored 0.0: %s", name, reason)
        return RewardResult(0.0, {}, error=reason)


def score_batch(fn: RewardFn, completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
    """score_safely over pairs; completions[i] answers samples[i]."""
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions but {len(samples)} samples; they must pair up")
    return [score_safely(fn, completion, sample) for completion, sample in zip(completions, samples, strict=True)]
