"""No silent difference in meaning: where verl computes a knob differently from the kuberl field of the same name,
the converter writes the kuberl setting that computes what verl does, or reports the difference. Each claim is held
to verl's own formula, restated in tests/unit/runtime/algorithms/verl_reference.py from verl's core_algos.py
(b178a3cd)."""

import torch
from torch.testing import assert_close

from kuberl.api import parse_rljob
from kuberl.runtime.algorithms import ADVANTAGE_ESTIMATORS
from kuberl.runtime.algorithms.advantages import AdvantageInputs
from kuberl.runtime.algorithms.losses import PolicyLossConfig, PolicyLossInputs, aggregate_loss, policy_loss
from kuberl.verl.command import read_launch
from kuberl.verl.convert import Conversion, convert
from tests.unit.runtime.algorithms import verl_reference as verl

LAUNCH = "python3 -m verl.trainer.main_ppo data.train_files=/d/train.parquet actor_rollout_ref.model.path=/m "
GRPO = "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 "
ACTOR = "actor_rollout_ref.actor"


def converted(overrides: str) -> Conversion:
    return convert(read_launch(LAUNCH + overrides))


def lost(conversion: Conversion) -> dict[str, bool]:
    """{key: changes what is trained}, leaving out verl's default tensor parallelism (reported in every job)."""
    return {
        knob.key: knob.changes_training
        for knob in conversion.lost
        if knob.key != "actor_rollout_ref.rollout.tensor_model_parallel_size"
    }


def random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old log-probs, new log-probs, advantages, mask) for 6 responses of up to 5 tokens."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 5, generator=generator) * 2
    new = old + torch.randn(6, 5, generator=generator) * 0.6
    advantages = torch.randn(6, 1, generator=generator).expand(6, 5).clone()
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    return old, new, advantages, mask


def kuberl_loss(conversion: Conversion, batch: tuple) -> torch.Tensor:
    """The converted job's policy loss on the batch, as its trainer computes it (one mini-batch, one rank)."""
    algorithm = parse_rljob(conversion.manifest).spec.algorithm
    config = PolicyLossConfig(
        clip_low=algorithm.clip_ratio_low,
        clip_high=algorithm.clip_ratio_high,
        dual_clip_c=algorithm.dual_clip_c,
        tau_positive=algorithm.sapo.tau_positive if algorithm.sapo else 1.0,
        tau_negative=algorithm.sapo.tau_negative if algorithm.sapo else 1.05,
    )
    old, new, advantages, mask = batch
    inputs = PolicyLossInputs(new, old, advantages, mask)
    return policy_loss(algorithm.policy_loss, inputs, config, algorithm.loss_aggregation)[0]


# --------------------------------------------------------------------------------- loss aggregation


def test_sapo_aggregates_per_sequence_whatever_loss_agg_mode_says_as_verls_does() -> None:
    conversion = converted(GRPO + f"{ACTOR}.policy_loss.loss_mode=sapo {ACTOR}.loss_agg_mode=token-mean")
    assert lost(conversion) == {}  # no KL or entropy term: loss_agg_mode moves nothing in verl
    assert parse_rljob(conversion.manifest).spec.algorithm.loss_aggregation == "seq_mean_token_mean"
    batch = random_batch(0)
    assert_close(kuberl_loss(conversion, batch), verl.sapo(*batch, 1.0, 1.05))


def test_sapo_temperatures_are_carried() -> None:
    conversion = converted(GRPO + f"{ACTOR}.policy_loss.loss_mode=sapo {ACTOR}.tau_pos=2.0 {ACTOR}.tau_neg=0.5")
    sapo = parse_rljob(conversion.manifest).spec.algorithm.sapo
    assert sapo is not None and (sapo.tau_positive, sapo.tau_negative) == (2.0, 0.5)
    batch = random_batch(1)
    assert_close(kuberl_loss(conversion, batch), verl.sapo(*batch, 2.0, 0.5))


def test_a_kl_or_entropy_term_under_a_sequence_level_loss_reports_the_aggregation_it_loses() -> None:
    for loss in ("sapo", "gspo", "geo_mean"):
        conversion = converted(
            GRPO + f"{ACTOR}.policy_loss.loss_mode={loss} {ACTOR}.loss_agg_mode=token-mean {ACTOR}.use_kl_loss=True"
        )
        assert lost(conversion) == {f"{ACTOR}.loss_agg_mode": True}, loss
        assert "KL and entropy terms by token_mean" in str(conversion.lost[0])
        assert parse_rljob(conversion.manifest).spec.algorithm.loss_aggregation == "seq_mean_token_mean"


def test_gspo_at_token_mean_loses_nothing() -> None:
    conversion = converted(GRPO + f"{ACTOR}.policy_loss.loss_mode=gspo {ACTOR}.loss_agg_mode=token-mean")
    assert lost(conversion) == {}
    batch = random_batch(2)
    assert_close(kuberl_loss(conversion, batch), verl.gspo(*batch, 0.2, 0.2))


