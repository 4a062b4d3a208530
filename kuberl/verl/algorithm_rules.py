"""The converter's rules for verl's algorithm knobs: estimator, policy loss, loss aggregation, clip range, KL.

Each maps to the kuberl setting that computes the same, or reports the difference; what verl does is read from
its code at commit b178a3cd (2026-01-29), verl/trainer/ppo/core_algos.py, cited per rule.
"""

from typing import Any

from kuberl.api.enums import LossAggregation
from kuberl.verl.knobs import ACTOR, Config, Derived, LostKnob

KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
#: verl adv_estimator -> (kuberl algorithm.name, advantageEstimator). rloo_vectorized and grpo_vectorized compute
#: what rloo and grpo do (compute_rloo_vectorized_outcome_advantage: (c s - sum) / (c - 1), rloo's s c/(c-1) -
#: mean c/(c-1); compute_grpo_vectorized_outcome_advantage: grpo's (s - mean) / (std + eps), with the group's
#: variance floored at 1e-6, which only a group whose scores differ by less than ~1e-3 notices).
ESTIMATORS = {
    "gae": ("ppo", "gae"),
    "grpo": ("grpo", "grpo"),
    "grpo_vectorized": ("grpo", "grpo"),
    "rloo": ("rloo", "rloo"),
    "rloo_vectorized": ("rloo", "rloo"),
    "reinforce_plus_plus": ("reinforce_pp", "reinforce_plus_plus"),
    "reinforce_plus_plus_baseline": ("grpo", "reinforce_plus_plus_baseline"),
    "remax": ("remax", "remax"),
    "opo": ("grpo", "opo"),
    "gpg": ("grpo", "gpg"),
    "grpo_passk": ("grpo", "grpo_passk"),
    "optimal_token_baseline": ("grpo", "optimal_token_baseline"),
    "tir_optimal_token_baseline": ("grpo", "tir_optimal_token_baseline"),
}
POLICY_LOSSES = {"vanilla": "ppo_clip"} | {
    name: name for name in ("gspo", "cispo", "clip_cov", "kl_cov", "gpg", "geo_mean", "sapo")
}
LOSS = f"{ACTOR}.policy_loss"

#: verl's losses whose policy term is aggregated per sequence whatever loss_agg_mode says: gspo and sapo pass
#: "seq-mean-token-mean" to agg_loss, geo_mean takes a plain mean of one loss per sequence (core_algos.py
#: compute_policy_loss_gspo, _sapo, _geo_mean). Their KL and entropy terms still follow loss_agg_mode
#: (workers/actor/dp_actor.py update_policy).
SEQUENCE_AGGREGATED = ("gspo", "sapo", "geo_mean")
#: Losses that clip the ratio pi / pi_old itself (a positive number): a lower clip of 1 or more never binds, so
#: verl's clip_ratio_low=10 (CISPO's "no lower bound") is kuberl's clipRatioLow 1. geo_mean clips the log-ratio at
#: -clip_ratio_low instead, where 10 and 1 differ.
RATIO_CLIPPED = ("vanilla", "gspo", "cispo", "clip_cov")
#: kuberl's bounds on the clip range (api/algorithm.py clipRatioLow, clipRatioHigh).
MAX_CLIP_LOW, MAX_CLIP_HIGH = 1.0, 10.0


def _lost(config: Config, key: str, why: str, changes_training: bool) -> LostKnob:
    return LostKnob(key, config.get(key), why, changes_training)


def loss_mode(config: Config) -> str:
    """verl's policy loss; the older `use_gpg_loss` switch picks gpg."""
    return "gpg" if config.get(f"{ACTOR}.use_gpg_loss") else str(config[f"{LOSS}.loss_mode"])


