"""The reward worker: scores responses with a function, a reward model, or an HTTP endpoint.

One worker is one Ray actor. The controller's fixed WorkerGroup and the elastic RewardPool
(runtime/pools/reward.py) both call `setup` once and then `score` per batch. A reward function runs in
a child process of the worker (rewards/isolated.py), so a call that hangs is stopped after
reward.sampleTimeoutSeconds and fails only its sample. An endpoint worker
may be called by several threads at once (the pool gives its actor maxConcurrency slots); the
endpoint client bounds the requests in flight. Function and model workers run one call at a time.
"""

from typing import Any

from kuberl.api import RewardSpec
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.rewards.endpoint import RewardEndpointClient
from kuberl.runtime.rewards.functions import RewardResult
from kuberl.runtime.rewards.isolated import IsolatedRewardFunction


class RewardWorker:
    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank = rank
        self.function: IsolatedRewardFunction | None = None
        self.model: Any = None
        self.endpoint: RewardEndpointClient | None = None
        self.batch_size = 32

    def setup(self, reward: dict[str, Any], model: ModelLocation | None = None) -> None:
        """Ready to score: the function loaded, the endpoint's client made, or the reward model (spec.reward.model
        at `model`, resolved on this node) loaded."""
        spec = RewardSpec.model_validate(reward)
        self.batch_size = spec.batch_size
        if spec.function is not None:
            self.function = IsolatedRewardFunction(spec.function, spec.sample_timeout_seconds)
        elif spec.model is not None:
            from kuberl.runtime.rewards.model import RewardModelScorer
            from kuberl.runtime.workers.group import worker_device  # torch: only a reward model needs it

            assert model is not None
            # the GPU the pool's Ray actor was given (resources.reward.gpus), else the CPU
            device = str(worker_device())
            self.model = RewardModelScorer(model.resolve(), spec.model.dtype.value, spec.model.batch_size, device)
        else:
            assert spec.endpoint is not None  # RewardSpec holds exactly one of the three
            self.endpoint = RewardEndpointClient.from_spec(spec.endpoint)

    def score(self, prompts: list[str], completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
        if self.function is not None:
            return self.function.score(completions, samples)
        if self.endpoint is not None:
            return self.endpoint.score_chunked(prompts, completions, samples, self.batch_size)
        scores = self.model.score(prompts, completions)
        return [RewardResult(float(score), {}, None) for score in scores]
