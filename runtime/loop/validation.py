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

For the prompts of a verl-layout file (records with a `data_source`), the metrics verl's validation
reports too (verl/trainer/ppo/metric_utils.py process_validation_metrics, verl b178a3cd), per data source
and for each value a response gets: `reward` (the score) and every number the reward returns beside it
(`acc`, ...); over each prompt's k scored samples:
- val/<data source>/<value>/mean@k: the mean;
- val/<data source>/<value>/best@k: verl's bootstrap estimate of the best of k: the mean, over 1000
  resamples of k responses drawn with replacement (numpy's RandomState(42), as verl seeds it), of the
  largest value in each;
- val/<data source>/<value>/maj@k, when the reward names the answer it read (`pred`, as verl's math_dapo
  does): the same resamples, each giving the value of the first response whose answer most of it gives;
each averaged over the source's prompts (a prompt with one scored sample gives mean@1 only). Any scores,
+-1 ones too: it is verl's computation, not a test of correctness.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from kuberl.runtime.report.telemetry import GREEDY_MEAN
from kuberl.runtime.rewards.builtin import extract_final_answer

#: Metric names; k is the number of sampled responses per prompt.
SAMPLES = "val/samples"


def at_k(name: str, k: int) -> str:
    """The name of a metric over k samples, e.g. at_k("mean", 8) == "val/mean@8"."""
    return f"val/{name}@{k}"


#: verl's bootstrap (metric_utils.py bootstrap_metric): resamples per estimate, and the seed of each.
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 1000, 42


@dataclass(frozen=True)
class Scored:
    text: str
    score: float
    ok: bool  # the reward succeeded
    data_source: str | None = None  # the record's data_source (verl's layout), if it has one
    metrics: dict[str, float] = field(default_factory=dict)  # the numbers the reward returned beside its score
    pred: str | None = None  # the answer the reward read (verl's pred), if it says


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
    return metrics | per_data_source_metrics(scored_sampled)


def per_data_source_metrics(sampled: list[list[Scored]]) -> dict[str, float]:
    """verl's per-data-source validation metrics (see the module docstring) from each prompt's scored samples.

    >>> right, wrong = (Scored(t, s, True, "math_dapo", {"acc": a}, p) for t, s, a, p in [("", 1.0, 1.0, "4"),
    ...     ("", -1.0, 0.0, "5")])
    >>> metrics = per_data_source_metrics([[right, wrong, wrong]])
    >>> [round(metrics[f"val/math_dapo/acc/{name}@3"], 3) for name in ("mean", "best", "maj")]
    [0.333, 0.716, 0.284]
    """
    per_prompt: dict[str, list[dict[str, float]]] = defaultdict(list)  # "<source>/<value>/<metric>@k" -> values
    for responses in sampled:
        scored = [r for r in responses if r.ok and r.data_source is not None]
        if not scored:
            continue
        values = {"reward": [r.score for r in scored]}
        for name in sorted({name for r in scored for name in r.metrics}):
            values[name] = [r.metrics[name] for r in scored if name in r.metrics]
        preds = [r.pred for r in scored] if all(r.pred is not None for r in scored) else None
        for name, column in values.items():
            prefix = f"{scored[0].data_source}/{name}"
            per_prompt[prefix].append(_value_metrics(column, preds if len(column) == len(scored) else None))
    metrics: dict[str, float] = {}
    for prefix, prompts in per_prompt.items():
        for metric in sorted({metric for found in prompts for metric in found}):
            metrics[f"val/{prefix}/{metric}"] = _mean([found[metric] for found in prompts if metric in found])
    return metrics


def _value_metrics(values: list[float], preds: list[str | None] | None) -> dict[str, float]:
    """mean@k, and for k > 1 best@k and maj@k as verl's bootstrap estimates them, for one prompt's k values."""
    k = len(values)
    found = {f"mean@{k}": _mean(values)}
    if k < 2:
        return found
    resampled = np.random.RandomState(BOOTSTRAP_SEED).choice(k, size=(BOOTSTRAP_RESAMPLES, k), replace=True)  # (B, k)
    column = np.asarray(values, dtype=np.float64)
    found[f"best@{k}"] = float(column[resampled].max(axis=1).mean())
    if preds is not None:
        answers = np.unique(np.asarray(preds, dtype=object), return_inverse=True)[1][resampled]  # (B, k) answer ids
        counts = (answers[:, :, None] == answers[:, None, :]).sum(axis=2)  # (B, k) votes for each draw's answer
        first_of_majority = (counts == counts.max(axis=1, keepdims=True)).argmax(axis=1)  # (B,) first such draw
        found[f"maj@{k}"] = float(column[resampled[np.arange(len(resampled)), first_of_majority]].mean())
    return found


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
