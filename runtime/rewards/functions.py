"""Finding a reward function by name and calling it so that one bad sample never ends the job.

`reward.function` in a manifest is a built-in name (`tiny_task`), `package.module:function`, or a
Python file `path/to/reward.py[:function]` (verl's custom_reward_function.path and .name; the name
defaults to compute_score as in verl). `load_reward_function` resolves it once at start, so a typo
fails the job before any GPU time is spent.

Two signatures are accepted. kuberl's is `(completion, sample)`; verl's is `(data_source, solution_str,
ground_truth, extra_info, **kwargs)`, recognised by a parameter named `solution_str` and called with
keywords as verl's reward managers call it, with the values read from the sample's record
(rewards/sample.py). Either may return a score, `(score, {metric: value})`, or verl's
`{"score": score, name: value, ...}`: its numeric entries become metrics (logged as `reward/extra/<name>`), its
`pred` string (the predicted answer, as verl's math_dapo scorer gives it) is kept for validation's majority vote,
and other strings are left out.

`score_safely` wraps every call: a user's function that raises, returns NaN, a string or a malformed
tuple fails that one sample (score 0.0, the reason in `error`, one log line) and the batch goes on;
the controller counts the failures in its metrics.
"""

import hashlib
import importlib.util
import inspect
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kuberl.runtime.rewards.builtin import BUILTIN_REWARDS, RewardFn
from kuberl.runtime.rewards.sample import data_source, extra_info, ground_truth
from kuberl.runtime.user_code import resolve_reference

logger = logging.getLogger(__name__)


class RewardConfigError(ValueError):
    """A reward named in the manifest cannot be used; the message names the field and what to do."""


@dataclass(frozen=True)
class RewardResult:
    """One sample's reward. `error` set means the function failed on this sample and `score` is 0.0. `pred` is
    the answer the scorer read from the response (verl's `pred`), when it says."""

    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    pred: str | None = None


#: The function a reward file names when the reference gives none (verl's custom_reward_function.name default).
DEFAULT_FILE_FUNCTION = "compute_score"


def split_file_reference(ref: str) -> tuple[str, str] | None:
    """(file, function) of a `path/to/reward.py[:function]` reference; None for a built-in or module reference.

    >>> split_file_reference("rewards/gsm8k.py"), split_file_reference("/r/my.py:score"), split_file_reference("a.b:c")
    (('rewards/gsm8k.py', 'compute_score'), ('/r/my.py', 'score'), None)
    """
    path, _, attribute = ref.rpartition(":") if not ref.endswith(".py") else (ref, "", "")
    if not path.endswith(".py"):
        return None
    return path, attribute or DEFAULT_FILE_FUNCTION


def load_reward_function(ref: str, field: str = "spec.reward.function") -> RewardFn:
    """The reward function a manifest names (a built-in, `package.module:function`, or `file.py[:function]`),
    as a kuberl `(completion, sample)` function: a verl-signature function comes wrapped."""
    if ":" not in ref and not ref.endswith(".py"):
        if ref in BUILTIN_REWARDS:
            return BUILTIN_REWARDS[ref]
        raise RewardConfigError(
            f"{field}: unknown built-in reward {ref!r}; built-ins are {', '.join(BUILTIN_REWARDS)}, "
            "or name your own as package.module:function or path/to/reward.py:function"
        )
    in_file = split_file_reference(ref)
    if in_file is None:  # package.module:function
        function = resolve_reference(ref, BUILTIN_REWARDS, field, "reward", RewardConfigError, "function")
    else:
        path, attribute = in_file
        function = getattr(_load_file(path, ref, field), attribute, None)
        if function is None:
            raise RewardConfigError(
                f"{field}: file {path!r} has no attribute {attribute!r} (reward {ref!r}); check the function "
                "name after the colon"
            )
    if not callable(function):
        raise RewardConfigError(
            f"{field}: {ref!r} is a {type(function).__name__}, not a function; "
            "name a function (completion, sample) -> score, or verl's (data_source, solution_str, ground_truth, "
            "extra_info)"
        )
    return verl_adapter(function) if takes_verl_arguments(function) else function


def _load_file(path: str, ref: str, field: str) -> Any:
    """Executes a reward file as a module of its own (named after its path, so two files never collide)."""
    file = Path(path)
    if not file.is_file():
        raise RewardConfigError(
            f"{field}: reward file {path} does not exist (reward {ref!r}); a relative path is read from the "
            "manifest's folder; on Kubernetes put the file in the image or on a mounted volume"
        )
    name = f"kuberl_reward_{file.stem}_{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RewardConfigError(
            f"{field}: reward file {path} failed to load ({type(error).__name__}: {error})"
        ) from error
    return module


def takes_verl_arguments(function: Any) -> bool:
    """verl's reward signature: a parameter named solution_str (verl calls its reward functions by keyword)."""
    try:
        return "solution_str" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def verl_adapter(function: Any) -> RewardFn:
    """A kuberl reward that calls a verl-signature function as verl's reward managers do, by keyword.

    >>> def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ...     return {"score": float(solution_str.strip() == ground_truth), "pred": solution_str, "split": 1}
    >>> verl_adapter(compute_score)(" 72", {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}})
    {'score': 1.0, 'pred': ' 72', 'split': 1}
    """
    parameters = inspect.signature(function).parameters
    open_ended = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())

    def call_verl_reward(completion: str, sample: dict[str, Any]) -> Any:
        arguments = {
            "data_source": data_source(sample),
            "solution_str": completion,
            "ground_truth": ground_truth(sample),
            "extra_info": extra_info(sample),
        }
        return function(**{k: v for k, v in arguments.items() if open_ended or k in parameters})

    call_verl_reward.__qualname__ = getattr(function, "__qualname__", "verl reward")
    return call_verl_reward


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
    pred = None
    if isinstance(result, dict):  # verl's {"score": ..., "acc": ..., "pred": "..."}: the numbers are metrics
        if "score" not in result:
            raise _MalformedReturn(f"returned {_preview(result)}; a dict needs a 'score' entry (verl's form)")
        pred = result["pred"] if isinstance(result.get("pred"), str) else None
        extra = {k: v for k, v in result.items() if k != "score" and _as_float(v) is not None}
        result = (result["score"], extra)
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
    return RewardResult(score, metrics, pred=pred)


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