def algorithm_rule(config: Config) -> Derived:
    """Estimator and policy loss (with their knobs); a critic for gae."""
    out = Derived()
    estimator = str(config["algorithm.adv_estimator"])
    if estimator not in ESTIMATORS:
        out.lost.append(_lost(config, "algorithm.adv_estimator", f"kuberl has no estimator {estimator}", True))
        estimator = "grpo"
    name, kuberl_estimator = ESTIMATORS[estimator]
    out.fields |= {"algorithm.name": name, "algorithm.advantageEstimator": kuberl_estimator}
    mode = loss_mode(config)
    if mode in POLICY_LOSSES:
        out.fields["algorithm.policyLoss"] = POLICY_LOSSES[mode]
    else:
        out.lost.append(_lost(config, f"{LOSS}.loss_mode", f"kuberl has no loss {mode}", True))
    if mode == "clip_cov":
        out.fields["algorithm.clipCov"] = {
            "ratio": config[f"{LOSS}.clip_cov_ratio"],
            "lowerBound": config[f"{LOSS}.clip_cov_lb"],
            "upperBound": config[f"{LOSS}.clip_cov_ub"],
        }
    if mode == "kl_cov":
        out.fields["algorithm.klCov"] = {"ratio": config[f"{LOSS}.kl_cov_ratio"], "coef": config[f"{LOSS}.ppo_kl_coef"]}
    if mode == "sapo":  # verl reads them from the actor's config (actor.yaml tau_pos, tau_neg)
        out.fields["algorithm.sapo"] = {
            "tauPositive": config[f"{ACTOR}.tau_pos"],
            "tauNegative": config[f"{ACTOR}.tau_neg"],
        }
    if name == "ppo":
        out.fields["models.critic"] = {}
    return out


def aggregation_rule(config: Config) -> Derived:
    """loss_agg_mode (or the older use_token_level_loss) -> algorithm.lossAggregation, as verl applies it."""
    out = Derived()
    key = f"{ACTOR}.loss_agg_mode"
    aggregation = str(config[key]).replace("-", "_")
    if config.get(f"{ACTOR}.use_token_level_loss") is not None:  # verl's older switch for the same choice
        aggregation = "token_mean" if config[f"{ACTOR}.use_token_level_loss"] else "seq_mean_token_mean"
    mode = loss_mode(config)
    if mode in SEQUENCE_AGGREGATED:
        out.fields["algorithm.lossAggregation"] = str(LossAggregation.SEQ_MEAN_TOKEN_MEAN)
        other_terms = bool(config[f"{ACTOR}.use_kl_loss"]) or float(config[f"{ACTOR}.entropy_coeff"] or 0) != 0
        if aggregation != LossAggregation.SEQ_MEAN_TOKEN_MEAN and other_terms:
            why = (
                f"verl's {mode} aggregates its policy term per sequence whatever loss_agg_mode says, but its KL and "
                f"entropy terms by {aggregation}; kuberl aggregates every term by lossAggregation, here "
                "seq_mean_token_mean"
            )
            out.lost.append(_lost(config, key, why, True))
        return out
    out.fields["algorithm.lossAggregation"] = aggregation
    if aggregation == LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM:
        width = config.get(f"{ACTOR}.loss_scale_factor") or "the response width (data.max_response_length)"
        why = (
            f"verl divides each micro-batch's summed token losses by {width} and weighs micro-batches by "
            "1 / gradient-accumulation steps, never dividing by the number of sequences (core_algos.py agg_loss, "
            "dp_actor.py); kuberl divides by sequences x maxNewTokens, so verl's gradient is kuberl's times the "
            "sequences in a micro-batch before gradClip"
        )
        out.lost.append(_lost(config, key, why, True))
    return out


def clip_rule(config: Config) -> Derived:
    """clip_ratio_low / clip_ratio_high (each defaults to clip_ratio when null) -> clipRatioLow / clipRatioHigh."""
    out = Derived()
    clip = config[f"{ACTOR}.clip_ratio"]
    low, high = config[f"{ACTOR}.clip_ratio_low"], config[f"{ACTOR}.clip_ratio_high"]
    low, high = float(clip if low is None else low), float(clip if high is None else high)
    low_key = f"{ACTOR}.clip_ratio_low" if config[f"{ACTOR}.clip_ratio_low"] is not None else f"{ACTOR}.clip_ratio"
    mode = loss_mode(config)
    if low > MAX_CLIP_LOW and mode == "geo_mean":
        why = f"geo_mean clips the log-ratio at -{low:g}; kuberl's clipRatioLow is at most 1 (written instead)"
        out.lost.append(_lost(config, low_key, why, True))
    if high > MAX_CLIP_HIGH:
        why = f"kuberl's clipRatioHigh is at most {MAX_CLIP_HIGH:g} (written instead); verl clips at {1 + high:g}"
        high_key = (
            f"{ACTOR}.clip_ratio_high" if config[f"{ACTOR}.clip_ratio_high"] is not None else f"{ACTOR}.clip_ratio"
        )
        out.lost.append(_lost(config, high_key, why, True))
    # a ratio is positive: a lower bound at or below 0 never binds, whatever its value (see RATIO_CLIPPED)
    out.fields["algorithm.clipRatioLow"] = min(low, MAX_CLIP_LOW)
    out.fields["algorithm.clipRatioHigh"] = min(high, MAX_CLIP_HIGH)
    return out


