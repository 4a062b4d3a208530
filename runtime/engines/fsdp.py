"""FSDP2 training engine: one rank's share of a model, its forward passes and its updates.

Parameters are sharded with `fully_shard` per decoder layer and at the root (torchtitan's
layout). Every rank runs the same number of forward/backward calls (collectives), which the
controller guarantees by giving each rank an equal number of rows.

Loss values are each rank's *contribution* to the loss of the whole mini-batch (global token
and sequence counts in the denominators), and gradients are summed across ranks instead of
averaged, so a 2-rank update equals a single-process update on the unsharded batch.

With CPU offload (models.<role>.offload) the shards, their gradients and the optimiser state live in host
memory (FSDP2's CPUOffloadPolicy). With training.paddingFree each micro-batch runs packed, without its padding
(engines/packing.py); models.<role>.maxTokensPerMicroBatch cuts micro-batches by tokens (engines/micro_batches.py).

A LoRA actor (`models.lora`) is a PEFT model: FSDP2 shards it the same way (the decoder layers are
the wrapped model's), only the adapters require gradients, and only they get optimiser state.
"""

import contextlib
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
from kuberl.runtime.algorithms.losses import entropy_from_logits, logprobs_from_logits
from kuberl.runtime.engines.micro_batches import MicroBatching, micro_batches
from kuberl.runtime.engines.packing import pack_rows
from kuberl.runtime.models.lora import adapters_off


def apply_fsdp(
    model: torch.nn.Module,
    world_size: int,
    device_type: str,
    compute_dtype: torch.dtype = torch.float32,
    offload: bool = False,
) -> torch.nn.Module:
    """Shard each decoder layer, then the root, over all ranks.

    On GPU a bfloat16 `compute_dtype` is FSDP2's mixed precision (gathered in bf16, gradients reduced
    in fp32). On CPU FSDP2 never casts (the trainer's forward runs under `torch.autocast` instead), and
    a single CPU rank keeps the plain module: there is nothing to shard, and FSDP2's per-layer unshard
    and gradient copies cost ~10% of a step here (bench/vs_trl.py). Checkpoints are the same either way
    (DCP state dicts are keyed by name; see test_checkpoint_state).

    `offload`: FSDP2's CPUOffloadPolicy on every unit (the shards, gradients and optimiser state in host memory);
    pinned memory on GPU for faster copies, unpinned on CPU (pinning needs CUDA). A single CPU rank holds
    everything in host memory already.
    """
    if world_size == 1 and device_type == "cpu":
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


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    if hasattr(model, "get_base_model"):  # a PEFT (LoRA) model: the layers are the wrapped model's
        model = model.get_base_model()  # type: ignore[operator]
    backbone = getattr(model, "model", None) or getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found at .model.layers")
    return list(layers)


