"""The joint rules of the verl knob table: keys that only make sense read together (knobs.py has the rest).

Each rule reads the command line laid over verl's defaults and returns the RLJob fields the keys become
and the knobs it cannot carry; `JOINT_KEYS` says which keys each rule consumes, so the table's one-key
entries never see them.
"""

from collections.abc import Callable
from typing import Any

from kuberl.api.enums import LossAggregation
from kuberl.api.policy_losses import SEQUENCE_LEVEL_LOSSES
from kuberl.verl.knobs import ACTOR, CRITIC_MODEL, MODEL, REF, ROLLOUT, Config, Derived, LostKnob, model_location

KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
ESTIMATORS = {  # verl adv_estimator -> (kuberl algorithm.name, advantageEstimator)
    "gae": ("ppo", "gae"),
    "grpo": ("grpo", "grpo"),
    "rloo": ("rloo", "rloo"),
    "reinforce_plus_plus": ("reinforce_pp", "reinforce_plus_plus"),
    "reinforce_plus_plus_baseline": ("grpo", "reinforce_plus_plus_baseline"),
    "remax": ("remax", "remax"),
    "opo": ("grpo", "opo"),
    "gpg": ("grpo", "gpg"),
    "grpo_passk": ("grpo", "grpo_passk"),
}
POLICY_LOSSES = {"vanilla": "ppo_clip"} | {
    name: name for name in ("gspo", "cispo", "clip_cov", "kl_cov", "gpg", "geo_mean", "sapo")
}
LOSS = f"{ACTOR}.policy_loss"


def _lost(config: Config, key: str, why: str, changes_training: bool) -> LostKnob:
    return LostKnob(key, config.get(key), why, changes_training)


def algorithm_rule(config: Config) -> Derived:
    """Estimator and policy loss (with their knobs), the clip range; a critic for gae."""
    out = Derived()
    estimator = str(config["algorithm.adv_estimator"])
    if estimator not in ESTIMATORS:
        out.lost.append(_lost(config, "algorithm.adv_estimator", f"kuberl has no estimator {estimator}", True))
        estimator = "grpo"
    name, kuberl_estimator = ESTIMATORS[estimator]
    out.fields |= {"algorithm.name": name, "algorithm.advantageEstimator": kuberl_estimator}
    loss_mode = (
        "gpg" if config.get(f"{ACTOR}.use_gpg_loss") else str(config[f"{LOSS}.loss_mode"])
    )  # verl's older switch
    if loss_mode in POLICY_LOSSES:
        out.fields["algorithm.policyLoss"] = POLICY_LOSSES[loss_mode]
    else:
        out.lost.append(_lost(config, f"{LOSS}.loss_mode", f"kuberl has no loss {loss_mode}", True))
    if loss_mode == "clip_cov":
        out.fields["algorithm.clipCov"] = {
            "ratio": config[f"{LOSS}.clip_cov_ratio"],
            "lowerBound": config[f"{LOSS}.clip_cov_lb"],
            "upperBound": config[f"{LOSS}.clip_cov_ub"],
        }
    if loss_mode == "kl_cov":
        out.fields["algorithm.klCov"] = {"ratio": config[f"{LOSS}.kl_cov_ratio"], "coef": config[f"{LOSS}.ppo_kl_coef"]}
    aggregation = str(config[f"{ACTOR}.loss_agg_mode"]).replace("-", "_")
    if config.get(f"{ACTOR}.use_token_level_loss") is not None:  # verl's older switch for the same choice
        aggregation = "token_mean" if config[f"{ACTOR}.use_token_level_loss"] else "seq_mean_token_mean"
    if POLICY_LOSSES.get(loss_mode) in SEQUENCE_LEVEL_LOSSES and aggregation != LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        why = f"kuberl's {loss_mode} weighs every response once (seq_mean_token_mean), not by its length"
        out.lost.append(_lost(config, f"{ACTOR}.loss_agg_mode", why, True))
        aggregation = LossAggregation.SEQ_MEAN_TOKEN_MEAN
    out.fields["algorithm.lossAggregation"] = str(aggregation)
    clip = config[f"{ACTOR}.clip_ratio"]
    low, high = config[f"{ACTOR}.clip_ratio_low"], config[f"{ACTOR}.clip_ratio_high"]
    out.fields["algorithm.clipRatioLow"] = clip if low is None else low
    out.fields["algorithm.clipRatioHigh"] = clip if high is None else high
    if name == "ppo":
        out.fields["models.critic"] = {}
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


