"""The joint rules of the verl knob table: keys that only make sense read together (knobs.py has the rest).

Each rule reads the command line laid over verl's defaults and returns the RLJob fields the keys become
and the knobs it cannot carry; `JOINT_KEYS` says which keys each rule consumes, so the table's one-key
entries never see them.
"""

from collections.abc import Callable
from typing import Any

from kuberl.verl.algorithm_rules import ALGORITHM_KEYS
from kuberl.verl.knobs import ACTOR, CRITIC_MODEL, MODEL, REF, ROLLOUT, Config, Derived, LostKnob, model_location


def _lost(config: Config, key: str, why: str, changes_training: bool) -> LostKnob:
    return LostKnob(key, config.get(key), why, changes_training)


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


#: verl's names of a dtype (verl/utils/torch_dtypes.py PrecisionType) -> kuberl's.
DTYPES: dict[str | int, str] = {
    **dict.fromkeys(("fp32", "float32", "32", 32), "float32"),
    **dict.fromkeys(("bf16", "bfloat16"), "bfloat16"),
    **dict.fromkeys(("fp16", "float16", "16", 16), "float16"),
}


def dtype_of(value: Any) -> str:
    """A verl precision name as an RLJob dtype; ValueError (naming the knob's value) for one verl refuses too.

    >>> dtype_of("bf16"), dtype_of("fp32"), dtype_of(16)
    ('bfloat16', 'float32', 'float16')
    """
    if value not in DTYPES:
        raise ValueError(f"unexpected precision: {value!r}")
    return DTYPES[value]


