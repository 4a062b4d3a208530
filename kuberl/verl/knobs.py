"""The table of verl's knobs: for each Hydra key, the RLJob field it becomes, or why kuberl cannot carry it.

Three kinds of entry, one per verl key (dotted, as written on verl's command line):

- `Carry(field, convert)`: the value, converted, becomes the RLJob field at `field` (a dotted path under
  `spec`, in the manifest's camelCase).
- `Lose(why, changes_training, harmless)`: kuberl has no such knob. `changes_training` says whether losing it
  changes what is trained (the loss, the data, the rewards), or only how (memory, speed, logging, the
  engine); `harmless(value)` is true for the values that lose nothing (the knob off, or at kuberl's own
  behaviour).
- a joint rule (rules.py): keys read together (the KL term, LoRA, micro-batch sizes, the trackers, ...),
  which returns the fields they become and anything lost.

`VERL_DEFAULTS` holds verl's defaults (verl/trainer/config/ppo_trainer.yaml) for every key whose default
kuberl pins or cannot match: the converter applies them under the command line's overrides, so a value
whose default differs from kuberl's (api/verl_defaults.py: GAE lambda, value clip, weight decay, loss
aggregation, ...) is written into the manifest and the converted job trains the same, and a verl default
kuberl cannot follow (the rollout's bfloat16, tensor parallelism 2) is reported lost. A key the command
line sets that the table does not know is reported as lost and assumed to change training.

To teach the converter a new knob, give its verl key an entry here (and its default in VERL_DEFAULTS when
kuberl's differs), or a joint rule in rules.py when its meaning depends on other keys (offload,
token-budget micro-batches and padding-free are such rules).
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
REF = "actor_rollout_ref.ref"
CRITIC_MODEL = "critic.model"
#: verl's use_torch_compile compiles its log-prob and entropy functions, not the model
COMPILE_LOST = (
    "verl compiles its log-prob and entropy functions; kuberl computes them a slice at a time, uncompiled "
    "(training.compile compiles the decoder layers instead, a different switch: set it yourself if you want it)"
)


@dataclass(frozen=True)
class Carry:
    """A verl key whose value becomes one RLJob field."""

    field: str
    convert: Callable[[Any], Any] = lambda value: value


def _off(value: Any) -> bool:
    return value in (None, False, 0, "", [], {})


def _among(usual: tuple[Any, ...]) -> Callable[[Any], bool]:
    """The value is one of `usual` (verl's spellings of kuberl's own setting)."""
    return lambda value: value in usual


def _any(value: Any) -> bool:
    """Every value: kuberl always does what the key would switch on."""
    return True


def _one(value: Any) -> bool:
    """1 as a size (a parallel degree of 1 is no parallelism), not True."""
    return type(value) is int and value == 1


@dataclass(frozen=True)
class Lose:
    """A verl key kuberl does not carry, and whether that changes what is trained."""

    why: str
    changes_training: bool
    harmless: Callable[[Any], bool] = _off


@dataclass(frozen=True)
class LostKnob:
    key: str
    value: Any
    why: str
    changes_training: bool

    def __str__(self) -> str:
        effect = "changes what is trained" if self.changes_training else "does not change what is trained"
        return f"{self.key}={self.value!r}: {self.why} ({effect})"


@dataclass
class Derived:
    """What a joint rule makes of its keys; `consumed` names keys it read beyond its declared ones (a family)."""

    fields: dict[str, Any] = field(default_factory=dict)
    lost: list[LostKnob] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)


Config = Mapping[str, Any]


# ------------------------------------------------------------------------------------------ defaults

VERL_DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    f"{ACTOR}.use_kl_loss": False,
    f"{ACTOR}.kl_loss_coef": 0.001,
    f"{ACTOR}.kl_loss_type": "low_var_kl",
    f"{ACTOR}.clip_ratio": 0.2,
    f"{ACTOR}.clip_ratio_low": 0.2,  # 0.2, not null, in actor.yaml since July 2025: clip_ratio alone moves nothing
    f"{ACTOR}.clip_ratio_high": 0.2,
    f"{ACTOR}.tau_pos": 1.0,
    f"{ACTOR}.tau_neg": 1.05,
    f"{ACTOR}.loss_scale_factor": None,
    f"{ACTOR}.fsdp_config.model_dtype": "fp32",
    f"{REF}.fsdp_config.model_dtype": "fp32",
    f"{CRITIC_MODEL}.fsdp_config.model_dtype": "fp32",
    f"{ACTOR}.clip_ratio_c": 3.0,
    f"{ACTOR}.loss_agg_mode": "token-mean",
    f"{ACTOR}.entropy_coeff": 0.0,
    f"{ACTOR}.ppo_epochs": 1,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ACTOR}.policy_loss.loss_mode": "vanilla",
    f"{ACTOR}.policy_loss.clip_cov_ratio": 0.0002,
    f"{ACTOR}.policy_loss.clip_cov_lb": 1.0,
    f"{ACTOR}.policy_loss.clip_cov_ub": 5.0,
    f"{ACTOR}.policy_loss.kl_cov_ratio": 0.0002,
    f"{ACTOR}.policy_loss.ppo_kl_coef": 0.1,
    f"{ACTOR}.optim.lr": 1e-6,
    f"{ACTOR}.optim.weight_decay": 0.01,
    f"{ACTOR}.optim.lr_warmup_steps": -1,
    f"{ACTOR}.optim.lr_warmup_steps_ratio": 0.0,
    f"{ACTOR}.optim.warmup_style": "constant",
    f"{ACTOR}.grad_clip": 1.0,
    f"{MODEL}.enable_gradient_checkpointing": True,
    f"{MODEL}.lora_rank": 0,
    f"{MODEL}.lora_alpha": 16,
    f"{MODEL}.target_modules": "all-linear",
    f"{ROLLOUT}.n": 1,
    f"{ROLLOUT}.temperature": 1.0,
    f"{ROLLOUT}.top_p": 1.0,
    f"{ROLLOUT}.top_k": -1,
    f"{ROLLOUT}.dtype": "bfloat16",
    f"{ROLLOUT}.tensor_model_parallel_size": 2,
    f"{ROLLOUT}.update_weights_bucket_megabytes": 512,
    "critic.optim.lr": 1e-5,
    "critic.optim.weight_decay": 0.01,
    "critic.cliprange_value": 0.5,
    "critic.grad_clip": 1.0,
    f"{CRITIC_MODEL}.enable_gradient_checkpointing": True,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.shuffle": True,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.prompt_key": "prompt",
    "trainer.total_epochs": 30,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.max_actor_ckpt_to_keep": None,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.logger": ["console", "wandb"],
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.val_before_train": True,
    "trainer.resume_mode": "auto",
    "trainer.critic_warmup": 0,
    "reward_model.enable": False,
    "reward_model.use_reward_loop": True,
    "reward_model.rollout.dtype": "bfloat16",
    "reward_model.model.input_tokenizer": "${actor_rollout_ref.model.path}",
    "reward_model.enable_resource_pool": False,
    "custom_reward_function.name": "compute_score",
}


# ------------------------------------------------------------------------------------------ converters


def _top_k(value: Any) -> int | None:
    return None if value is None or int(value) <= 0 else int(value)


def _interval(value: Any) -> int | None:
    return None if value is None or int(value) <= 0 else int(value)


def _keep(value: Any) -> int:
    """verl's max_actor_ckpt_to_keep (null: keep all) -> checkpoint.keepLast (at most 1000)."""
    return 1000 if value is None else int(value)