def test_seq_mean_token_sum_norm_is_reported_with_the_factor_verls_gradient_differs_by() -> None:
    conversion = converted(GRPO + f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm")
    assert lost(conversion) == {f"{ACTOR}.loss_agg_mode": True}
    assert "verl's gradient is kuberl's times the sequences in a micro-batch" in str(conversion.lost[0])
    # the claim: verl's legacy FSDP worker (dp_actor.update_policy) sums micro-batches of 2 sequences, each
    # agg_loss(...) / gradient-accumulation steps; kuberl divides the mini-batch's sum by sequences x budget
    token_loss = torch.rand(4, 5, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(4, 5)
    verl_loss = sum(verl.agg(token_loss[i : i + 2], mask[i : i + 2], "seq-mean-token-sum-norm") / 2 for i in (0, 2))
    kuberl = aggregate_loss(token_loss, mask, "seq_mean_token_sum_norm", max_response_length=5)
    assert_close(verl_loss, kuberl * 2)


# ------------------------------------------------------------------------------------------- clip range


def test_cispos_clip_ratio_low_of_ten_is_kuberls_one() -> None:
    conversion = converted(
        GRPO + f"{ACTOR}.policy_loss.loss_mode=cispo {ACTOR}.clip_ratio_low=10 {ACTOR}.clip_ratio_high=0.28"
    )  # examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh
    assert lost(conversion) == {}
    assert parse_rljob(conversion.manifest).spec.algorithm.clip_ratio_low == 1.0
    batch = random_batch(4)
    assert_close(kuberl_loss(conversion, batch), verl.cispo(*batch, 10.0, 0.28, "token-mean"))


def test_geo_means_log_space_clip_past_one_is_reported() -> None:
    conversion = converted(GRPO + f"{ACTOR}.policy_loss.loss_mode=geo_mean {ACTOR}.clip_ratio_low=10")
    assert lost(conversion) == {f"{ACTOR}.clip_ratio_low": True}


def test_clip_ratio_alone_moves_nothing_as_in_verl_whose_low_and_high_default_to_point_two() -> None:
    conversion = converted(GRPO + f"{ACTOR}.clip_ratio=0.3")
    algorithm = parse_rljob(conversion.manifest).spec.algorithm
    assert (algorithm.clip_ratio_low, algorithm.clip_ratio_high) == (0.2, 0.2)  # actor.yaml: 0.2 each, not null
    batch = random_batch(5)
    assert_close(kuberl_loss(conversion, batch), verl.vanilla(*batch, 0.2, 0.2, 3.0, "token-mean"))


# -------------------------------------------------------------------------------------------- estimators


def test_the_vectorised_estimators_are_rloo_and_grpo() -> None:
    scores = torch.rand(8, generator=torch.Generator().manual_seed(6))
    index = [0, 0, 0, 0, 5, 5, 9, 9]
    mask = torch.ones(8, 3)
    token_rewards = torch.zeros(8, 3)
    token_rewards[:, -1] = scores
    inputs = AdvantageInputs(token_rewards=token_rewards, response_mask=mask, group_index=torch.tensor(index))
    for verl_name, formula in (("rloo_vectorized", verl.rloo_vectorized), ("grpo_vectorized", verl.grpo_vectorized)):
        conversion = converted(f"algorithm.adv_estimator={verl_name} actor_rollout_ref.rollout.n=4")
        spec = parse_rljob(conversion.manifest).spec
        assert lost(conversion) == {}, verl_name
        advantages, _ = ADVANTAGE_ESTIMATORS.get(spec.algorithm.advantage_estimator)(inputs)
        # verl's vectorised variance (sum of squares less the squared sum) rounds differently in float32
        assert_close(advantages, formula(token_rewards, mask, index), atol=1e-4, rtol=1e-4, msg=verl_name)
    assert parse_rljob(converted("algorithm.adv_estimator=rloo_vectorized actor_rollout_ref.rollout.n=4").manifest)\
        .spec.algorithm.name == "rloo"  # fmt: skip


# ------------------------------------------------------------------------------------------ models


def test_each_models_dtype_is_verls_fsdp_model_dtype() -> None:
    default = parse_rljob(converted(GRPO + f"{ACTOR}.use_kl_loss=True").manifest).spec.models
    assert default.actor.dtype == "float32" and (default.reference is None or default.reference.dtype is None)
    models = parse_rljob(
        converted(GRPO + f"{ACTOR}.use_kl_loss=True actor_rollout_ref.ref.fsdp_config.model_dtype=bf16").manifest
    ).spec.models
    assert models.reference is not None and models.reference.dtype == "bfloat16"


def test_megatron_offload_becomes_fsdp2_offload() -> None:
    conversion = converted(
        GRPO + f"{ACTOR}.megatron.param_offload=True {ACTOR}.megatron.optimizer_offload=True "
        f"{ACTOR}.megatron.grad_offload=True actor_rollout_ref.ref.megatron.param_offload=True {ACTOR}.use_kl_loss=True"
    )
    models = parse_rljob(conversion.manifest).spec.models
    assert models.actor.offload.params and models.actor.offload.optimizer
    assert models.reference is not None and models.reference.offload.params
    assert lost(conversion) == {f"{ACTOR}.megatron.grad_offload": False}  # gradients follow the parameters


def test_a_reward_model_is_scored_in_bfloat16_and_the_template_verl_renders_is_reported() -> None:
    rm = "reward_model.enable=True reward_model.model.path=/rm "
    conversion = converted(GRPO + rm)
    assert parse_rljob(conversion.manifest).spec.reward.model.dtype == "bfloat16"
    assert lost(conversion) == {"reward_model.use_reward_loop": True, "reward_model.enable_resource_pool": False}
    # verl's older worker feeds the actor's tokens as they are when input_tokenizer is null: nothing re-rendered
    older = converted(GRPO + rm + "reward_model.use_reward_loop=False reward_model.model.input_tokenizer=null")
    assert lost(older) == {"reward_model.enable_resource_pool": False}