def reward_rule(config: Config) -> Derived:
    """A reward model, else a custom function (file path and name), else verl's default scorer by data_source.

    verl scores with a reward model in bfloat16 on the trainer's GPUs: its reward loop serves it with vLLM in
    reward_model.rollout.dtype, and the older worker loads it in bfloat16 (workers/fsdp_workers.py
    RewardModelWorker._build_model). Both decode the response and render prompt and response again in the
    reward model's own chat template (reward_loop.py _preprocess_reward_inputs, always; the older worker when
    reward_model.model.input_tokenizer is set, the actor's path by default). kuberl scores the actor's prompt
    text followed by the response, in its reward pool.
    """
    out = Derived()
    if config.get("reward_model.enable"):
        loop = bool(config["reward_model.use_reward_loop"])
        dtype = dtype_of(config["reward_model.rollout.dtype"]) if loop else "bfloat16"
        out.fields["reward.model"] = {"path": model_location(config.get("reward_model.model.path")), "dtype": dtype}
        gpus = max(1, int(config["trainer.nnodes"]) * int(config["trainer.n_gpus_per_node"]))
        if config.get("reward_model.micro_batch_size_per_gpu"):
            out.fields["reward.model"]["batchSize"] = int(config["reward_model.micro_batch_size_per_gpu"])
        elif config.get("reward_model.micro_batch_size"):  # verl's older size, summed over GPUs
            out.fields["reward.model"]["batchSize"] = max(1, int(config["reward_model.micro_batch_size"]) // gpus)
        if loop or config["reward_model.model.input_tokenizer"] is not None:
            key = "reward_model.use_reward_loop" if loop else "reward_model.model.input_tokenizer"
            why = (
                "verl renders prompt and response again in the reward model's own chat template before scoring; "
                "kuberl scores the actor's prompt text followed by the response"
            )
            out.lost.append(_lost(config, key, why, True))
        why = (
            "verl runs the reward model on the trainer's GPUs (reward_model.enable_resource_pool: a pool of its own); "
            "kuberl's reward pool runs it on resources.reward, the CPU unless resources.reward.gpus asks for one"
        )
        out.lost.append(_lost(config, "reward_model.enable_resource_pool", why, False))
    elif config.get("custom_reward_function.path"):
        path, name = config["custom_reward_function.path"], config["custom_reward_function.name"]
        out.fields["reward.function"] = f"{path}:{name}"
    else:
        out.fields["reward.function"] = "by_data_source"
    return out


#: Each model's weights dtype in verl (fsdp_config.model_dtype, fp32 for all three: trainer/config/engine/fsdp.yaml;
#: compute runs in bfloat16 under FSDP mixed precision, as kuberl's training.computeDtype auto does on GPU).
MODEL_DTYPES = {
    f"{ACTOR}.fsdp_config.model_dtype": "models.actor.dtype",
    f"{REF}.fsdp_config.model_dtype": "models.reference.dtype",
    f"{CRITIC_MODEL}.fsdp_config.model_dtype": "models.critic.dtype",
}


def dtype_rule(config: Config) -> Derived:
    """fsdp_config.model_dtype -> models.<role>.dtype. A LoRA actor's reference is its own base weights (in the
    actor's dtype, in verl too: the actor with its adapters off)."""
    out = Derived()
    lora_reference = int(config[f"{MODEL}.lora_rank"] or 0) > 0 and not config.get(f"{REF}.model.path")
    for key, field in MODEL_DTYPES.items():
        dtype = dtype_of(config[key])
        actor = out.fields["models.actor.dtype"] if "models.actor.dtype" in out.fields else None
        if field == "models.reference.dtype" and (lora_reference or dtype == actor):
            continue  # kuberl's reference takes the actor's dtype unless told otherwise
        out.fields[field] = dtype
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


def tensor_parallel_rule(config: Config) -> Derived:
    """rollout.tensor_model_parallel_size: verl's hybrid engine splits the colocated vLLM engine over that many of
    the actor's GPUs (vLLM's external launcher), and so does kuberl's (rollout.tensorParallelSize, colocated); a
    group of them stays in one node, so it must divide the node's GPUs, as verl requires too."""
    size, gpus = int(config[f"{ROLLOUT}.tensor_model_parallel_size"]), int(config["trainer.n_gpus_per_node"])
    if size == 1:
        return Derived()
    if config.get(f"{ROLLOUT}.name") == "hf":
        why = "kuberl's hf engine runs whole on each rank; only its vLLM engine splits"
    elif gpus % size == 0:
        return Derived(fields={"rollout.tensorParallelSize": size})
    else:
        why = f"an engine split {size} ways spans {size} GPUs of one node; a node has {gpus} (trainer.n_gpus_per_node)"
    return Derived(lost=[_lost(config, f"{ROLLOUT}.tensor_model_parallel_size", why, False)])


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


#: Each trained role's offload switches, FSDP's and Megatron's (a Megatron launch keeps its memory plan under FSDP2)
#: -> its RLJob offload section.
OFFLOAD_ROLES = {
    "models.actor.offload": (f"{ACTOR}.fsdp_config", f"{ACTOR}.megatron"),
    "models.critic.offload": ("critic.model.fsdp_config", "critic.megatron"),
}
REFERENCE_OFFLOADS = (f"{REF}.fsdp_config.param_offload", f"{REF}.megatron.param_offload")
OFFLOAD_KEYS = (
    *(
        f"{prefix}.{key}"
        for prefixes in OFFLOAD_ROLES.values()
        for prefix in prefixes
        for key in ("param_offload", "optimizer_offload", "offload_policy")
    ),
    *REFERENCE_OFFLOADS,
)


def offload_rule(config: Config) -> Derived:
    """fsdp_config.param_offload / optimizer_offload / offload_policy, and megatron.param_offload /
    optimizer_offload -> models.<role>.offload.

    kuberl offloads with FSDP2's CPUOffloadPolicy, which keeps parameters and optimiser state in host memory
    together: a role that offloads either half gets both, and the half verl left on the device is reported.
    verl's param_offload moves the weights out between stages and back for compute, and so does kuberl's offload
    on one rank: an update gathers the model once and keeps its gradients on the device until the step (on more
    ranks it moves layer by layer). verl's offload_policy (offload during compute too) is offload.perLayer:
    true, layer by layer at every pass. A LoRA actor's reference is its own base weights: the reference's switch
    is reported, the actor's offload covers those weights.
    """
    out = Derived()
    for field, prefixes in OFFLOAD_ROLES.items():
        switches = {
            f"{prefix}.{key}": bool(config.get(f"{prefix}.{key}"))
            for prefix in prefixes
            for key in ("param_offload", "optimizer_offload")
        }
        params = any(on for key, on in switches.items() if key.endswith("param_offload"))
        optimizer = any(on for key, on in switches.items() if key.endswith("optimizer_offload"))
        per_layer = bool(config.get(f"{prefixes[0]}.offload_policy"))
        if per_layer:
            params = optimizer = True
        elif params != optimizer:
            source = next(key for key, on in switches.items() if on).rsplit(".", 1)[0]
            key = f"{source}.{'optimizer_offload' if params else 'param_offload'}"
            why = "FSDP2 offloads parameters and optimiser state together: kuberl offloads both"
            out.lost.append(LostKnob(key, config.get(key, False), why, False))
        if params or optimizer:
            out.fields[field] = {"params": True, "optimizer": True} | ({"perLayer": True} if per_layer else {})
    for key in REFERENCE_OFFLOADS:
        if not config.get(key):
            continue
        if int(config[f"{MODEL}.lora_rank"] or 0) > 0 and not config.get(f"{REF}.model.path"):
            why = "a LoRA actor's reference is its own base weights; models.actor.offload offloads them"
            out.lost.append(_lost(config, key, why, False))
        else:
            out.fields["models.reference.offload"] = {"params": True}
    return out


MULTI_TURN = f"{ROLLOUT}.multi_turn."


def multi_turn_rule(config: Config) -> Derived:
    """verl's multi-turn rollout (multi_turn.enable with a tool or interaction config) is not carried: a kuberl
    multi-turn job names an environment (spec.environment). With multi_turn.enable off its other keys do nothing."""
    keys = {key for key in config if key.startswith(MULTI_TURN)}
    if not config.get(f"{MULTI_TURN}enable"):
        return Derived(consumed=keys)
    why = (
        "verl's tool and interaction configs are not carried: a kuberl multi-turn job names an environment "
        "(spec.environment, runtime/environments/)"
    )
    return Derived(lost=[_lost(config, key, why, True) for key in sorted(keys)], consumed=keys)


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
    **ALGORITHM_KEYS,
    lora_rule: (f"{MODEL}.lora_rank", f"{MODEL}.lora_alpha", f"{MODEL}.target_modules"),
    reward_rule: (
        "reward_model.enable",
        "reward_model.model.path",
        "reward_model.micro_batch_size_per_gpu",
        "reward_model.micro_batch_size",
        "reward_model.use_reward_loop",
        "reward_model.rollout.dtype",
        "reward_model.model.input_tokenizer",
        "reward_model.enable_resource_pool",
        "custom_reward_function.path",
        "custom_reward_function.name",
    ),
    dtype_rule: tuple(MODEL_DTYPES),
    overlong_budget_rule: (
        *(f"{prefix}.{key}" for prefix in OVERLONG_BUFFERS for key in ("enable", "len", "penalty_factor", "log")),
        "reward_model.reward_kwargs.max_resp_len",
    ),
    config_rule: ("--config-name",),
    engine_rule: (f"{ROLLOUT}.name",),
    multi_turn_rule: (f"{MULTI_TURN}enable",),
    data_rule: ("data.filter_overlong_prompts", "data.truncation"),
    resources_rule: ("trainer.nnodes", "trainer.n_gpus_per_node"),
    tensor_parallel_rule: (f"{ROLLOUT}.tensor_model_parallel_size",),
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
