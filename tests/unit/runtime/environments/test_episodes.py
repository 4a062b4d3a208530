"""An episode's tokens as a training row: the model's tokens train, the environment's are only read.

prompt [1 2] | model [5 6] | observation [7 8] | model [9]
"""

import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.returns import discounted_returns
from kuberl.runtime.data import Prompt
from kuberl.runtime.engines.updates import token_rewards_from_scores
from kuberl.runtime.environments.base import ModelTurn
from kuberl.runtime.environments.episode import Episode, episodes_to_batch
from kuberl.runtime.environments.metrics import episode_metrics, merge_episode_metrics
from kuberl.runtime.environments.scheduler import Span

PAD = 0


def played(row: int, prompt: list[int], turns: list[tuple[list[int], list[int]]], last: list[int]) -> Episode:
    episode = Episode(row, Prompt(row, prompt, "p", {"answer": row}), seed=row)
    for message, observation in turns:
        episode.add_model_turn(message, [-0.5] * len(message))
        episode.add_observation(observation)
    episode.add_model_turn(last, [-0.25] * len(last))
    episode.final, episode.ended_by = ModelTurn("final"), "environment"
    return episode


def two_episodes() -> list[Episode]:
    return [played(1, [3], [], [4]), played(0, [1, 2], [([5, 6], [7, 8])], [9])]


def test_the_batch_marks_the_models_tokens_for_training_and_the_observations_for_reading() -> None:
    batch = episodes_to_batch(two_episodes(), PAD, group_size=2)
    assert batch.response_ids.tolist() == [[5, 6, 7, 8, 9], [4, PAD, PAD, PAD, PAD]]  # rows in episode order
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert batch.observation_mask.tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0]]  # prompts left-padded
    assert batch.turn_index.tolist() == [[1, 1, 1, 1, 2], [1, 0, 0, 0, 0]]
    assert batch.turns.tolist() == [2, 1]
    assert batch.engine_logprobs.tolist() == [[-0.5, -0.5, 0, 0, -0.25], [-0.25, 0, 0, 0, 0]]
    assert batch.group_index.tolist() == [0, 0] and batch.response_lengths.tolist() == [3, 1]
    assert batch.texts == ["final", "final"] and [s["answer"] for s in batch.samples] == [0, 1]


def test_the_reward_sits_on_the_models_last_token_not_on_an_observation() -> None:
    batch = episodes_to_batch(two_episodes(), PAD, group_size=2)
    rewards = token_rewards_from_scores(torch.tensor([1.0, 2.0]), batch.response_mask)
    assert rewards.tolist() == [[0, 0, 0, 0, 1.0], [2.0, 0, 0, 0, 0]]


def test_selected_rows_keep_their_environment_rewards_and_masks() -> None:
    episodes = two_episodes()
    episodes[0].reward = "row 1's"
    batch = episodes_to_batch(episodes, PAD, group_size=2).select([1, 0])
    assert batch.environment_rewards == ["row 1's", None]
    assert batch.observation_mask[1].tolist() == [0, 0, 1, 1, 0]


def test_a_return_passes_undiscounted_through_the_environments_tokens() -> None:
    # G_t = r_t + 0.5 G_{t+1} over the model's tokens; the two observation tokens are skipped, not steps
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    assert_close(discounted_returns(rewards, mask, gamma=0.5), torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]]))


def test_episode_metrics_count_turns_endings_and_time_and_merge_over_rounds() -> None:
    episodes = two_episodes()
    episodes[1].ended_by = "failed"
    episodes[1].metrics = {"tool_calls": 2.0, "tool_errors": 1.0}
    spans = [Span("generate", (0, 1), 0, 0.0, 1.0, 10, 4), Span("environment", (1,), -1, 0.5, 3.0)]
    metrics = episode_metrics(episodes, spans)
    assert metrics["env/turns_mean"] == 1.5 and metrics["env/turns_max"] == 2
    assert metrics["env/ended_environment"] == 1 and metrics["env/ended_failed"] == 1
    assert metrics["env/tool_calls"] == 2 and metrics["env/tool_errors"] == 1
    assert metrics["env/generation_seconds"] == 1.0 and metrics["env/environment_seconds"] == 2.5
    assert metrics["env/rollout_seconds"] == 3.0 and metrics["env/prefix_cache_hit_fraction"] == 0.4
    assert metrics["env/observation_tokens"] == 2
    merged = merge_episode_metrics(metrics, {**metrics, "env/turns_mean": 3.5, "env/turns_max": 4.0})
    assert merged["env/episodes"] == 4 and merged["env/tool_calls"] == 4
    assert merged["env/turns_mean"] == 2.5 and merged["env/turns_max"] == 4


def test_the_reward_of_episodes_is_reported_by_how_many_turns_they_took() -> None:
    from kuberl.runtime.loop.step_metrics import reward_metrics

    episodes = [played(0, [1], [([5], [7])], [9]), played(1, [1], [], [4]), played(2, [1], [], [4])]
    batch = episodes_to_batch(episodes, PAD, group_size=3)
    batch.scores, batch.scored = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([True, True, False])
    metrics = reward_metrics(batch, max_new_tokens=16, overlong=None)
    assert metrics["env/reward_turns_2"] == 1.0
    assert metrics["env/reward_turns_1"] == 0.5  # the failed episode counts in no mean