def model_location(path: Any) -> str:
    """A verl model path as an RLJob location: a Hugging Face repo id (`Qwen/Qwen2.5-7B`) becomes hf://.

    >>> model_location("Qwen/Qwen2.5-7B"), model_location("/models/qwen"), model_location("~/models/x")
    ('hf://Qwen/Qwen2.5-7B', '/models/qwen', '~/models/x')
    """
    text = str(path)
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) and not text.startswith(("./", "../")):
        return f"hf://{text}"
    return text


# ------------------------------------------------------------------------------------------ the table

NOT_YET = "not in kuberl yet"
ENGINE_ARGS = "not carried: pass vLLM engine arguments as spec.rollout.engineArgs (checked at validate)"

KNOBS: dict[str, Carry | Lose] = {
    # algorithm
    "algorithm.gamma": Carry("algorithm.gamma"),
    "algorithm.lam": Carry("algorithm.lam"),
    "algorithm.norm_adv_by_std_in_grpo": Carry("algorithm.normalizeAdvantageStd"),
    f"{ACTOR}.clip_ratio_c": Carry("algorithm.dualClipC"),
    f"{ACTOR}.entropy_coeff": Carry("algorithm.entropyCoef"),
    f"{ACTOR}.ppo_epochs": Carry("algorithm.ppoEpochs"),
    f"{ROLLOUT}.n": Carry("algorithm.groupSize"),
    "critic.cliprange_value": Carry("algorithm.valueClip"),
    # models and optimisers
    f"{MODEL}.path": Carry("models.actor.path", model_location),
    f"{MODEL}.enable_gradient_checkpointing": Carry("models.actor.gradientCheckpointing"),
    # the log-probs and entropy from the head's input, a slice at a time (its fused_kernel_options pick verl's kernel)
    f"{MODEL}.use_fused_kernels": Carry("training.fusedLogProbs"),
    f"{ACTOR}.optim.lr": Carry("models.actor.optim.lr"),
    f"{ACTOR}.optim.weight_decay": Carry("models.actor.optim.weightDecay"),
    f"{ACTOR}.optim.betas": Carry("models.actor.optim.betas"),
    f"{ACTOR}.optim.warmup_style": Carry("models.actor.optim.schedule"),
    f"{ACTOR}.optim.lr_scheduler_type": Carry("models.actor.optim.schedule"),
    f"{ACTOR}.grad_clip": Carry("models.actor.optim.gradClip"),
    f"{ACTOR}.optim.clip_grad": Carry("models.actor.optim.gradClip"),
    f"{CRITIC_MODEL}.path": Carry("models.critic.path", model_location),
    "critic.optim.lr": Carry("models.critic.optim.lr"),
    "critic.optim.weight_decay": Carry("models.critic.optim.weightDecay"),
    "critic.optim.betas": Carry("models.critic.optim.betas"),
    "critic.grad_clip": Carry("models.critic.optim.gradClip"),
    f"{REF}.model.path": Carry("models.reference.path", model_location),
    # data
    "data.train_files": Carry("data.train"),
    "data.val_files": Carry("data.validation"),
    "data.prompt_key": Carry("data.promptField"),
    "data.train_batch_size": Carry("data.batchSize"),
    "data.max_prompt_length": Carry("data.maxPromptLength"),
    "data.max_response_length": Carry("rollout.maxNewTokens"),
    "data.shuffle": Carry("data.shuffle"),
    # rollout
    f"{ROLLOUT}.temperature": Carry("rollout.temperature"),
    f"{ROLLOUT}.top_p": Carry("rollout.topP"),
    f"{ROLLOUT}.top_k": Carry("rollout.topK", _top_k),
    f"{ROLLOUT}.gpu_memory_utilization": Carry("rollout.gpuMemoryUtilization"),
    f"{ROLLOUT}.update_weights_bucket_megabytes": Carry("rollout.syncBucketMb"),
    f"{ROLLOUT}.dtype": Carry("rollout.dtype"),
    f"{CRITIC_MODEL}.enable_gradient_checkpointing": Carry("models.critic.gradientCheckpointing"),
    # trainer
    "trainer.total_epochs": Carry("training.epochs"),
    "trainer.total_training_steps": Carry("training.totalSteps"),
    "trainer.test_freq": Carry("training.validationEverySteps", _interval),
    "trainer.val_before_train": Carry("training.validateBeforeTraining", bool),
    "trainer.save_freq": Carry("checkpoint.intervalSteps", _interval),
    "trainer.max_actor_ckpt_to_keep": Carry("checkpoint.keepLast", _keep),
    "trainer.default_local_dir": Carry("checkpoint.uri"),
    "trainer.resume_mode": Carry("checkpoint.resume", lambda value: str(value) != "disable"),
    # lost: what is trained changes
    f"{MODEL}.exclude_modules": Lose("kuberl's LoRA has no excluded modules (it targets targetModules)", True),
    f"{MODEL}.lora_adapter_path": Lose("kuberl's LoRA starts from fresh adapters", True),
    f"{CRITIC_MODEL}.lora_rank": Lose("kuberl's LoRA is the actor's only; the critic trains every weight", True),
    f"{MODEL}.custom_chat_template": Lose("kuberl renders the tokenizer's own chat template", True),
    f"{ROLLOUT}.ignore_eos": Lose("kuberl's responses stop at EOS", True),
    "trainer.resume_from_path": Lose("kuberl resumes from the newest checkpoint under checkpoint.uri", True),
    "trainer.critic_warmup": Lose("kuberl trains the actor from the first step", True),
    "custom_reward_function.reward_kwargs": Lose("reward functions take no extra keyword arguments", True),
    "data.reward_fn_key": Lose("by_data_source reads data_source", True, lambda value: value == "data_source"),
    "algorithm.use_pf_ppo": Lose("preference-feedback PPO reweighting is not in kuberl", True),
    "data.gen_batch_size": Lose("dynamic sampling generates data.batchSize prompts per round", True),
    "data.custom_cls.path": Lose("custom dataset classes: give the prompts as jsonl or parquet", True),
    "data.apply_chat_template_kwargs": Lose("the chat template is rendered without extra arguments", True),
    f"{ACTOR}.optim.min_lr_ratio": Lose("kuberl's cosine schedule decays to 0", True),
    f"{ACTOR}.optim.num_cycles": Lose("kuberl's cosine is half a cycle", True, lambda value: value == 0.5),
    # lost: what issue #21's second part adds (how it trains: memory, speed, the engine)
    f"{ROLLOUT}.enforce_eager": Lose(ENGINE_ARGS + " (kuberl captures CUDA graphs on GPU)", False),
    f"{ROLLOUT}.free_cache_engine": Lose(ENGINE_ARGS + " (kuberl frees it on GPU)", False, lambda v: v is True),
    f"{ROLLOUT}.max_num_batched_tokens": Lose(ENGINE_ARGS, False, lambda value: False),
    f"{ROLLOUT}.max_num_seqs": Lose(ENGINE_ARGS, False, lambda value: False),
    f"{ROLLOUT}.enable_chunked_prefill": Lose(ENGINE_ARGS + " (vLLM's V1 engine always chunks)", False, bool),
    f"{ROLLOUT}.max_model_len": Lose(ENGINE_ARGS + " (kuberl's is maxPromptLength + maxNewTokens)", False),
    f"{ROLLOUT}.cudagraph_capture_sizes": Lose(ENGINE_ARGS, False),
    f"{ROLLOUT}.disable_log_stats": Lose(ENGINE_ARGS, False, lambda value: True),
    f"{ROLLOUT}.data_parallel_size": Lose(ENGINE_ARGS, False, _one),
    f"{ROLLOUT}.expert_parallel_size": Lose(ENGINE_ARGS, False, _one),
    f"{ROLLOUT}.calculate_log_probs": Lose(
        "the engine's log-probs are computed when rollout correction or useEngineLogprobs needs them", False
    ),
    # lost: how it trains, and not planned
    f"{ACTOR}.strategy": Lose("Megatron is out of scope: kuberl trains with FSDP2", False, lambda v: v == "fsdp"),
    f"{ACTOR}.fsdp_config.fsdp_size": Lose("kuberl shards over all of a pool's ranks", False, lambda v: v == -1),
    f"{ROLLOUT}.mode": Lose("kuberl's rollout is synchronous", False, lambda v: v in ("sync", "async")),
    f"{ROLLOUT}.load_format": Lose("kuberl loads the weights itself", False, lambda value: True),
    f"{ROLLOUT}.layered_summon": Lose("kuberl gathers LoRA adapters whole", False, lambda value: True),
    f"{ACTOR}.ulysses_sequence_parallel_size": Lose("sequence parallelism is not in kuberl", False, _one),
    f"{REF}.ulysses_sequence_parallel_size": Lose("sequence parallelism is not in kuberl", False, _one),
    "critic.ulysses_sequence_parallel_size": Lose("sequence parallelism is not in kuberl", False, _one),
    f"{ACTOR}.use_torch_compile": Lose(COMPILE_LOST, False),
    f"{REF}.use_torch_compile": Lose(COMPILE_LOST, False),
    # what these two switch on, kuberl always does (algorithms/token_scores.py): nothing to report either way
    f"{ACTOR}.entropy_checkpointing": Lose("the entropy's softmax is always recomputed in backward", False, _any),
    f"{ACTOR}.entropy_from_logits_with_chunking": Lose("the entropy is always computed in slices", False, _any),
    f"{MODEL}.use_liger": Lose("Liger kernels are not in kuberl", False),
    f"{MODEL}.enable_activation_offload": Lose("activation offload is not in kuberl", False),
    f"{MODEL}.trust_remote_code": Lose("kuberl loads models without remote code", False),
    f"{MODEL}.use_shm": Lose("kuberl reads the model from its location", False),
    f"{ROLLOUT}.val_kwargs.temperature": Lose(
        "validation samples at rollout.temperature, plus one greedy", False, lambda v: v == 0
    ),
    f"{ROLLOUT}.val_kwargs.n": Lose(
        "validation samples groupSize responses, plus one greedy (val/greedy_mean is verl's n=1)", False, _one
    ),
    f"{ROLLOUT}.val_kwargs.do_sample": Lose("validation samples and answers greedily, both", False),
    f"{ROLLOUT}.val_kwargs.top_p": Lose("validation uses the rollout's top_p", False, lambda v: v == 1.0),
    f"{ROLLOUT}.val_kwargs.top_k": Lose("validation uses the rollout's top_k", False, lambda v: v == -1),
    "trainer.val_only": Lose("kuberl has no validation-only run", False),
    "trainer.log_val_generations": Lose("validation texts are not logged", False),
    "trainer.rollout_data_dir": Lose("rollouts are not dumped to files", False),
    "trainer.validation_data_dir": Lose("validation generations are not dumped to files", False),
    "trainer.balance_batch": Lose("kuberl splits batches evenly by count", False, lambda v: True),
    "trainer.device": Lose("kuberl uses the GPU its pool asks for, else the CPU", False, lambda v: v == "cuda"),
    "reward_model.reward_manager": Lose(
        "kuberl's reward pool scores samples one by one", False, lambda v: v in ("naive", "dapo", "batch")
    ),
    "reward_model.launch_reward_fn_async": Lose("the reward pool overlaps with nothing else yet", False),
    "reward_model.strategy": Lose("the reward model runs with transformers", False, lambda v: v == "fsdp"),
    "data.image_key": Lose("vision models are out of scope", False, lambda v: v == "images"),
    "data.trust_remote_code": Lose("kuberl loads tokenizers without remote code", False),
    "data.return_raw_chat": Lose("kuberl keeps each record whole", False, lambda v: True),
}

