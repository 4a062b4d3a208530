"""FSDP2 training engine: one rank's share of a model, its forward passes and its updates.

Parameters are sharded with `fully_shard` per decoder layer and at the root (torchtitan's
layout). Every rank runs the same number of forward/backward calls (collectives), which the
controller guarantees by giving each rank an equal number of rows.

Loss values are each rank's *contribution* to the loss of the whole mini-batch (global token
and sequence counts in the denominators), and gradients are summed across ranks instead of
averaged, so a 2-rank update equals a single-process update on the unsharded batch.

With CPU offload (models.<role>.offload) the shards and the optimiser state live in host memory (FSDP2's
CPUOffloadPolicy); an update gathers the model for its passes and reduces its gradients once, at the last
(`FSDPTrainer.before_pass`), unless offload.perLayer copies layer by layer at every pass.

With training.paddingFree each micro-batch runs packed, without its padding (engines/packing.py);
models.<role>.maxTokensPerMicroBatch cuts micro-batches by tokens (engines/micro_batches.py). With
training.fusedLogProbs the LM head scores the response tokens from its input inside the forward, a slice of
tokens at a time, and the pass's logits are never made whole (models/scoring_head.py). With training.compile each
decoder layer's forward is compiled by torch.compile (models/layers.py).

A LoRA actor (`models.lora`) is a PEFT model: FSDP2 shards it the same way (the decoder layers are
the wrapped model's), only the adapters require gradients, and only they get optimiser state.
"""

import contextlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.algorithms.token_scores import token_scores
from kuberl.runtime.engines.grad_norm import gradient_norm, needs_clipping
from kuberl.runtime.engines.inputs import ForwardInput
from kuberl.runtime.engines.micro_batches import MicroBatching, micro_batches
from kuberl.runtime.models.attention_masks import (
    attends_without_a_mask,
    builds_own_mask,
    own_sdpa,
    packed_mask,
    padded_mask,
)
from kuberl.runtime.models.layers import compile_decoder_layers, decoder_layers
from kuberl.runtime.models.lora import adapters_off, transformers_model
from kuberl.runtime.models.scoring_head import (
    FIELD,
    HeadScoring,
    output_head,
    scores_out_of,
    scoring_head,
    why_head_cannot_score,
)


def apply_fsdp(
    model: torch.nn.Module,
    world_size: int,
    device_type: str,
    compute_dtype: torch.dtype = torch.float32,
    offload: bool = False,
) -> torch.nn.Module:
    """Shard each decoder layer, then the root, over all ranks.

    On GPU a bfloat16 `compute_dtype` is FSDP2's mixed precision (gathered in bf16, gradients reduced
    in fp32). On CPU FSDP2 never casts (the trainer's forward runs under `torch.autocast` instead).
    A single rank keeps the plain module (`runs_unsharded`): there is nothing to shard, and FSDP2's per-layer
    unshard and gradient copies cost ~10% of a step on CPU (bench/vs_trl.py) and left a single H200 host-bound
    (#38's profile: 1.69 s against plain PyTorch's 1.09 s for a 1.5B update); its forward runs under
    `torch.autocast` in the compute dtype, as plain PyTorch's mixed precision does. Checkpoints are the same
    either way (DCP state dicts are keyed by name; see test_checkpoint_state).

    `offload`: FSDP2's CPUOffloadPolicy on every unit (the shards, gradients and optimiser state in host memory);
    pinned memory on GPU for faster copies, unpinned on CPU (pinning needs CUDA). A single CPU rank holds
    everything in host memory already; a single GPU rank that offloads stays under FSDP2, which does the copies.
    """
    if runs_unsharded(world_size, device_type, offload):
        return model
    mesh = init_device_mesh(device_type, (world_size,))
    policy = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if device_type == "cuda" and compute_dtype != torch.float32
        else MixedPrecisionPolicy()
    )
    placement = CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=placement)
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=placement)
    for module in model.modules():  # the settings are per FSDP unit, not inherited
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum, not average: each rank's loss is already its share
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM collective (gloo has no PREMUL_SUM)
    return model