def kl_rule(config: Config) -> Derived:
    """verl's two KL switches (a loss term, a reward penalty) -> kuberl's one KL term with a placement."""
    out = Derived()
    in_loss, in_reward = bool(config[f"{ACTOR}.use_kl_loss"]), bool(config["algorithm.use_kl_in_reward"])
    if in_loss and in_reward:
        why = "kuberl puts the KL term in the loss or the reward, not both"
        out.lost.append(_lost(config, "algorithm.use_kl_in_reward", why, True))
    if in_loss:
        coef, estimator, placement = config[f"{ACTOR}.kl_loss_coef"], config[f"{ACTOR}.kl_loss_type"], "loss"
        estimator_key = f"{ACTOR}.kl_loss_type"
    elif in_reward:
        coef, estimator, placement = config["algorithm.kl_ctrl.kl_coef"], config["algorithm.kl_penalty"], "reward"
        estimator_key = "algorithm.kl_penalty"
        if config["algorithm.kl_ctrl.type"] != "fixed":
            out.lost.append(_lost(config, "algorithm.kl_ctrl.type", "kuberl's KL coefficient is fixed", True))
    else:
        out.fields["algorithm.kl.coef"] = 0.0
        return out
    out.fields |= {"algorithm.kl.coef": coef, "algorithm.kl.placement": placement}
    if str(estimator) in KL_ESTIMATORS:
        out.fields["algorithm.kl.estimator"] = KL_ESTIMATORS[str(estimator)]
    else:
        out.lost.append(_lost(config, estimator_key, f"kuberl has no KL estimator {estimator}", True))
    return out


def dynamic_sampling_rule(config: Config) -> Derived:
    """DAPO's filter_groups -> algorithm.dynamicSampling."""
    out = Derived()
    if not config.get("algorithm.filter_groups.enable"):
        return out
    rounds = int(config.get("algorithm.filter_groups.max_num_gen_batches", 0) or 0)
    metric = str(config.get("algorithm.filter_groups.metric", "acc"))
    sampling: dict[str, Any] = {
        "enabled": True,
        "metric": {"seq_final_reward": "reward", "seq_reward": "score"}.get(metric, metric),
        "maxRoundsPerStep": rounds if rounds > 0 else 1000,
    }
    if rounds <= 0:
        why = "unbounded rounds: kuberl stops at 1000"
        out.lost.append(_lost(config, "algorithm.filter_groups.max_num_gen_batches", why, False))
    out.fields["algorithm.dynamicSampling"] = sampling
    return out


#: Keys each algorithm rule reads.
ALGORITHM_KEYS = {
    algorithm_rule: (
        "algorithm.adv_estimator",
        f"{LOSS}.loss_mode",
        f"{ACTOR}.use_gpg_loss",
        f"{LOSS}.clip_cov_ratio",
        f"{LOSS}.clip_cov_lb",
        f"{LOSS}.clip_cov_ub",
        f"{LOSS}.kl_cov_ratio",
        f"{LOSS}.ppo_kl_coef",
        f"{ACTOR}.tau_pos",
        f"{ACTOR}.tau_neg",
    ),
    aggregation_rule: (f"{ACTOR}.loss_agg_mode", f"{ACTOR}.use_token_level_loss", f"{ACTOR}.loss_scale_factor"),
    clip_rule: (f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"),
    kl_rule: (
        f"{ACTOR}.use_kl_loss",
        f"{ACTOR}.kl_loss_coef",
        f"{ACTOR}.kl_loss_type",
        "algorithm.use_kl_in_reward",
        "algorithm.kl_penalty",
        "algorithm.kl_ctrl.type",
        "algorithm.kl_ctrl.kl_coef",
    ),
    dynamic_sampling_rule: (
        "algorithm.filter_groups.enable",
        "algorithm.filter_groups.metric",
        "algorithm.filter_groups.max_num_gen_batches",
    ),
}
