"""The metrics of a step's batches: what was generated (rewards, lengths) and what trained (KL, advantages).

Pure functions of the batches; the names that others read too (the plot, the status) are metrics.py's.
"""

from collections import defaultdict

from kuberl.runtime.algorithms.masked import masked_mean
from kuberl.runtime.algorithms.shaping import overlong_penalty
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.loop.settings import OverlongShaping
from kuberl.runtime.report.telemetry import KL_MEAN, RESPONSE_LENGTH_MEAN, REWARD_EXTRA_PREFIX, REWARD_MEAN
from kuberl.runtime.rewards.functions import RewardResult


def reward_metrics(generated: RolloutBatch, max_new_tokens: int, overlong: OverlongShaping | None) -> dict[str, float]:
    """Rewards and lengths of every response generated in a step (over all dynamic-sampling rounds).

    reward/mean and reward/std count only samples whose reward succeeded, and include any overlong
    penalty (they are what the advantages see); reward/overlong_penalty_mean shows the penalty's part.
    For episodes, env/reward_turns_<k> is the mean reward of the episodes in which the model wrote k messages.
    """
    assert generated.scores is not None and generated.scored is not None
    scored = generated.scored  # (N,)
    scores = generated.scores[scored]  # (n,)
    lengths = generated.response_lengths  # (N,)
    metrics = {
        REWARD_MEAN: float(scores.mean()) if len(scores) else 0.0,
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/failed": float((~scored).sum()),
        "reward/samples": float(len(scored)),  # responses scored, over every round (runtime/health.py)
        RESPONSE_LENGTH_MEAN: float(lengths.mean()),
        "response/clip_fraction": float((lengths >= max_new_tokens).float().mean()),
        "rollout/tokens": float(generated.response_mask.sum()),
    }
    if generated.turn_index is not None:  # episodes: the mean reward of those that took k turns
        turns = generated.turns[scored]  # (n,)
        for count in sorted(set(turns.tolist())):
            metrics[f"env/reward_turns_{count}"] = float(scores[turns == count].mean())
    if overlong is not None and len(scores):
        penalty = overlong_penalty(lengths[scored], max_new_tokens, overlong.buffer_length, overlong.penalty_factor)
        metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
        metrics["reward/overlong_fraction"] = float((penalty < 0).float().mean())
    return metrics


def reward_extra_metrics(results: list[RewardResult]) -> dict[str, float]:
    """`reward/extra/<name>`: the mean, over the step's scored responses that have it, of each number a reward
    returned beside its score (verl's `acc`, ...).

    >>> reward_extra_metrics([RewardResult(1.0, {"acc": 1.0}), RewardResult(-1.0, {"acc": 0.0}),
    ...                       RewardResult(0.0, {"acc": 1.0}, error="timed out")])
    {'reward/extra/acc': 0.5}
    """
    values: dict[str, list[float]] = defaultdict(list)
    for result in results:
        if result.error is None:
            for name, value in result.metrics.items():
                values[name].append(value)
    return {f"{REWARD_EXTRA_PREFIX}{name}": sum(found) / len(found) for name, found in sorted(values.items())}


def trained_batch_metrics(batch: RolloutBatch, engine_is_behaviour: bool) -> dict[str, float]:
    """Of the batch that trained: KL to the reference, the engine-trainer log-prob gap, the mean advantage."""
    mask = batch.response_mask
    metrics: dict[str, float] = {}
    if batch.ref_logprobs is not None and batch.old_logprobs is not None:
        metrics[KL_MEAN] = float(masked_mean(batch.old_logprobs - batch.ref_logprobs, mask))
    if batch.engine_logprobs is not None and batch.old_logprobs is not None and not engine_is_behaviour:
        diff = (batch.engine_logprobs - batch.old_logprobs).abs() * mask
        metrics["rollout/logprob_diff_max"] = float(diff.max())
    if batch.advantages is not None:
        metrics["advantage/mean"] = float(masked_mean(batch.advantages, mask))
    return metrics