def runs_unsharded(world_size: int, device_type: str, offload: bool) -> bool:
    """Whether a trainer keeps its plain module instead of FSDP2's units: a single rank, unless it is a GPU rank
    whose shards live in host memory (FSDP2's offload moves them).

    >>> runs_unsharded(1, "cuda", False), runs_unsharded(1, "cuda", True), runs_unsharded(2, "cuda", False)
    (True, False, False)
    >>> runs_unsharded(1, "cpu", True), runs_unsharded(2, "cpu", False)
    (True, False)
    """
    return world_size == 1 and (device_type == "cpu" or not offload)


@dataclass(frozen=True)
class OffloadLayout:
    """What an offloaded model keeps on the device across the passes of an optimiser step
    (models.<role>.offload.perLayer and .gradientsOnDevice; `FSDPTrainer.before_pass`)."""

    gathers_weights: bool  # the whole model gathered once, in the compute dtype, rather than a layer at a time
    keeps_gradients: bool  # its gradients, unreduced, reduced and copied out at the step's last pass only

    @classmethod
    def of(cls, per_layer: bool | None, gradients_on_device: bool | None, world_size: int) -> "OffloadLayout":
        """The fields as set; unset, one rank gathers the model and more move it layer by layer (each would
        otherwise hold the whole model), as does a model whose gradients go out at every pass. A gathered model
        keeps its gradients (the rules refuse perLayer: false with gradientsOnDevice: false).

        >>> def held(*fields):
        ...     layout = OffloadLayout.of(*fields)
        ...     return layout.gathers_weights, layout.keeps_gradients
        >>> held(None, None, 1), held(None, None, 2), held(False, None, 2)
        ((True, True), (False, False), (True, True))
        >>> held(True, None, 1), held(True, True, 1), held(None, True, 2), held(None, False, 1)
        ((False, False), (False, True), (False, True), (False, False))
        """
        if per_layer is None:
            per_layer = world_size > 1 or gradients_on_device is False
        keeps = not per_layer or bool(gradients_on_device)
        return cls(gathers_weights=not per_layer, keeps_gradients=keeps)


def autocast_dtype(device_type: str, compute_dtype: torch.dtype, sharded: bool) -> torch.dtype | None:
    """The dtype a trainer's forward passes run under `torch.autocast` in, or None: whenever it computes in less
    than fp32 and FSDP2 does not cast for it (FSDP2's mixed precision casts on GPU only, and only a sharded model).

    >>> autocast_dtype("cuda", torch.bfloat16, sharded=True), autocast_dtype("cuda", torch.bfloat16, sharded=False)
    (None, torch.bfloat16)
    >>> autocast_dtype("cpu", torch.bfloat16, sharded=True), autocast_dtype("cuda", torch.float32, sharded=False)
    (torch.bfloat16, None)
    """
    if compute_dtype == torch.float32 or (device_type == "cuda" and sharded):
        return None
    return compute_dtype


def offloaded_to_cpu(model: torch.nn.Module) -> bool:
    """Whether FSDP2 keeps this model's shards in host memory (what apply_fsdp's `offload` set, read back from
    FSDP2's own state: every unit must agree)."""
    units = [module for module in model.modules() if isinstance(module, FSDPModule)]
    flags = [
        fsdp_param.offload_to_cpu
        for unit in units
        for group in [unit._get_fsdp_state()._fsdp_param_group]
        if group is not None
        for fsdp_param in group.fsdp_params
    ]
    return bool(flags) and all(flags)


