"""One episode as one token sequence, and the training batch a step's episodes make.

    prompt | model turn 1 | observation 1 | model turn 2 | ... | model turn k
           '------------------- the episode's response ------------------'

The model's tokens carry `response_mask` 1 (they train: the loss, the log-probs, the advantages and
every aggregation count them); the observations' tokens carry `observation_mask` 1 (the model reads
them, the trainer attends to them, nothing trains on them). A trailing observation is never kept:
an episode ends with the model's own tokens, so its reward sits on a token the model wrote.
"""

from dataclasses import dataclass, field
from typing import Any

import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.environments.base import ModelTurn

#: Why an episode ended, for metrics (env/ended_<reason>).
ENDINGS = ("environment", "max_turns", "budget", "failed")


@dataclass
class Episode:
    row: int  # its row in the step's batch: prompt i's sample j is row i * groupSize + j
    prompt: Prompt
    seed: int  # its turns draw from seeds derived from this one
    response: list[int] = field(default_factory=list)  # token ids after the prompt, the model's and observations'
    from_model: list[bool] = field(default_factory=list)  # per response token: the model wrote it
    logprobs: list[float] = field(default_factory=list)  # the engine's log-prob of each model token, 0 elsewhere
    turn_of: list[int] = field(default_factory=list)  # per response token: its turn, 1 = the first message
    turns: int = 0  # messages the model wrote
    final: ModelTurn | None = None  # the model's last message
    ended_by: str | None = None  # one of ENDINGS once over
    reward: Any = None  # the environment's RewardResult, or None: spec.reward scores `final`
    metrics: dict[str, float] = field(default_factory=dict)  # the environment's counts, summed over turns
    cached_tokens: int = 0  # context tokens the engine took from its prefix cache, over all turns

    @property
    def context(self) -> list[int]:
        """What the model reads for its next message."""
        return self.prompt.input_ids + self.response

    @property
    def done(self) -> bool:
        return self.ended_by is not None

    def add_model_turn(self, token_ids: list[int], logprobs: list[float]) -> None:
        self.turns += 1
        self.response += token_ids
        self.from_model += [True] * len(token_ids)
        self.logprobs += logprobs
        self.turn_of += [self.turns] * len(token_ids)

    def add_observation(self, token_ids: list[int]) -> None:
        self.response += token_ids
        self.from_model += [False] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.turn_of += [self.turns] * len(token_ids)

    def add_metrics(self, counts: dict[str, float]) -> None:
        for name, value in counts.items():
            self.metrics[name] = self.metrics.get(name, 0.0) + float(value)


def episodes_to_batch(episodes: list[Episode], pad_id: int, group_size: int) -> RolloutBatch:
    """The step's episodes as one batch, in row order: left-padded prompts, right-padded responses."""
    episodes = sorted(episodes, key=lambda episode: episode.row)
    n = len(episodes)
    width_p = max(len(e.prompt.input_ids) for e in episodes)
    width_r = max(1, max(len(e.response) for e in episodes))
    prompt_ids = torch.full((n, width_p), pad_id, dtype=torch.long)  # (N, P)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)  # (N, P)
    response_ids = torch.full((n, width_r), pad_id, dtype=torch.long)  # (N, R)
    response_mask = torch.zeros((n, width_r))  # (N, R) the model's tokens
    observation_mask = torch.zeros((n, width_r))  # (N, R) the environment's tokens
    engine_logprobs = torch.zeros((n, width_r))  # (N, R)
    turn_index = torch.zeros((n, width_r), dtype=torch.long)  # (N, R)
    for row, episode in enumerate(episodes):
        prompt, length = episode.prompt.input_ids, len(episode.response)
        prompt_ids[row, width_p - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[row, width_p - len(prompt) :] = 1
        if length:
            model = torch.tensor(episode.from_model, dtype=torch.float32)  # (r,)
            response_ids[row, :length] = torch.tensor(episode.response)
            response_mask[row, :length] = model
            observation_mask[row, :length] = 1.0 - model
            engine_logprobs[row, :length] = torch.tensor(episode.logprobs)
            turn_index[row, :length] = torch.tensor(episode.turn_of)
    return RolloutBatch(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        group_index=torch.tensor([e.row // group_size for e in episodes]),  # (N,)
        engine_logprobs=engine_logprobs,
        observation_mask=observation_mask,
        turn_index=turn_index,
        texts=[e.final.text if e.final is not None else "" for e in episodes],
        samples=[e.prompt.record for e in episodes],
        environment_rewards=[e.reward for e in episodes],
    )
