"""The reward worker: scores responses with a function, a reward model, or (issue 8) an endpoint."""

from pathlib import Path
from typing import Any

from kuberl.api import RewardSpec
from kuberl.runtime.rewards.functions import RewardResult, load_reward_function, score_batch


class RewardWorker:
    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank = rank
        self.function: Any = None
        self.model: Any = None

    def setup(self, reward: dict[str, Any], model_path: str | None = None) -> None:
        spec = RewardSpec.model_validate(reward)
        if spec.function is not None:
            self.function = load_reward_function(spec.function)
        elif spec.model is not None:
            from kuberl.runtime.rewards.model import RewardModelScorer

            assert model_path is not None
            self.model = RewardModelScorer(Path(model_path), spec.model.dtype.value, spec.model.batch_size)
        else:
            raise NotImplementedError("reward.endpoint arrives with the elastic reward pool")

    def score(self, prompts: list[str], completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
        if self.function is not None:
            return score_batch(self.function, completions, samples)
        scores = self.model.score(prompts, completions)
        return [RewardResult(float(score), {}, None) for score in scores]