#: FSDP mixed precision (fsdp_config.mixed_precision): kuberl's computes in training.computeDtype, bfloat16 on GPU,
#: reduces gradients and keeps buffers in float32 (runtime/engines/fsdp.py), verl's defaults (fsdp_workers.py).
MIXED_PRECISION = "kuberl's FSDP2 computes in bfloat16 on GPU and reduces gradients and keeps buffers in float32"
KNOBS |= {
    f"{role}.fsdp_config.mixed_precision.{key}": Lose(MIXED_PRECISION, False, _among(usual))
    for role in (ACTOR, REF, CRITIC_MODEL)
    for key, usual in (("param_dtype", ("bf16", "bfloat16")), ("reduce_dtype", ("fp32", "float32", "32", 32)),
                       ("buffer_dtype", ("fp32", "float32", "32", 32)))
}  # fmt: skip

#: Families of keys with one entry: model config overrides, Megatron's settings, every role's FSDP offload switches.
KNOB_PATTERNS: list[tuple[re.Pattern[str], Lose]] = [
    (
        re.compile(r"^(actor_rollout_ref\.model|critic\.model)\.override_config(\..*)?$"),
        Lose(
            "model config overrides (dropout, rope, ...) are not carried: kuberl trains the model's own config",
            True,
            lambda value: False,  # even a 0 overrides the config's own value
        ),
    ),
    (  # the actor's, critic's and reference's switches are offload_rule's (rules.py)
        re.compile(r"^.*(fsdp_config|megatron)\.grad_offload$"),
        Lose("gradients are offloaded with the parameters (models.<role>.offload)", False),
    ),
    (
        re.compile(r"^(actor_rollout_ref\.(actor|ref)|critic)\.megatron\..*$"),
        Lose("Megatron is out of scope: kuberl trains with FSDP2", False, lambda value: _off(value) or _one(value)),
    ),
    (
        re.compile(r"^reward_model\..*fsdp_config\.(param_offload|optimizer_offload|offload_policy)$"),
        Lose("the reward model runs unsharded with transformers, on its pool's device", False),
    ),
    (  # its dtype is reward_rule's (rules.py)
        re.compile(r"^reward_model\.(rollout\..*|num_workers)$"),
        Lose("kuberl's reward pool runs the reward model with transformers, not a served engine", False),
    ),
]