def build_optimizer(
    model: torch.nn.Module, spec: OptimizerSpec, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(
        [param for param in model.parameters() if param.requires_grad],  # with LoRA: the adapters only
        lr=spec.lr,
        betas=(spec.betas[0], spec.betas[1]),
        weight_decay=spec.weight_decay,
        foreach=False,
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


@dataclass(frozen=True)
class ForwardInput:
    input_ids: Tensor  # (n, P+R)
    attention_mask: Tensor  # (n, P+R)
    response_ids: Tensor  # (n, R)
    prompt_width: int  # P


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as in generation."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (n, P+R)


class FSDPTrainer:
    """A causal LM (actor/reference) or a token-value model (critic) on one rank."""

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
        padding_free: bool = False,
    ) -> None:
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()  # type: ignore[operator]  # a transformers PreTrainedModel
        self.device = device
        # offloaded, the model stays in host memory: fully_shard moves one unit at a time to the device, shards it
        # and copies its shard back, so the whole model is never on the device at once
        self.model = apply_fsdp(model if offload else model.to(device), world_size, device.type, compute_dtype, offload)
        self.padding_free = padding_free  # training.paddingFree: packed forwards (engines/packing.py)
        # CPU mixed precision: forward passes under autocast (its backward follows the forward's dtypes)
        self.cpu_autocast_dtype = compute_dtype if device.type == "cpu" and compute_dtype != torch.float32 else None
        self.optim_spec = optim
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if optim is not None:
            self.optimizer, self.scheduler = build_optimizer(self.model, optim, total_steps)
        self.is_critic = not hasattr(model, "lm_head")

    # -- forward passes -------------------------------------------------------------------------
    def _autocast(self, full_precision: bool = False) -> contextlib.AbstractContextManager[Any]:
        if self.cpu_autocast_dtype is None or full_precision:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.cpu_autocast_dtype)

    def _predictions(self, batch: ForwardInput, rows: slice, full_precision: bool = False) -> tuple[Tensor, Tensor]:
        """The model's outputs at the positions that predict response tokens, (K, V) logits or the critic's (K, 1)
        values, and where they belong in the rows' response layout: `present` (m, R), K of it true.

        Padded, every position is computed and returned (K = m * R). Packed (training.paddingFree), only positions
        holding a real token are, and the rest of the work (log-softmax, entropy) skips the padding too.
        """
        ids = batch.input_ids[rows].to(self.device)  # (m, P+R)
        mask = batch.attention_mask[rows].to(self.device)  # (m, P+R)
        predicting = slice(batch.prompt_width - 1, -1)  # position t predicts (and values) response token t
        with self._autocast(full_precision):
            if not self.padding_free:
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False)
                outputs = out.logits[:, predicting]  # (m, R, V)
                present = torch.ones(outputs.shape[:2], dtype=torch.bool, device=self.device)  # (m, R)
                return outputs.reshape(-1, outputs.shape[-1]), present  # (m * R, V)
            packed = pack_rows(ids, mask)  # (1, T)
            # no attention mask: position ids that restart make transformers attend within each row only
            out = self.model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
            index = packed.index[:, predicting]  # (m, R) where each predicting position sits in the packed row
            present = index >= 0  # (m, R)
            return out.logits[0, index[present]], present  # (K, V)

    def _forward_values(self, batch: ForwardInput, rows: slice) -> Tensor:
        # V(s_t) for response token t is read at the position that generated it, like the log-probs
        values, present = self._predictions(batch, rows)  # (K, 1)
        return into_rows(values[:, 0].float(), present)  # (m, R)

    def response_logprobs(
        self,
        batch: ForwardInput,
        rows: slice,
        temperature: float,
        with_entropy: bool = False,
        full_precision: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        outputs, present = self._predictions(batch, rows, full_precision)
        logits = outputs.float()  # (K, V)
        if temperature > 0:
            logits = logits / temperature
        labels = batch.response_ids[rows].to(self.device)[present]  # (K,)
        entropy = into_rows(entropy_from_logits(logits), present) if with_entropy else None  # (m, R)
        return into_rows(logprobs_from_logits(logits, labels), present), entropy  # (m, R)

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
        """Log-probs of the response tokens; `full_precision` skips CPU autocast (the weights' own dtype).

        Micro-batches of `micro_batch_size` rows, or of up to `max_tokens` tokens when set (maxTokensPerMicroBatch).

        `base_only`: with the LoRA adapters switched off, i.e. the base model (the KL reference of a LoRA run).
        """
        self.model.eval()
        with adapters_off(self.model) if base_only else contextlib.nullcontext():
            parts = [
                self.response_logprobs(batch, rows, temperature, full_precision=full_precision)[0].cpu()
                for rows in self.micro_batches(batch, MicroBatching(micro_batch_size, max_tokens))
            ]
        return torch.cat(parts)  # (n, R)

    @torch.no_grad()
    def values(self, batch: ForwardInput, micro_batch_size: int, max_tokens: int | None = None) -> Tensor:
        self.model.eval()
        parts = [
            self._forward_values(batch, rows).cpu()
            for rows in self.micro_batches(batch, MicroBatching(micro_batch_size, max_tokens))
        ]
        return torch.cat(parts)  # (n, R)

    def micro_batches(self, batch: ForwardInput, batching: MicroBatching, span: slice = slice(None)) -> Sequence[slice]:
        """The micro-batches (slices of the batch's rows) of the rows in `span`; as many on every rank."""
        start = span.start or 0
        return [
            slice(start + cut.start, start + cut.stop) for cut in micro_batches(batch.attention_mask[span], batching)
        ]

    # -- updates ----------------------------------------------------------------------------------
    def optimizer_step(self, loss_finite: bool = True) -> dict[str, float]:
        """Clip and step; skipped (gradients dropped) when the gradient norm or any rank's loss is not finite.

        As in verl's actor: a NaN or infinite update never reaches the weights or the optimiser state, and
        the learning-rate schedule still advances. `skipped` (1.0 or 0.0) is the same on every rank, which
        must take the same decision: the norm is global, the loss is not, so the verdict is all-reduced.
        """
        assert self.optimizer is not None and self.scheduler is not None and self.optim_spec is not None
        clip = self.optim_spec.grad_clip
        parameters = list(self.model.parameters())
        norm = torch.nn.utils.get_total_norm([param.grad for param in parameters if param.grad is not None])
        # clip_grad_norm_ in two halves: an offloaded model's gradients are in host memory, and the norm's reduction
        # over ranks must run on the device its collectives use (verl's fsdp2_clip_grad_norm_ does the same)
        norm = norm.to(self.device)
        torch.nn.utils.clip_grads_with_norm_(parameters, clip if clip is not None else float("inf"), norm)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        finite = global_sum(0.0 if loss_finite and math.isfinite(float(norm)) else 1.0) == 0.0
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a skip before the first optimiser step is not the mistake torch warns of
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        return {"grad_norm": float(norm), "lr": float(lr), "skipped": 0.0 if finite else 1.0}

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


def into_rows(values: Tensor, present: Tensor) -> Tensor:
    """(K,) values per response position back into the (m, R) layout of `present`; 0 where absent."""
    return torch.zeros(present.shape, dtype=values.dtype, device=values.device).masked_scatter(present, values)


def global_sum(value: float | Tensor) -> float:
    """Sum of a number over all ranks."""
    total = torch.tensor(float(value), dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(total)
    return float(total)
