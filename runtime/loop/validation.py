"""Validation scores: how the policy does on held-out prompts (spec.data.validation).

Every validation prompt is answered greedily once and sampled k = groupSize times at the rollout
temperature. The scores (metric names as written to metrics.jsonl, TensorBoard and the status):
- val/greedy_mean: mean score of the greedy responses;
- val/mean@k: mean score of the sampled responses;
- for a reward that is 0 or 1 (every score either; "correct" is 1):
  - val/pass@k: share of prompts with at least one correct response among the k;
  - val/maj@k: share of prompts whose most frequent final answer among the k is correct (the first
    response with that answer stands for it; ties go to the answer that came first). The final answer
    is what `extract_final_answer` finds (boxed, ####, <answer>, last number), else the whole text.
A sample whose reward failed counts in no mean and is never correct.
Follows verl's validation metrics (mean@N, best@N, maj@N) on their common ground; verl's pass@k is
its best@k for a 0/1 reward.
"""

from collections import Counter
from dataclasses import dataclass

from kuberl.runtime.report.telemetry import GREEDY_MEAN
from kuberl.runtime.rewards.builtin import extract_final_answer

#: Metric names; k is the number of sampled responses per prompt.
SAMPLES = "val/samples"


def at_k(name: str, k: int) -> str:
    """The name of a metric over k samples, e.g. at_k("mean", 8) == "val/mean@8"."""
    return f"val/{name}@{k}"


@dataclass(frozen=True)
class Scored:
    text: str
    score: float
    ok: bool  # the reward succeeded


def answer_key(text: str) -> str:
    """The final answer of a response, for majority voting.

    >>> answer_key("so it is 12, #### 12"), answer_key("count: 6 7  8")
    ('12', '8')
    >>> answer_key("no answer here")
    'no answer here'
    """
    answer = extract_final_answer(text)
    return (answer if answer is not None else " ".join(text.split())).strip()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def validation_metrics(greedy: list[Scored], sampled: list[list[Scored]]) -> dict[str, float]:
    """The metrics above from each prompt's greedy response and its k sampled ones.

    >>> right, wrong = Scored("#### 1", 1.0, True), Scored("#### 2", 0.0, True)
    >>> metrics = validation_metrics([right, wrong], [[right, wrong, wrong], [wrong, right, right]])
    >>> [metrics[name] for name in ("val/greedy_mean", "val/mean@3", "val/pass@3", "val/maj@3")]
    [0.5, 0.5, 1.0, 0.5]
    """
    k = max((len(responses) for responses in sampled), default=1)
    scored_sampled = [[r for r in responses if r.ok] for responses in sampled]
    every = [r.score for r in greedy if r.ok] + [r.score for responses in scored_sampled for r in responses]
    metrics = {
        SAMPLES: float(k),
        GREEDY_MEAN: _mean([r.score for r in greedy if r.ok]),
        at_k("mean", k): _mean([r.score for responses in scored_sampled for r in responses]),
    }
    if every and all(score in (0.0, 1.0) for score in every):
        metrics[at_k("pass", k)] = _mean([float(any(r.score == 1.0 for r in rs)) for rs in scored_sampled])
        metrics[at_k("maj", k)] = _mean([_majority_correct(rs) for rs in scored_sampled])
    return metrics


def _majority_correct(responses: list[Scored]) -> float:
    if not responses:
        return 0.0
    keys = [answer_key(r.text) for r in responses]
    top = max(Counter(keys).values())
    majority = next(key for key in keys if keys.count(key) == top)  # the first of a tie
    return float(responses[keys.index(majority)].score == 1.0)


def validation_status(metrics: dict[str, float], step: int) -> dict[str, object] | None:
    """status.validation (api/status.py Validation) from a step's metrics; None when the step did not validate."""
    if SAMPLES not in metrics:
        return None
    k = int(metrics[SAMPLES])
    return {
        "step": step,
        "samples": k,
        "greedyMean": metrics[GREEDY_MEAN],
        "meanAtK": metrics[at_k("mean", k)],
        "passAtK": metrics.get(at_k("pass", k)),
        "majAtK": metrics.get(at_k("maj", k)),
    }
