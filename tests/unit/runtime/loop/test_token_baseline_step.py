"""A step with a token-baseline estimator: the old-log-prob pass returns each token's sum_v pi(v)^2 beside the
log-probs, before the update, and the estimator reads both (the Controller through recording groups)."""

import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.advantages import AdvantageInputs
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from kuberl.runtime.batch import RolloutBatch
from tests.unit.runtime.loop.recording import train_one_step


def scored_batch() -> RolloutBatch:
    """Four prompts x two responses of 1 to 4 tokens, each scored."""
    lengths = torch.tensor([4, 2, 3, 3, 1, 4, 2, 2])  # (N,)
    mask = (torch.arange(4)[None] < lengths[:, None]).float()  # (N, R)
    batch = RolloutBatch(
        prompt_ids=torch.full((8, 3), 5),
        prompt_mask=torch.ones(8, 3, dtype=torch.long),
        response_ids=torch.full((8, 4), 7),
        response_mask=mask,
        group_index=torch.arange(8) // 2,
        scored=torch.ones(8, dtype=torch.bool),
    )
    batch.engine_logprobs = torch.zeros_like(mask)
    return batch


def test_the_old_log_prob_pass_brings_sum_pi_squared_and_the_advantages_use_it() -> None:
    batch = scored_batch()
    log, _ = train_one_step(batch, **{"algorithm.advantageEstimator": "optimal_token_baseline"})
    assert log.index("compute_logprobs with sum_pi_squared") < log.index("update_actor")
    assert batch.sum_pi_squared is not None and torch.equal(batch.sum_pi_squared, 0.5 * batch.response_mask)
    assert batch.scores is not None and batch.advantages is not None
    expected, _ = ADVANTAGE_ESTIMATORS.get("optimal_token_baseline")(
        AdvantageInputs(
            token_rewards=batch.token_rewards,
            response_mask=batch.response_mask,
            group_index=batch.group_index,
            old_logprobs=batch.old_logprobs,
            sum_pi_squared=batch.sum_pi_squared,
            scored=batch.scored,
        )
    )
    assert_close(batch.advantages, expected)
    assert batch.advantages.abs().sum() > 0


def test_other_estimators_keep_the_on_policy_shortcut_and_ask_for_nothing_more() -> None:
    batch = scored_batch()
    log, _ = train_one_step(batch)  # grpo, one epoch, one mini-batch: pi_old from the update's own forward
    assert not any("sum_pi_squared" in call for call in log) and batch.sum_pi_squared is None