def store_frozen_linears(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Casts the frozen weights and biases of `model`'s linear layers to `dtype`, the dtype it computes in; returns
    the bytes that frees.

    A frozen linear weight is only ever read by a matmul, which computes in `dtype` anyway: under autocast, which
    casts an fp32 weight to `dtype` at every use (and keeps no cast of a frozen one), or under FSDP2's mixed
    precision, which casts each shard before gathering it. Stored in `dtype` it computes the same values, bit for
    bit, in half the memory and without the casts. That is every linear layer of a reference model (verl computes
    its reference in bf16 too) and the base layers of a LoRA actor (#38: plain PEFT keeps its frozen base in
    bf16). A weight shared with a module that is not a linear layer (a head tied to the embedding, whose lookup
    is no matmul) stays as it is, as do embeddings and norms.
    """
    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear) for p in m.parameters(False)}
    freed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for param in module.parameters(recurse=False):
            if not param.requires_grad and id(param) not in shared and param.dtype != dtype:
                freed += param.numel() * (param.element_size() - dtype.itemsize)
                param.data = param.data.to(dtype)
    return freed


def keeps_frozen_in_compute_dtype(
    trained: bool, lora: bool, compute_dtype: torch.dtype, rollout_dtype: torch.dtype
) -> bool:
    """Whether a trainer stores its frozen linear layers in its compute dtype (`store_frozen_linears`): a model
    nothing of which is trained (the reference) whenever it computes below fp32; a LoRA actor's base when its
    rollout engine also runs in the compute dtype. Against an engine in fp32, the verifySync probe compares the
    engine with the trainer's weights in fp32, which needs the base's fp32 values (a model saved in fp32 would
    differ from its bf16 rounding by more than the probe's tolerance).

    >>> bf16, fp32 = torch.bfloat16, torch.float32
    >>> keeps_frozen_in_compute_dtype(False, False, bf16, fp32), keeps_frozen_in_compute_dtype(False, False, fp32, fp32)
    (True, False)
    >>> keeps_frozen_in_compute_dtype(True, True, bf16, bf16), keeps_frozen_in_compute_dtype(True, True, bf16, fp32)
    (True, False)
    >>> keeps_frozen_in_compute_dtype(True, False, bf16, bf16)  # a full actor or critic: nothing frozen
    False
    """
    if compute_dtype == torch.float32:
        return False
    return not trained or (lora and rollout_dtype == compute_dtype)


def indexed(device: torch.device) -> torch.device:
    """`device` with its index. A tensor made on "cuda" is on the current device, "cuda:0", and torch compares
    the two as different devices: a trainer given "cuda" refused its own inputs on the first GPU run of the tests.

    >>> indexed(torch.device("cpu")), indexed(torch.device("cuda", 1))
    (device(type='cpu'), device(type='cuda', index=1))
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def adamw_implementation(parameters_on: str, trainer_on: str) -> dict[str, bool]:
    """AdamW's kernel for parameters on device type `parameters_on`, of a trainer on `trainer_on`.

    - On CUDA, the fused kernel: it updates every shard in a few launches, where the for-loop launches a handful
      of kernels per parameter and left the GPU idle (94 ms against 16 ms for a 1.5B step on one H200, #38's
      profile). torchtitan's default for FSDP2's DTensor parameters is the same ("fused").
    - In host memory beside a GPU (models.<role>.offload): the CPU's fused kernel. The for-loop's step of an
      offloaded 0.5B model took 0.74 s on the H200 machine's 16 cores, the fused one 0.14 s (bench/README.md).
    - A CPU run keeps the for-loop: its numbers do not change.

    >>> adamw_implementation("cuda", "cuda"), adamw_implementation("cpu", "cuda"), adamw_implementation("cpu", "cpu")
    ({'fused': True, 'foreach': False}, {'fused': True, 'foreach': False}, {'fused': False, 'foreach': False})
    """
    return {"fused": parameters_on == "cuda" or trainer_on == "cuda", "foreach": False}


def build_optimizer(
    model: torch.nn.Module, spec: OptimizerSpec, total_steps: int, device_type: str = "cpu"
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `model`'s trained parameters, for a trainer on `device_type`, and its learning-rate schedule."""
    trained = [param for param in model.parameters() if param.requires_grad]  # with LoRA: the adapters only
    optimizer = torch.optim.AdamW(
        trained,
        lr=spec.lr,
        betas=(spec.betas[0], spec.betas[1]),
        weight_decay=spec.weight_decay,
        **adamw_implementation(trained[0].device.type if trained else "cpu", device_type),
    )
    warmup, schedule = spec.warmup_steps, spec.schedule.value

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as in generation."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (n, P+R)


def process_group_backend(device_type: str) -> str:
    """The backend of a trainer's process group: gloo on CPU; on GPU NCCL for the device's tensors *and* gloo
    for the host's, so host-side counts (a mini-batch's tokens, the passes each rank needs, a skipped step's
    verdict) all-reduce without a round trip through the GPU (verl's `cpu:gloo,cuda:nccl`).

    >>> process_group_backend("cuda"), process_group_backend("cpu")
    ('cpu:gloo,cuda:nccl', 'gloo')
    """
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def forget_sharding_caches() -> bool:
    """Forget what DTensor cached about this process's device meshes; call it before the process group goes.
    True when every cache was cleared, so the process can join a new group, at any rank (group.WarmWorkers).

    DTensor remembers each op's output sharding by its input specs. A device mesh compares equal to any other over
    the same ranks and layout, whatever this process's rank in it and whichever process group backs it. So in a
    process that joins a new group after the old one was destroyed, the cache hands the new DTensors the old mesh,
    with the old rank. DCP places a shard by its mesh's rank: a process that was rank 1 and is now rank 0 saves its
    shards at rank 1's offsets. Training goes on unharmed, since the local shards are right, but every checkpoint
    and the exported model come out with their halves swapped. Megatron-LM met the same cache on teardown
    (NVIDIA/Megatron-LM#7029) and clears it while the groups still live, as here.

    The clear functions are torch's private ones (`torch.distributed.tensor.debug`). On a torch without them this
    returns False, and the process must not host another run.
    """
    try:
        from torch.distributed.tensor._redistribute import _gen_transform_infos
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:
        return False
    _clear_sharding_prop_cache()  # the Python cache (this thread's: the worker's methods run on one) and C++'s
    _gen_transform_infos.cache_clear()  # redistribution plans, keyed by the same specs
    return True


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes transformers' `logits_to_keep`: the LM head then runs only at the positions
    asked for, an int (the last n) or a tensor of indices. A LoRA model's (PEFT) forward hands it to its base's.

    The head is a large matmul (vocabulary x hidden) and its output the largest activation of an update: run over
    the prompt, where no token is scored, it is work and memory thrown away (TRL asks for the completion's only).
    """
    return "logits_to_keep" in inspect.signature(transformers_model(model).forward).parameters


class FSDPTrainer:
    """A causal LM (actor/reference) or a token-value model (critic) on one rank.

    `frozen_in_compute_dtype`: its frozen linear layers are stored in `compute_dtype` (`store_frozen_linears`;
    whether a role does: `keeps_frozen_in_compute_dtype`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        world_size: int,
        device: torch.device,
        optim: OptimizerSpec | None,
        total_steps: int,
        gradient_checkpointing: bool = False,
        compute_dtype: torch.dtype = torch.float32,
        offload: bool = False,
        offload_per_layer: bool | None = None,
        offload_gradients_on_device: bool | None = None,
        padding_free: bool = False,
        frozen_in_compute_dtype: bool = False,
        fused_log_probs: bool = False,
        compile_layers: bool = False,
    ) -> None:
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()  # type: ignore[operator]  # a transformers PreTrainedModel
        self.device = indexed(device)
        self.world_size = world_size
        #: frozen linear layers held in the compute dtype (a reference model, a LoRA actor's base): see the function
        low_precision = frozen_in_compute_dtype and compute_dtype != torch.float32
        self.frozen_in_compute_dtype = low_precision and store_frozen_linears(model, compute_dtype) > 0
        # offloaded, the model stays in host memory: fully_shard moves one unit at a time to the device, shards it
        # and copies its shard back, so the whole model is never on the device at once
        self.model = apply_fsdp(model if offload else model.to(device), world_size, device.type, compute_dtype, offload)
        self.padding_free = padding_free  # training.paddingFree: packed forwards (engines/packing.py)
        #: the 4D attention mask built here, so transformers reads nothing on the host per pass (models/attention_masks)
        self.builds_own_mask = hasattr(model, "config") and builds_own_mask(model.config)
        #: and none for a pass without padding: SDPA's causal kernel, under `own_sdpa`
        self.causal_when_unpadded = attends_without_a_mask(model)
        # mixed precision FSDP2 does not do: forward passes under autocast (its backward follows the forward's dtypes)
        sharded = any(isinstance(module, FSDPModule) for module in self.model.modules())
        self.autocast_dtype = autocast_dtype(device.type, compute_dtype, sharded)
        #: an offloaded model that keeps its gathered weights (and its gradients) on the device for an optimiser
        #: step's passes (`before_pass`), unless it moves layer by layer (models.<role>.offload.perLayer); and one
        #: that keeps its gradients there, reduced and copied out at the step's last pass only (.gradientsOnDevice)
        layout = OffloadLayout.of(offload_per_layer, offload_gradients_on_device, world_size)
        offloaded = offload and isinstance(self.model, FSDPModule)
        self.gathers_per_step = offloaded and layout.gathers_weights
        self.reduces_per_step = offloaded and layout.keeps_gradients
        self.optim_spec = optim
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if optim is not None:
            self.optimizer, self.scheduler = build_optimizer(self.model, optim, total_steps, self.device.type)
        self.is_critic = not hasattr(model, "lm_head")
        #: the LM head runs only where a response token is predicted, not over the prompt (`logits_to_keep`)
        self.keeps_logits = not self.is_critic and takes_logits_to_keep(model)
        #: training.fusedLogProbs: the head scores the tokens from its input, never making the logits whole
        #: (models/scoring_head.py); a critic has no head to score with
        self.scoring_head: torch.nn.Linear | None = None
        if fused_log_probs and not self.is_critic:
            reason = why_head_cannot_score(model, self.keeps_logits)
            if reason is not None:
                raise ValueError(f"{FIELD}: {reason}, so it cannot score from its input: set it to false")
            self.scoring_head = output_head(model)
        if compile_layers:  # training.compile: each decoder layer's forward by torch.compile (models/layers.py)
            compile_decoder_layers(self.model)

    # -- forward passes -------------------------------------------------------------------------
    def _autocast(self, full_precision: bool = False) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the compute dtype where the trainer computes below fp32 and FSDP2 does not cast. A pass in
        `full_precision` (the verifySync probe: the weights' own precision) runs without it, except when frozen
        linear layers are stored in the compute dtype: their own precision is that dtype, which autocast keeps."""
        if self.autocast_dtype is None or (full_precision and not self.frozen_in_compute_dtype):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _predictions(
        self, inputs: ForwardInput, full_precision: bool = False, scoring: HeadScoring | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The model's outputs at the positions that predict response tokens, logits (..., V) or the critic's values
        (..., 1), or with `scoring` the head's score columns (..., k) (`scoring_head`), and where each belongs in the
        rows' flattened (m * R) response layout: (m, R, ...) and None padded, (K, ...) and the K places packed.

        Padded, every response position is returned, padding too. Packed (training.paddingFree), only positions
        holding a real token are, and the rest of the work (log-softmax, entropy) skips the padding too. Where the
        model takes `logits_to_keep` (`keeps_logits`), the LM head runs only at the returned positions (padded, and
        at each row's last one); otherwise over every position. `inputs` are on this trainer's device already
        (`ForwardInput.to`).
        """
        if inputs.device != self.device:
            raise ValueError(f"the forward input is on {inputs.device}, the trainer on {self.device}: move it first")
        head = self.scoring_head
        scores_at_head: contextlib.AbstractContextManager[list[Tensor]] = (
            scoring_head(head, scoring) if scoring is not None and head is not None else contextlib.nullcontext([])
        )
        with self._autocast(full_precision), scores_at_head as made:
            packed = inputs.packed
            if packed is None:
                mask = inputs.attention_mask  # (m, P+R)
                causal = inputs.unpadded and self.causal_when_unpadded
                if causal:
                    attention: Tensor | None = None  # every key before a query is real: SDPA's causal kernel
                else:
                    attention = padded_mask(mask) if self.builds_own_mask else mask  # (m, 1, L, L) or (m, L)
                # the last R + 1 positions: P - 1 predicts the first response token, the last one predicts nothing
                width = inputs.response_ids.shape[1] + 1
                keep: dict[str, int | Tensor] = {"logits_to_keep": width} if self.keeps_logits else {}
                with own_sdpa(self.model) if causal else contextlib.nullcontext():
                    out = self.model(
                        input_ids=inputs.input_ids,
                        attention_mask=attention,
                        position_ids=position_ids(mask),
                        use_cache=False,
                        **keep,
                    )
                if scoring is not None:
                    return scores_out_of(out.logits, made, self.model), None  # (m, R, k)
                return out.logits[:, -width:-1], None  # (m, R, V) position t predicts token t
            # position ids that restart: each sequence attends within itself (without a mask, transformers reads that
            # from the position ids, as flash-attention and FlexAttention do)
            own = packed_mask(packed.position_ids) if self.builds_own_mask else None  # (1, 1, T, T)
            keep = {"logits_to_keep": packed.sources} if self.keeps_logits else {}  # the K predicting positions
            out = self.model(
                input_ids=packed.input_ids,
                attention_mask=own,
                position_ids=packed.position_ids,
                use_cache=False,
                **keep,
            )
            if scoring is not None:
                return scores_out_of(out.logits, made, self.model)[0], packed.targets  # (K, k), (K,)
            logits = out.logits[0] if self.keeps_logits else out.logits[0].index_select(0, packed.sources)  # (K, V)
            return logits, packed.targets  # (K, V), (K,)

    def forward_values(self, inputs: ForwardInput) -> Tensor:
        """(m, R) the critic's V(s_t) for response token t, read at the position that generated it."""
        values, targets = self._predictions(inputs)  # (m, R, 1) or (K, 1)
        return into_rows(values[..., 0].float(), inputs.response_ids.shape, targets)  # (m, R)

    def response_logprobs(
        self,
        inputs: ForwardInput,
        temperature: float,
        with_entropy: bool = False,
        full_precision: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(m, R) log-probs of the response tokens, and their entropies when asked, on this trainer's device."""
        scores = self.response_scores(inputs, temperature, entropy=with_entropy, full_precision=full_precision)
        return scores.logprobs, scores.entropy

    def response_scores(
        self,
        inputs: ForwardInput,
        temperature: float,
        *,
        entropy: bool = False,
        sum_pi_squared: bool = False,
        full_precision: bool = False,
    ) -> "TokenScores":
        """What one forward pass gives of each response token (m, R), on this trainer's device: its log-prob under
        the temperature-scaled distribution, and when asked that distribution's entropy and sum_v pi(v)^2 (the
        token baselines' path variance reads it).

        In float32 a slice of tokens at a time: from the logits (`token_scores`), or with training.fusedLogProbs
        from the head's input inside the forward (`scoring_head`), so that the logits are never made whole."""
        targets = None if inputs.packed is None else inputs.packed.targets  # (K,) packed
        labels = inputs.response_ids  # (m, R)
        labels = labels if targets is None else labels.reshape(-1).index_select(0, targets)  # (K,)
        if self.scoring_head is not None:
            scoring = HeadScoring(
                labels if targets is None else labels.unsqueeze(0), temperature, entropy, sum_pi_squared
            )
            columns, _ = self._predictions(inputs, full_precision, scoring)  # (m, R, k) or (K, k)
            logprobs, entropies, squares = scoring.split(columns)
        else:
            logits, _ = self._predictions(inputs, full_precision)  # (m, R, V) or (K, V), in the compute dtype
            logprobs, entropies, squares = token_scores(
                logits, labels, temperature, entropy=entropy, sum_pi_squared=sum_pi_squared
            )
        shape = inputs.response_ids.shape

        def rows(values: Tensor) -> Tensor:
            return into_rows(values, shape, targets)  # (m, R)

        return TokenScores(
            logprobs=rows(logprobs),
            entropy=None if entropies is None else rows(entropies),
            sum_pi_squared=None if squares is None else rows(squares),
        )

    def on_device(self, inputs: ForwardInput) -> ForwardInput:
        """Host rows as this trainer's forward passes read them: on its device, packed when it trains padding-free."""
        return inputs.to(self.device, pack=self.padding_free)

    @torch.no_grad()
    def logprobs(
        self,
        batch: ForwardInput,
        temperature: float,
        micro_batch_size: int,
        full_precision: bool = False,
        base_only: bool = False,
        max_tokens: int | None = None,
    ) -> Tensor:
        """(n, R) log-probs of the response tokens, on the host; `full_precision` skips autocast.

        Micro-batches of `micro_batch_size` rows, or of up to `max_tokens` tokens when set (maxTokensPerMicroBatch).

        `base_only`: with the LoRA adapters switched off, i.e. the base model (the KL reference of a LoRA run).
        """
        scores = self.scores(batch, temperature, MicroBatching(micro_batch_size, max_tokens), full_precision, base_only)
        return scores.logprobs

    @torch.no_grad()
    def scores(
        self,
        batch: ForwardInput,
        temperature: float,
        batching: MicroBatching,
        full_precision: bool = False,
        base_only: bool = False,
        sum_pi_squared: bool = False,
    ) -> "TokenScores":
        """`response_scores` of every row (n, R), pass by pass, read back to the host once at the end."""
        self.model.eval()
        with adapters_off(self.model) if base_only else contextlib.nullcontext():
            parts = [
                self.response_scores(
                    self.on_device(batch.rows(rows)),
                    temperature,
                    sum_pi_squared=sum_pi_squared,
                    full_precision=full_precision,
                )
                for rows in self.micro_batches(batch, batching)
            ]
        logprobs = self.to_host(torch.cat([part.logprobs for part in parts]))  # (n, R)
        if not sum_pi_squared:
            return TokenScores(logprobs)
        squares = self.to_host(torch.cat([part.sum_pi_squared for part in parts if part.sum_pi_squared is not None]))
        return TokenScores(logprobs, sum_pi_squared=squares)  # (n, R) each

    @torch.no_grad()
    def values(self, batch: ForwardInput, micro_batch_size: int, max_tokens: int | None = None) -> Tensor:
        """(n, R) the critic's values, on the host."""
        self.model.eval()
        parts = [
            self.forward_values(self.on_device(batch.rows(rows)))
            for rows in self.micro_batches(batch, MicroBatching(micro_batch_size, max_tokens))
        ]
        return self.to_host(torch.cat(parts))  # (n, R)

    def micro_batches(self, batch: ForwardInput, batching: MicroBatching, span: slice = slice(None)) -> Sequence[slice]:
        """The micro-batches (slices of the batch's rows) of the rows in `span`; as many on every rank."""
        start = span.start or 0
        return [
            slice(start + cut.start, start + cut.stop) for cut in micro_batches(batch.attention_mask[span], batching)
        ]

    def to_host(self, values: Tensor) -> Tensor:
        """Device values on the host: a pass's or an update's results, read once at its end (on a GPU, this waits
        for the work queued before it)."""
        return values.detach().cpu()

    # -- updates ----------------------------------------------------------------------------------
    def before_pass(self, last: bool) -> None:
        """Before each forward/backward pass of an optimiser step (`last`: its final pass): an offloaded model
        (unless offloaded per layer) keeps its weights gathered and its gradients on the device until the last
        pass, which reduces them and copies them to the host once; offloaded per layer with gradientsOnDevice,
        only its gradients.

        FSDP2's offload otherwise copies every layer's shard in at each forward and again at each backward, and
        every pass's gradients out, blocking, to be added to the host's: on one H200 a 0.5B update of 8 passes
        spent 4.0 of its 6.4 s in those copies, nearly all of it the gradients' (models.<role>.offload.perLayer
        keeps that, for a model whose gathered weights and gradients do not fit the device). Gathered for the
        step it took 1.6 s, against 1.0 s on the device, at 0.71x the device's peak memory (bench/README.md).
        """
        if not self.reduces_per_step:
            return
        assert isinstance(self.model, FSDPModule)
        if self.gathers_per_step:
            self.model.set_reshard_after_forward(False)  # the backward reuses the forward's gathered weights
            self.model.set_reshard_after_backward(last)  # and so does the next pass
        self.model.set_requires_gradient_sync(last)  # gradients accumulate on the device, unreduced

    def optimizer_step(self, loss: Tensor | float | None = None) -> dict[str, Tensor | float]:
        """Clip and step; skipped (gradients dropped) when the gradient norm or any rank's `loss` is not finite.

        As in verl's actor: a NaN or infinite update never reaches the weights or the optimiser state, and
        the learning-rate schedule still advances. `skipped` (1.0 or 0.0) is the same on every rank, which
        must take the same decision: the norm is global, the loss is not, so the verdict is all-reduced. That
        verdict is the step's one read of a device value on the host; the gradient norm stays on the device.
        """
        assert self.optimizer is not None and self.scheduler is not None and self.optim_spec is not None
        if self.gathers_per_step:  # the forward-only passes that follow (log-probs) free each layer again
            assert isinstance(self.model, FSDPModule)
            self.model.set_reshard_after_forward(True)
        clip = self.optim_spec.grad_clip
        parameters = list(self.model.parameters())
        # clip_grad_norm_ in two halves, as verl's fsdp2_clip_grad_norm_: the norm of host gradients is ours
        grads = [param.grad for param in parameters if param.grad is not None]
        norm = gradient_norm(grads, self.device, self.world_size)  # in host memory for host gradients
        if clip is not None and needs_clipping(norm, clip):
            torch.nn.utils.clip_grads_with_norm_(parameters, clip, norm)
        norm = norm.to(self.device)
        finite = torch.isfinite(norm)  # ()
        if loss is not None:
            finite = finite & torch.isfinite(torch.as_tensor(loss, device=norm.device))  # ()
        skipped = global_sum(0.0 if bool(finite) else 1.0) > 0.0
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a skip before the first optimiser step is not the mistake torch warns of
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        return {"grad_norm": norm.detach(), "lr": float(lr), "skipped": 1.0 if skipped else 0.0}

    # -- weights out --------------------------------------------------------------------------------
    def full_tensors(self, select: Callable[[str], bool] | None = None) -> Iterator[tuple[str, Tensor]]:
        """Each parameter (those whose name `select` accepts) gathered in full, one at a time: at most one
        full tensor is alive per step.

        Every rank must iterate to the end (each step is an all-gather).
        """
        for name, param in self.model.named_parameters():
            if select is not None and not select(name):
                continue
            # an offloaded shard is in host memory: onto the device for the all-gather (verl does the same)
            full = param.data.to(self.device)
            full = full.full_tensor() if isinstance(full, DTensor) else full
            yield name, full.detach()
            del full


@dataclass(frozen=True)
class TokenScores:
    """Per response token of m rows, (m, R) each: what a forward pass gives beside the model's outputs."""

    logprobs: Tensor  # log pi(token) under the temperature-scaled distribution
    entropy: Tensor | None = None  # its entropy
    sum_pi_squared: Tensor | None = None  # sum_v pi(v)^2, the distribution's collision probability


def into_rows(values: Tensor, shape: torch.Size, targets: Tensor | None) -> Tensor:
    """(K,) values per response position into the rows' (m, R) layout `shape`: in order when `targets` is None
    (K = m * R), else at the flat positions `targets` (K,), 0 elsewhere. A scatter by index: no host sync."""
    if targets is None:
        return values.reshape(shape)  # (m, R)
    flat = values.new_zeros(shape.numel()).index_copy(0, targets, values)  # (m * R,)
    return flat.reshape(shape)  # (m, R)


def global_sum(value: float | Tensor) -> float:
    """Sum of a host number over all ranks (on a GPU rank, over the process group's gloo side)."""
    total = torch.tensor(float(value), dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(total)
    return float(total)