def knob_for(key: str) -> Carry | Lose | None:
    """The table's entry for a verl key: its own, or its family's; None for a key the table does not know."""
    if key in KNOBS:
        return KNOBS[key]
    return next((knob for pattern, knob in KNOB_PATTERNS if pattern.match(key)), None)


#: Keys whose values cannot change anything kuberl does: sizes of verl's own workers, logs and profilers.
NO_EFFECT = re.compile(
    r"^(data\.(val_batch_size|dataloader_num_workers|return_raw_input_ids|return_full_prompt|"
    r"filter_overlong_prompts_workers|validation_shuffle|tokenizer|use_shm)|"
    r"actor_rollout_ref\.(hybrid_engine|nccl_timeout|model\.fused_kernel_options\..*)|"
    r"actor_rollout_ref\.(actor|ref)\.fsdp_config\.(wrap_policy\..*|reshard_after_forward|forward_prefetch)|"
    r"actor_rollout_ref\.actor\.checkpoint\..*|critic\.checkpoint\..*|"
    r"trainer\.(ray_wait_register_center_timeout|esi_redundant_time|del_local_ckpt_after_load|default_hdfs_dir|"
    r"max_critic_ckpt_to_keep|use_legacy_worker_impl)|"
    r"ray_kwargs\..*|ray_init\..*|global_profiler\..*|.*\.profiler\..*)$"
)
