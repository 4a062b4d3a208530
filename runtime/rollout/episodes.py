"""The rollout stage of a job with an environment: every sample is a multi-turn episode.

The controller calls it exactly as it calls the single-turn stage (`kuberl.runtime.rollout`): prompts
in, a RolloutBatch out, groupSize rows per prompt. Each row is one episode (episode.py), played by
the scheduler (scheduler.py) on the job's engines and the environment pool (pool.py).

Seeds: episode row r of step s draws its turn t from derive_seed(seed, s, EPISODES, stream, greedy, r, t),
so a resumed run replays the same episodes whatever batches its generation calls formed.
"""

from typing import Any

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.engines.base import SamplingParams
from kuberl.runtime.environments.episode import Episode, episodes_to_batch
from kuberl.runtime.environments.metrics import episode_metrics, merge_episode_metrics
from kuberl.runtime.environments.registry import load_environment
from kuberl.runtime.environments.scheduler import EpisodeLimits, EpisodeScheduler, Span
from kuberl.runtime.environments.tool_formats import tool_format_for
from kuberl.runtime.rollout.base import Engines, Sampling, derive_seed

#: Marks episode seeds apart from the single-turn stage's (seed, step, rank, ...) seeds.
EPISODES = 1 << 21


class EpisodeRollout:
    def __init__(
        self,
        spec: Any,
        sampling: Sampling,
        tokenizer: Any,
        engines: Engines,
        environments: Any,
        group_size: int,
        pad_id: int,
    ) -> None:
        assert spec.environment is not None
        self.settings = sampling
        self.tokenizer = tokenizer
        self.engines = engines
        self.environments = environments
        self.group_size = group_size
        self.pad_id = pad_id
        environment_class = load_environment(spec.environment.name)
        self.format = tool_format_for(environment_class, tokenizer, spec.data.chat_template)
        self.limits = EpisodeLimits(spec.environment.max_turns, spec.max_turn_tokens, spec.max_response_tokens)
        self.stop_ids = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
        self.last_spans: list[Span] = []  # the last rollout's timeline (metrics, tests)
        self._metrics: dict[str, float] = {}

    def run(
        self, prompts: list[Prompt], step: int, *, greedy: bool = False, stream: int = 0, record: bool = True
    ) -> RolloutBatch:
        per_prompt = 1 if greedy else self.group_size
        seed = self.settings.seed
        episodes = [
            Episode(row, prompt, derive_seed(seed, step, EPISODES, stream, int(greedy), row))
            for index, prompt in enumerate(prompts)
            for row in range(index * per_prompt, (index + 1) * per_prompt)
        ]
        self.environments.begin()
        scheduler = EpisodeScheduler(
            self.engines,
            self.environments,
            self.format,
            self.tokenizer,
            self.limits,
            lambda chunk, budgets: self.sampling(chunk, budgets, greedy),
        )
        self.last_spans = scheduler.run(episodes)
        if record:
            self._metrics = merge_episode_metrics(self._metrics, episode_metrics(episodes, self.last_spans))
        return episodes_to_batch(episodes, self.pad_id, per_prompt)

    def sampling(self, episodes: list[Episode], budgets: list[int], greedy: bool) -> SamplingParams:
        """One generation call's sampling: each episode's next message from its own seed and budget."""
        settings = self.settings
        return SamplingParams(
            temperature=0.0 if greedy else settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            max_new_tokens=max(budgets),
            n=1,
            stop_token_ids=self.stop_ids,
            stop=settings.stop + self.format.stop,
            row_seeds=tuple(derive_seed(episode.seed, episode.turns) for episode in episodes),
            row_max_new_tokens=tuple(budgets),
        )

    def take_metrics(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, {}
        return metrics