def lora_rule(config: Config) -> Derived:
    """verl's lora_rank > 0 -> models.actor.lora (rank, alpha, target modules)."""
    out = Derived()
    rank = int(config[f"{MODEL}.lora_rank"] or 0)
    if rank <= 0:
        return out
    targets = config[f"{MODEL}.target_modules"]
    out.fields["models.actor.lora"] = {
        "rank": rank,
        "alpha": config[f"{MODEL}.lora_alpha"],
        "targetModules": [targets] if isinstance(targets, str) else list(targets),
    }
    return out


def reward_rule(config: Config) -> Derived:
    """A reward model, else a custom function (file path and name), else verl's default scorer by data_source."""
    out = Derived()
    if config.get("reward_model.enable"):
        out.fields["reward.model"] = {"path": model_location(config.get("reward_model.model.path"))}
        gpus = max(1, int(config["trainer.nnodes"]) * int(config["trainer.n_gpus_per_node"]))
        if config.get("reward_model.micro_batch_size_per_gpu"):
            out.fields["reward.model"]["batchSize"] = int(config["reward_model.micro_batch_size_per_gpu"])
        elif config.get("reward_model.micro_batch_size"):  # verl's older size, summed over GPUs
            out.fields["reward.model"]["batchSize"] = max(1, int(config["reward_model.micro_batch_size"]) // gpus)
    elif config.get("custom_reward_function.path"):
        path, name = config["custom_reward_function.path"], config["custom_reward_function.name"]
        out.fields["reward.function"] = f"{path}:{name}"
    else:
        out.fields["reward.function"] = "by_data_source"
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


def data_rule(config: Config) -> Derived:
    """filter_overlong_prompts and truncation -> data.overlongPrompt; verl always renders the chat template."""
    out = Derived(fields={"data.chatTemplate": True})
    truncation = str(config["data.truncation"])
    if config.get("data.filter_overlong_prompts"):
        out.fields["data.overlongPrompt"] = "drop"
    elif truncation in ("error", "left", "right"):
        out.fields["data.overlongPrompt"] = {"left": "truncate_left", "right": "truncate_right"}.get(
            truncation, "error"
        )
    else:
        out.lost.append(_lost(config, "data.truncation", "kuberl truncates left or right, not in the middle", True))
    return out


def resources_rule(config: Config) -> Derived:
    nodes, gpus = int(config["trainer.nnodes"]), int(config["trainer.n_gpus_per_node"])
    return Derived(fields={"resources.actor": {"replicas": nodes, "gpus": gpus}})


def tracking_rule(config: Config) -> Derived:
    """trainer.logger's wandb and mlflow -> spec.tracking, with verl's project and experiment names."""
    out = Derived()
    loggers = config["trainer.logger"]
    loggers = [str(logger) for logger in loggers] if isinstance(loggers, list) else [str(loggers)]
    tracking: dict[str, Any] = {
        "project": str(config["trainer.project_name"]),
        "runName": str(config["trainer.experiment_name"]),
    }
    for logger in loggers:
        if logger in ("wandb", "mlflow"):
            tracking[logger] = {}
        elif logger not in ("console", "tensorboard"):  # kuberl always writes TensorBoard events
            out.lost.append(LostKnob("trainer.logger", logger, f"kuberl has no {logger} tracker", False))
    if "wandb" in tracking or "mlflow" in tracking:
        out.fields["tracking"] = tracking
    return out


def schedule_rule(config: Config) -> Derived:
    """Warm-up: verl's steps, or its ratio of the total steps (known only when the command line gives them)."""
    out = Derived()
    steps, ratio = config[f"{ACTOR}.optim.lr_warmup_steps"], float(config[f"{ACTOR}.optim.lr_warmup_steps_ratio"])
    if steps is not None and int(steps) >= 0:
        out.fields["models.actor.optim.warmupSteps"] = int(steps)
    elif ratio > 0 and config.get("trainer.total_training_steps"):
        out.fields["models.actor.optim.warmupSteps"] = int(ratio * int(config["trainer.total_training_steps"]))
    elif ratio > 0:
        why = "a ratio of steps the converter cannot count (set trainer.total_training_steps, or warmupSteps)"
        out.lost.append(_lost(config, f"{ACTOR}.optim.lr_warmup_steps_ratio", why, True))
    return out


def mini_batch_rule(config: Config) -> Derived:
    """ppo_mini_batch_size -> algorithm.miniBatchSize. verl lets the last mini-batch of a step run short when
    the size does not divide train_batch_size; kuberl's split evenly, so such a size is lost and the largest
    size below it that divides the batch is written instead."""
    out = Derived()
    key = f"{ACTOR}.ppo_mini_batch_size"
    wanted, batch = int(config[key]), int(config["data.train_batch_size"])
    size = next((size for size in range(min(wanted, batch), 0, -1) if batch % size == 0), 1)
    out.fields["algorithm.miniBatchSize"] = size
    if size != wanted:
        why = f"kuberl's mini-batches split data.batchSize {batch} evenly; miniBatchSize {size} written instead"
        out.lost.append(_lost(config, key, why, True))
    return out


#: verl's micro-batch keys besides the actor's: each role's forward or update in pieces of this many sequences.
OTHER_MICRO_BATCHES = (
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
    f"{REF}.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
)
GLOBAL_MICRO_BATCHES = (
    f"{ACTOR}.ppo_micro_batch_size",
    f"{ROLLOUT}.log_prob_micro_batch_size",
    f"{REF}.log_prob_micro_batch_size",
    "critic.ppo_micro_batch_size",
    "critic.forward_micro_batch_size",
)


#: verl's micro-batch key of each role's pass -> the RLJob field that sizes it.
MICRO_BATCH_FIELDS = {
    f"{ROLLOUT}.log_prob_micro_batch_size": "models.actor.forwardMicroBatchSize",
    f"{REF}.log_prob_micro_batch_size": "models.reference.microBatchSize",
    "critic.ppo_micro_batch_size": "models.critic.microBatchSize",
    "critic.forward_micro_batch_size": "models.critic.forwardMicroBatchSize",
}


def micro_batch_rule(config: Config) -> Derived:
    """The actor's update micro-batch -> training.microBatchSize (every pass's default); each other role's pass
    whose size differs -> its own field (models.<role>.microBatchSize / forwardMicroBatchSize).

    verl's older global sizes (`ppo_micro_batch_size`, summed over GPUs) are divided by the GPU count, as verl
    does. A role without a model of its own here (no critic, no reference) needs no size.
    """
    out = Derived()
    gpus = max(1, int(config["trainer.nnodes"]) * int(config["trainer.n_gpus_per_node"]))
    actor_key = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    # the key the command line wrote -> its size per GPU
    sizes = {key: int(config[key]) for key in (actor_key, *OTHER_MICRO_BATCHES) if config.get(key)}
    for key in GLOBAL_MICRO_BATCHES:
        if config.get(key) and key + "_per_gpu" not in sizes:
            sizes[key] = max(1, int(config[key]) // gpus)
    actor = sizes.pop(actor_key, None) or sizes.pop(f"{ACTOR}.ppo_micro_batch_size", None)
    if actor is not None:
        out.fields["training.microBatchSize"] = actor
    for key, size in sizes.items():
        if size != actor:
            out.fields[MICRO_BATCH_FIELDS[key.removesuffix("_per_gpu")]] = size
    return out


#: Each pass's token-budget switch, its budget, the budget verl's default follows, and the RLJob field it becomes.
#: verl's defaults: the forward passes follow the actor's switch and budget; the critic's one switch cuts its
#: update and its forward, whose budget follows the update's.
TOKEN_BUDGETS: list[tuple[str, str, str | None, str]] = [
    (f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu", None, "models.actor.maxTokensPerMicroBatch"),
    (
        f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        f"{ACTOR}.ppo_max_token_len_per_gpu",
        "models.actor.forwardMaxTokensPerMicroBatch",
    ),
    (
        f"{REF}.log_prob_use_dynamic_bsz",
        f"{REF}.log_prob_max_token_len_per_gpu",
        f"{ACTOR}.ppo_max_token_len_per_gpu",
        "models.reference.maxTokensPerMicroBatch",
    ),
    ("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu", None, "models.critic.maxTokensPerMicroBatch"),
    (
        "critic.use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu",
        "critic.ppo_max_token_len_per_gpu",
        "models.critic.forwardMaxTokensPerMicroBatch",
    ),
]
#: verl's default budgets (its actor.yaml and critic.yaml).
DEFAULT_BUDGETS = {f"{ACTOR}.ppo_max_token_len_per_gpu": 16384, "critic.ppo_max_token_len_per_gpu": 32768}
REWARD_DYNAMIC_BSZ = ("reward_model.use_dynamic_bsz", "reward_model.forward_max_token_len_per_gpu")


def dynamic_batch_rule(config: Config) -> Derived:
    """use_dynamic_bsz with *_max_token_len_per_gpu -> models.<role>.(forward)MaxTokensPerMicroBatch.

    A budget without its switch does nothing in verl either. kuberl refuses a budget below the longest sequence
    (maxPromptLength + maxNewTokens), which verl only checks against the batch at hand: such a budget is raised
    to the longest sequence and reported (memory, not what is trained). The reward model's switch is lost: its
    pool scores fixed batches (reward.model.batchSize).
    """
    out = Derived()
    longest = int(config["data.max_prompt_length"]) + int(config["data.max_response_length"])
    actor_switch = config.get(f"{ACTOR}.use_dynamic_bsz")
    for switch, budget_key, default_key, field in TOKEN_BUDGETS:
        if not (config.get(switch) if config.get(switch) is not None else actor_switch):
            continue
        source = budget_key if config.get(budget_key) is not None or default_key is None else default_key
        value = config.get(source)
        budget = int(value if value is not None else DEFAULT_BUDGETS[source])
        out.fields[field] = max(budget, longest)
        if budget < longest and source not in {knob.key for knob in out.lost}:  # the key that set it, once
            why = f"kuberl's budget must hold the longest sequence (maxPromptLength + maxNewTokens): {longest}"
            out.lost.append(_lost(config, source, why, False))
    if config.get(REWARD_DYNAMIC_BSZ[0]):
        why = "the reward model scores fixed batches of reward.model.batchSize"
        out.lost += [_lost(config, key, why, False) for key in REWARD_DYNAMIC_BSZ if config.get(key) is not None]
    return out


def padding_free_rule(config: Config) -> Derived:
    """use_remove_padding (the actor's, the critic's) -> training.paddingFree, which packs every trainer's forward.

    verl switches it per model, kuberl for all trainers: when the actor and the critic disagree, kuberl packs both,
    and a model set to pad is reported (it computes the same either way). The reward model's forward
    is padded in kuberl.
    """
    out = Derived()
    keys = (f"{MODEL}.use_remove_padding", f"{CRITIC_MODEL}.use_remove_padding")
    if any(config.get(key) for key in keys):
        out.fields["training.paddingFree"] = True
        why = "training.paddingFree packs the actor's and the critic's forwards alike; both are packed"
        out.lost += [_lost(config, key, why, False) for key in keys if config.get(key) is False]
    if config.get("reward_model.model.use_remove_padding"):
        why = "the reward model's forward is padded in kuberl; it computes the same"
        out.lost.append(_lost(config, "reward_model.model.use_remove_padding", why, False))
    return out


#: Each trained role's FSDP offload switches -> its RLJob offload section.
OFFLOAD_ROLES = {f"{ACTOR}.fsdp_config": "models.actor.offload", "critic.model.fsdp_config": "models.critic.offload"}
OFFLOAD_KEYS = tuple(
    f"{prefix}.{key}" for prefix in OFFLOAD_ROLES for key in ("param_offload", "optimizer_offload", "offload_policy")
) + (f"{REF}.fsdp_config.param_offload",)


def offload_rule(config: Config) -> Derived:
    """fsdp_config.param_offload / optimizer_offload / offload_policy -> models.<role>.offload.

    kuberl offloads with FSDP2's CPUOffloadPolicy (verl's offload_policy), which keeps parameters, gradients and
    optimiser state in host memory together: a role that offloads either half gets both, and the half verl left
    on the device is reported. verl's param_offload moves the weights out between stages and back for compute;
    kuberl's copies them in layer by layer. A LoRA actor's reference is its own base weights: the reference's
    switch is reported, the actor's offload covers those weights.
    """
    out = Derived()
    for prefix, field in OFFLOAD_ROLES.items():
        params, optimizer = (bool(config.get(f"{prefix}.{key}")) for key in ("param_offload", "optimizer_offload"))
        if config.get(f"{prefix}.offload_policy"):
            params = optimizer = True
        elif params != optimizer:
            key = f"{prefix}.{'optimizer_offload' if params else 'param_offload'}"
            why = "FSDP2 offloads parameters and optimiser state together: kuberl offloads both"
            out.lost.append(LostKnob(key, config.get(key, False), why, False))
        if params or optimizer:
            out.fields[field] = {"params": True, "optimizer": True}
    if config.get(f"{REF}.fsdp_config.param_offload"):
        if int(config[f"{MODEL}.lora_rank"] or 0) > 0 and not config.get(f"{REF}.model.path"):
            why = "a LoRA actor's reference is its own base weights; models.actor.offload offloads them"
            out.lost.append(_lost(config, f"{REF}.fsdp_config.param_offload", why, False))
        else:
            out.fields["models.reference.offload"] = {"params": True}
    return out


def engine_rule(config: Config) -> Derived:
    """rollout.name: vllm and hf are kuberl's engines too; anything else (sglang) generates with vLLM."""
    name = config.get(f"{ROLLOUT}.name")
    if name in (None, "vllm", "hf"):
        return Derived(fields={"rollout.engine": name} if name else {})
    why = f"{name} is out of scope: kuberl generates with vLLM (or hf)"
    return Derived(fields={"rollout.engine": "vllm"}, lost=[_lost(config, f"{ROLLOUT}.name", why, False)])


def config_rule(config: Config) -> Derived:
    """`--config-name`: the converter knows the defaults of verl's ppo_trainer (and the Megatron variant's,
    which agree on every key it reads); another config's defaults may differ from the ones it pins."""
    name = str(config.get("--config-name") or "ppo_trainer").removesuffix(".yaml")
    if name == "ppo_trainer":
        return Derived()
    if name == "ppo_megatron_trainer":
        why = "Megatron is out of scope: kuberl trains with FSDP2"
        return Derived(lost=[_lost(config, "--config-name", why, False)])
    why = "the converter knows ppo_trainer's defaults only; check every value this config sets"
    return Derived(lost=[_lost(config, "--config-name", why, True)])


#: Where verl's versions have put DAPO's overlong buffer.
OVERLONG_BUFFERS = (
    "reward_model.overlong_buffer",
    "reward_model.reward_kwargs.overlong_buffer_cfg",
    "custom_reward_function.overlong_buffer",
)


def overlong_budget_rule(config: Config) -> Derived:
    """The DAPO reward manager's overlong buffer, in either of verl's spellings -> reward.overlongPenalty."""
    out = Derived()
    for prefix in OVERLONG_BUFFERS:
        if config.get(f"{prefix}.enable"):
            out.fields["reward.overlongPenalty"] = {
                "bufferLength": config.get(f"{prefix}.len", 4096),
                "penaltyFactor": config.get(f"{prefix}.penalty_factor", 1.0),
            }
    budget = config.get("reward_model.reward_kwargs.max_resp_len")
    if budget is not None and int(budget) != int(config["data.max_response_length"]):
        why = "kuberl's overlong buffer counts back from rollout.maxNewTokens (data.max_response_length)"
        out.lost.append(_lost(config, "reward_model.reward_kwargs.max_resp_len", why, True))
    return out


#: Keys each joint rule reads.
JOINT_KEYS: dict[Callable[[Config], Derived], tuple[str, ...]] = {
    algorithm_rule: (
        "algorithm.adv_estimator",
        f"{LOSS}.loss_mode",
        f"{ACTOR}.use_gpg_loss",
        f"{ACTOR}.loss_agg_mode",
        f"{ACTOR}.use_token_level_loss",
        f"{LOSS}.clip_cov_ratio",
        f"{LOSS}.clip_cov_lb",
        f"{LOSS}.clip_cov_ub",
        f"{LOSS}.kl_cov_ratio",
        f"{LOSS}.ppo_kl_coef",
        f"{ACTOR}.clip_ratio",
        f"{ACTOR}.clip_ratio_low",
        f"{ACTOR}.clip_ratio_high",
    ),
    kl_rule: (
        f"{ACTOR}.use_kl_loss",
        f"{ACTOR}.kl_loss_coef",
        f"{ACTOR}.kl_loss_type",
        "algorithm.use_kl_in_reward",
        "algorithm.kl_penalty",
        "algorithm.kl_ctrl.type",
        "algorithm.kl_ctrl.kl_coef",
    ),
    lora_rule: (f"{MODEL}.lora_rank", f"{MODEL}.lora_alpha", f"{MODEL}.target_modules"),
    reward_rule: (
        "reward_model.enable",
        "reward_model.model.path",
        "reward_model.micro_batch_size_per_gpu",
        "reward_model.micro_batch_size",
        "custom_reward_function.path",
        "custom_reward_function.name",
    ),
    overlong_budget_rule: (
        *(f"{prefix}.{key}" for prefix in OVERLONG_BUFFERS for key in ("enable", "len", "penalty_factor", "log")),
        "reward_model.reward_kwargs.max_resp_len",
    ),
    config_rule: ("--config-name",),
    engine_rule: (f"{ROLLOUT}.name",),
    dynamic_sampling_rule: (
        "algorithm.filter_groups.enable",
        "algorithm.filter_groups.metric",
        "algorithm.filter_groups.max_num_gen_batches",
    ),
    data_rule: ("data.filter_overlong_prompts", "data.truncation"),
    resources_rule: ("trainer.nnodes", "trainer.n_gpus_per_node"),
    tracking_rule: ("trainer.logger", "trainer.project_name", "trainer.experiment_name"),
    schedule_rule: (f"{ACTOR}.optim.lr_warmup_steps", f"{ACTOR}.optim.lr_warmup_steps_ratio"),
    mini_batch_rule: (f"{ACTOR}.ppo_mini_batch_size",),
    micro_batch_rule: (f"{ACTOR}.ppo_micro_batch_size_per_gpu", *OTHER_MICRO_BATCHES, *GLOBAL_MICRO_BATCHES),
    dynamic_batch_rule: (
        *(switch for switch, _, _, _ in TOKEN_BUDGETS),
        *(budget_key for _, budget_key, _, _ in TOKEN_BUDGETS),
        *REWARD_DYNAMIC_BSZ,
    ),
    offload_rule: OFFLOAD_KEYS,
    padding_free_rule: (
        f"{MODEL}.use_remove_padding",
        f"{CRITIC_MODEL}.use_remove_padding",
        "reward_model.model.use_remove_padding",
    ),
}
