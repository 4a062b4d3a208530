"""What a step's episodes measured: turns, tool calls and errors, how they ended, where the time went.

Pure functions of the episodes and the scheduler's spans; every name is an `env/` metric in
metrics.jsonl and TensorBoard. Counts and seconds add up over a step's rollouts (dynamic sampling
may run several); the per-turn-count rewards are read from the scored batch (loop/step_metrics.py).
"""

from kuberl.runtime.environments.episode import ENDINGS, Episode
from kuberl.runtime.environments.scheduler import Span

#: Metrics that are means over a step's episodes rather than totals: merged by weight, not summed.
EPISODE_MEANS = ("env/turns_mean", "env/prefix_cache_hit_fraction")


def episode_metrics(episodes: list[Episode], spans: list[Span]) -> dict[str, float]:
    """Totals of one rollout's episodes (`env/episodes` weighs the means when rollouts are merged)."""
    generate = [span for span in spans if span.kind == "generate"]
    environment = [span for span in spans if span.kind == "environment"]
    context = sum(span.context_tokens for span in generate)
    metrics = {
        "env/episodes": float(len(episodes)),
        "env/turns_mean": sum(e.turns for e in episodes) / max(1, len(episodes)),
        "env/turns_max": float(max((e.turns for e in episodes), default=0)),
        "env/generation_calls": float(len(generate)),
        # seconds the engines spent generating, summed over calls (calls on different engines overlap)
        "env/generation_seconds": sum(span.ended - span.started for span in generate),
        # seconds episodes spent with their environment (steps run in parallel, so this exceeds the wall time)
        "env/environment_seconds": sum(span.ended - span.started for span in environment),
        "env/rollout_seconds": (max(s.ended for s in spans) - min(s.started for s in spans)) if spans else 0.0,
        "env/observation_tokens": float(sum(len(e.response) - sum(e.from_model) for e in episodes)),
        "env/prefix_cache_hit_fraction": sum(span.cached_tokens for span in generate) / max(1, context),
    }
    for ending in ENDINGS:
        metrics[f"env/ended_{ending}"] = float(sum(e.ended_by == ending for e in episodes))
    for name in sorted({name for e in episodes for name in e.metrics}):
        metrics[f"env/{name}"] = sum(e.metrics.get(name, 0.0) for e in episodes)
    return metrics


def merge_episode_metrics(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Two rollouts' metrics as one: totals added, maxima kept, means weighed by their episodes."""
    if not total:
        return dict(more)
    merged = dict(total)
    weight, extra = total.get("env/episodes", 0.0), more.get("env/episodes", 0.0)
    for name, value in more.items():
        if name in EPISODE_MEANS:
            merged[name] = (total.get(name, 0.0) * weight + value * extra) / max(1.0, weight + extra)
        elif name == "env/turns_max":
            merged[name] = max(total.get(name, 0.0), value)
        else:
            merged[name] = total.get(name, 0.0) + value
    return merged
