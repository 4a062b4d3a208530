"""The GPU suite's trainer rows: kuberl's update and its variants against baselines measured in the same run.

One process, one rank, and neither vLLM nor Ray: the GPU machines this project borrows have torch,
transformers and peft only. Each row times kuberl and its baseline on the same batch, alternating, best of
`repeats` after a warm-up (workloads.alternate):

- update: `update_policy` (on-policy GRPO loss, token mean, bf16 compute) against plain PyTorch (plain.py:
  fp32 weights under bf16 autocast, fused AdamW, the same loss). Aim <= 1.0x; MFU of both in the note. Beside it
  the same update with transformers' own masks instead of the trainer's (models/attention_masks.py): on this
  batch, which has no padding, transformers reads the mask on the host per pass and then runs SDPA's causal
  kernel; the trainer hands the model no mask, so SDPA runs the same kernel without the read. Aim <= 1.0x. And
  the same update with the LM head run over every position, the prompt's too (as before `logits_to_keep`). And
  the same update scoring the tokens at the head (training.fusedLogProbs: from the head's input, a slice of tokens
  at a time, never the whole logits), against the logits path: time and peak memory, no aim.
- LoRA update: kuberl's LoRA (r16, all-linear) against plain PEFT over a bf16 frozen base. Aim <= 1.1x; and
  its peak memory against kuberl's full update, aim <= 0.5x. kuberl's base is in bf16 too, as a LoRA actor's is
  beside a bf16 engine (fsdp.keeps_frozen_in_compute_dtype); the reference row's model likewise.
- padding-free: the padded update against the packed one (training.paddingFree) on a batch about half padding;
  ratio = padded / packed, aim >= 1.4x; the note gives the packed forward's attention (flash-attention's varlen
  kernels where flash_attn is installed, else FlexAttention: models/packed_attention.py) and how far the two
  forwards' log-probs are apart. On the smaller model, and again on the larger (`LARGER_MODEL`), whose passes
  keep the GPU busier.
- offload: the update with models.actor.offload against the same on the device: time aim <= 2.0x, and peak
  memory aim <= 0.7x; and with offload.perLayer (layer by layer at every pass), with perLayer and
  gradientsOnDevice (layer by layer, the gradients kept on the device for the step), and offloaded with
  training.fusedLogProbs (the logits never whole), reported beside them.
- critic update: `update_critic` on a value head, against the actor's update on the same batch.
- KL in the loss: the update with k3 KL in the loss against the same without. Aim <= 1.1x.
- reference log-probs: `FSDPTrainer.logprobs` against a plain no-grad forward. Aim <= 1.1x.
- update, compiled: the update with training.compile (each decoder layer's forward compiled by inductor) against
  the same trainer eager, aim <= 1.0x; the first update's time (the compiling) and its MFU in the note. And the
  padding-free row's main pair with both sides compiled (aim >= 1.4x, as eager): eager, a 0.5B pass waits on the
  host's kernel launches, and fused layers launch fewer. Last of the trainer rows: a run cut short by its time
  limit loses only them.
- token scores: log-probs (and entropies) of one pass's response tokens from bf16 logits, forward and backward, in
  float32 a slice at a time (algorithms/token_scores.py, what the trainer runs) against float32 over the whole
  logits (what it ran before); time and peak memory, no aim.
- checkpoint: a DCP save and load of the trainer (weights and AdamW state) against torch.save and torch.load of
  the same state dicts; FAILED if a loaded weight differs from the saved one.
- hf engine: the weight sync from `full_tensors` into the HF engine against a device-to-device copy (<= 1.5x),
  the tokens per second of its `generate`, and the device memory its sleep frees.
"""

import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from plain import PlainUpdate, peft_model, plain_logprobs
from qwen import shape
from table import FAILED, OK, Row, judge, skipped
from workloads import GIB, SMOKE_MODEL, Workload, alternate, gib, host_batch, synchronize

LORA_RANK, LORA_ALPHA = 16, 32


@dataclass(frozen=True)
class Case:
    """What a trainer row measures on: a model, its device, the batch's shape, the repeats, and what rows share."""

    model_dir: Path
    size: str  # 0.5B, 1.5B, or smoke
    device: torch.device
    work: Workload
    repeats: int
    env: Any  # suite.Environment

    def batch(self, seed: int = 0) -> Any:
        return host_batch(self.work, self.env.vocab, seed)

    def trainer(self, **options: Any) -> Any:
        return kuberl_trainer(self.model_dir, self.device, **options)

    def alternate(self, *works: Any) -> list[Any]:
        return alternate(self.device, self.repeats, *works)


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """A one-rank process group as the model worker makes it (`process_group_backend`: gloo beside NCCL)."""
    import torch.distributed as dist

    from kuberl.runtime.engines.fsdp import process_group_backend

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(process_group_backend(device.type), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def kuberl_trainer(model_dir: Path, device: torch.device, *, critic: bool = False, **options: Any) -> Any:
    """An FSDPTrainer as the model worker builds the actor (fp32 weights, bf16 compute on a GPU, AdamW)."""
    from kuberl.api.spec import LoRASpec, OptimizerSpec
    from kuberl.runtime.engines.fsdp import FSDPTrainer, keeps_frozen_in_compute_dtype
    from kuberl.runtime.models.loading import load_trainer_model

    torch.manual_seed(0)
    padding_free = options.get("padding_free", False)
    model = load_trainer_model(
        model_dir, torch.float32, critic=critic, padding_free=padding_free, device_type=device.type
    )
    lora = options.pop("lora", False)
    if lora:
        from kuberl.runtime.models.lora import apply_lora

        model = apply_lora(model, LoRASpec.model_validate({"rank": LORA_RANK, "alpha": LORA_ALPHA}))
    optim = OptimizerSpec.model_validate({"lr": 1e-6, "gradClip": 1.0}) if options.pop("optimizer", True) else None
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    # the reference, and a LoRA actor's base beside a bf16 engine (verl's rollout dtype), stored in bf16 on a GPU
    frozen = keeps_frozen_in_compute_dtype(optim is not None, lora, compute, rollout_dtype=compute)
    return FSDPTrainer(
        model, world_size=1, device=device, optim=optim, total_steps=1000, compute_dtype=compute,
        frozen_in_compute_dtype=frozen, **options,
    )  # fmt: skip


def update_config(work: Workload, **changes: Any) -> Any:
    """The GRPO update of the demo's recipe on one rank: one epoch, one mini-batch, on-policy, token mean."""
    from kuberl.runtime.engines.updates import UpdateConfig

    settings: dict[str, Any] = {
        "ppo_epochs": 1,
        "mini_batches": 1,
        "micro_batch_size": work.micro,
        "world_size": 1,
        "temperature": 1.0,
        "aggregation": "token_mean",
        "max_response_length": work.response,
        "policy_loss": "ppo_clip",
        "on_policy": True,
    }
    return UpdateConfig(**{**settings, **changes})


def updating(trainer: Any, batch: Any, config: Any) -> Any:
    """A work for `alternate`: one kuberl update of `trainer` on `batch`."""
    from kuberl.runtime.engines.updates import update_policy

    def work() -> None:
        update_policy(trainer, batch, config)

    return work


def mfu(flops: float, seconds: float, peak: float | None) -> str:
    return "" if peak is None else f"{100.0 * flops / seconds / peak:.1f}% MFU"


def update_rows(case: Case) -> list[Row]:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.updates import update_policy
    from kuberl.runtime.models.scoring_head import output_head

    trainer, batch, work = case.trainer(), case.batch(), case.work
    plain = PlainUpdate(
        AutoModelForCausalLM.from_pretrained(case.model_dir, dtype=torch.float32), case.device, work.micro
    )
    config = update_config(work)
    own_mask, keeps_logits = trainer.builds_own_mask, trainer.keeps_logits

    def without(*flags: str) -> Callable[[], None]:
        """A work: the update with the trainer's `flags` off for it."""

        def work() -> None:
            kept = {flag: getattr(trainer, flag) for flag in flags}
            for flag in flags:
                setattr(trainer, flag, False)
            try:
                update_policy(trainer, batch, config)
            finally:
                for flag, value in kept.items():
                    setattr(trainer, flag, value)

        return work

    # transformers' masks: a read of the mask on the host per pass, then SDPA's causal kernel on this batch without
    # padding; the trainer's own (`updating`): no mask here, the same kernel, no read
    with_transformers_masks = without("builds_own_mask", "causal_when_unpadded")
    head_everywhere = without("keeps_logits")  # the LM head over the prompt's positions too

    def scored_at_head() -> None:  # training.fusedLogProbs
        trainer.scoring_head = output_head(trainer.model)
        try:
            update_policy(trainer, batch, config)
        finally:
            trainer.scoring_head = None

    kuberl, theirs, everywhere, fused, baseline = case.alternate(
        updating(trainer, batch, config), with_transformers_masks, head_everywhere, scored_at_head, lambda: plain(batch)
    )
    case.env.full_update[case.size] = kuberl
    shape_note = f"{work.sequences} x {work.prompt + work.response} tokens, micro-batch {work.micro}"
    memory = gib(kuberl.peak_bytes)
    rows = [
        judge(Row("update", case.size, kuberl.seconds, "s", baseline.seconds, "plain s", "<= 1.0x", note=shape_note)),
        judge(
            Row(
                "update, own mask", case.size, kuberl.seconds, "s", theirs.seconds, "transformers' mask s", "<= 1.0x",
                note=f"no padding in this batch; builds its own mask: {own_mask}",
            )
        ),
        Row(
            "update, head at responses", case.size, kuberl.seconds, "s", everywhere.seconds, "head everywhere s",
            note=f"logits_to_keep: {keeps_logits}; peak {memory}, everywhere {gib(everywhere.peak_bytes)}",
        ),
        Row(
            "update, fused log-probs", case.size, fused.seconds, "s", kuberl.seconds, "logits path s",
            note=f"training.fusedLogProbs; peak {gib(fused.peak_bytes)}, logits path {memory}",
        ),
    ]  # fmt: skip
    flops, peak = case.env.update_flops(case.size, work), case.env.peak
    if peak is None:
        rows.append(skipped("update MFU", case.size, f"no bf16 peak known for this device; peak {memory}", ">= 30%"))
    else:
        value, plain_mfu = 100.0 * flops / kuberl.seconds / peak, 100.0 * flops / baseline.seconds / peak
        # PaLM's count has the LM head at every position; kuberl's trainer skips the prompt's (logits_to_keep)
        dims = shape(case.size)
        skipped_share = 6.0 * dims.vocab * dims.hidden * work.sequences * (work.prompt - 1) / flops
        note = f"plain PyTorch {plain_mfu:.1f}%; peak {memory}, plain {gib(baseline.peak_bytes)}; "
        note += f"the count's head over the prompt, which kuberl skips: {100 * skipped_share:.1f}% of it"
        rows.append(judge(Row("update MFU", case.size, value, "%", aim=">= 30%", note=note)))
    return rows


def compiled_trainer(case: Case, **options: Any) -> Any:
    """A trainer with training.compile (each decoder layer's forward compiled, models/layers.py). Under --smoke, on
    the CPU, the layers' graphs are compiled by AOT autograd and run as they are, not by inductor's C++ for the CPU
    (half a minute of builds on a cold cache; test_compiled_layers.py holds it; a GPU builds Triton)."""
    if case.size != SMOKE_MODEL:
        return case.trainer(compile_layers=True, **options)
    from kuberl.runtime.models.layers import compile_decoder_layers

    trainer = case.trainer(**options)
    compile_decoder_layers(trainer.model, backend="aot_eager")
    return trainer


def first_update_seconds(case: Case, trainer: Any, batch: Any, config: Any) -> float:
    """The time of one update: a compiled trainer's first, which compiles at the batch's shapes."""
    synchronize(case.device)
    started = time.perf_counter()
    updating(trainer, batch, config)()
    synchronize(case.device)
    return time.perf_counter() - started


def compiled_rows(case: Case) -> list[Row]:
    """training.compile: the update with each decoder layer's forward compiled (models/layers.py) against the same
    trainer eager; the first update's time (the compiling) and both peaks in the note, and the compiled update's
    MFU (aim 40% in #38, beyond plain PyTorch's eager 30%)."""
    batch, config, work = case.batch(), update_config(case.work), case.work
    eager, compiled = case.trainer(), compiled_trainer(case)
    first = first_update_seconds(case, compiled, batch, config)  # once with gradients, at this batch's one shape
    fast, slow = case.alternate(updating(compiled, batch, config), updating(eager, batch, config))
    note = f"first update {first:.0f} s (compiling); peak {gib(fast.peak_bytes)}, eager {gib(slow.peak_bytes)}"
    if case.env.peak is not None:
        note += f"; MFU {100.0 * case.env.update_flops(case.size, work) / fast.seconds / case.env.peak:.1f}%"
    return [judge(Row("update, compiled", case.size, fast.seconds, "s", slow.seconds, "eager s", "<= 1.0x", note=note))]


def compiled_packing_rows(case: Case) -> list[Row]:
    """The padding-free row's main pair with training.compile on both sides. Eager, a 0.5B pass of 4 x 1024 tokens
    waits on the host's ~3,400 kernel launches (#38's H200 profile), so packing's fewer tokens save GPU time nobody
    waits for; with each layer's kernels fused the passes are fewer launches, and packing may pay at the same pass
    size. The first update of each compiles (the packed one at more than one shape); both in the note."""
    batch, work = case.batch(), case.work
    padded, packed = compiled_trainer(case), compiled_trainer(case, padding_free=True)
    budget, rows_config, tokens_config = main_packing_configs(work)
    firsts = [
        first_update_seconds(case, padded, batch, rows_config),
        first_update_seconds(case, packed, batch, tokens_config),
    ]
    slow, fast = case.alternate(updating(padded, batch, rows_config), updating(packed, batch, tokens_config))
    note = (
        f"both compiled; first updates {firsts[0]:.0f} s padded, {firsts[1]:.0f} s packed (compiling); "
        f"packed passes of <= {budget} tokens through {packed.model.config._attn_implementation}, padded of "
        f"{work.micro} rows"
    )
    row = Row(
        "padding-free update, compiled", case.size, slow.seconds, "s padded", fast.seconds, "packed s", ">= 1.4x",
        note=note,
    )  # fmt: skip
    return [judge(row)]


def lora_rows(case: Case) -> list[Row]:
    trainer, batch, work = case.trainer(lora=True), case.batch(), case.work
    plain = PlainUpdate(peft_model(case.model_dir, case.device, LORA_RANK, LORA_ALPHA), case.device, work.micro)
    kuberl, baseline = case.alternate(updating(trainer, batch, update_config(work)), lambda: plain(batch))
    note = f"r{LORA_RANK} all-linear; peak {gib(kuberl.peak_bytes)}, PEFT over a bf16 base {gib(baseline.peak_bytes)}"
    rows = [judge(Row("LoRA update", case.size, kuberl.seconds, "s", baseline.seconds, "PEFT s", "<= 1.1x", note=note))]
    full = case.env.full_update.get(case.size)
    if full is not None and full.peak_bytes and kuberl.peak_bytes:
        peak, full_peak = kuberl.peak_bytes / GIB, full.peak_bytes / GIB
        rows.append(judge(Row("LoRA peak memory", case.size, peak, "GiB", full_peak, "full update GiB", "<= 0.5x")))
    return rows


def main_packing_configs(work: Workload) -> tuple[int, Any, Any]:
    """The padding-free rows' main pair: a padded pass's positions (the budget), the padded update's config (rows per
    pass) and the packed one's (passes of at most the budget in tokens, the same activation memory per pass)."""
    budget = work.micro * work.length
    return budget, update_config(work), update_config(work, max_tokens_per_micro_batch=budget)


def packing_rows(case: Case, one_pass: bool = True) -> list[Row]:
    """The padded update against the packed one, three ways: the packed passes holding as many tokens as a padded
    pass has positions (models.actor.maxTokensPerMicroBatch, the main row: the same activation memory per pass,
    as verl packs with use_dynamic_bsz), as many rows, and (`one_pass`) the whole batch in one pass on both sides.
    On a 0.5B model a pass of 4 x 1024 keeps the GPU waiting for its ~3,400 kernel launches (#38's H200 profile),
    and packing's fewer tokens pay only where the passes hold enough of them."""
    from kuberl.runtime.engines.inputs import forward_input

    padded, packed, batch = case.trainer(), case.trainer(padding_free=True), case.batch()
    work = case.work
    fwd, mask = forward_input(batch), batch.response_mask.bool()
    apart = float((padded.logprobs(fwd, 1.0, work.micro) - packed.logprobs(fwd, 1.0, work.micro))[mask].abs().max())
    attention = packed.model.config._attn_implementation
    real = 100 * float(batch.attention_mask.float().mean())
    budget, rows_config, tokens_config = main_packing_configs(work)
    whole = update_config(work, micro_batch_size=work.sequences)
    whole_tokens = update_config(work, max_tokens_per_micro_batch=work.sequences * work.length)
    works = [
        updating(padded, batch, rows_config),
        updating(packed, batch, tokens_config),
        updating(packed, batch, rows_config),
    ]
    if one_pass:
        works += [updating(padded, batch, whole), updating(packed, batch, whole_tokens)]
    slow, same_tokens, same_rows, *whole_batch = case.alternate(*works)
    note = f"{real:.0f}% real tokens; packed through {attention}; log-probs at most {apart:.2g} apart"
    main = Row(
        "padding-free update", case.size, slow.seconds, "s padded", same_tokens.seconds, "packed s", ">= 1.4x",
        note=f"packed passes of <= {budget} tokens, padded of {work.micro} rows; {note}",
    )  # fmt: skip
    rows = [
        judge(main),
        Row(
            "padding-free, same rows", case.size, slow.seconds, "s padded", same_rows.seconds, "packed s",
            note=f"{work.micro} rows per pass on both sides",
        ),
    ]  # fmt: skip
    if whole_batch:
        slow_whole, fast_whole = whole_batch
        rows.append(Row(
            "padding-free, one pass", case.size, slow_whole.seconds, "s padded", fast_whole.seconds, "packed s",
            note=f"all {work.sequences} rows in one pass on both sides",
        ))  # fmt: skip
    return rows


def larger_packing_rows(case: Case) -> list[Row]:
    """The packing rows on the larger model, without the one-pass pair: two 1.5B trainers (16 bytes a parameter
    each) and a pass of all 16 rows' activations would not fit one H200."""
    return packing_rows(case, one_pass=False)


def offload_rows(case: Case) -> list[Row]:
    batch, config = case.batch(), update_config(case.work)
    on_device, offloaded = case.trainer(), case.trainer(offload=True)
    per_layer = case.trainer(offload=True, offload_per_layer=True)
    kept = case.trainer(offload=True, offload_per_layer=True, offload_gradients_on_device=True)  # the grads only
    fused = case.trainer(offload=True, fused_log_probs=True)  # and the logits never whole (training.fusedLogProbs)
    trainers = (offloaded, per_layer, kept, fused, on_device)
    step, layer, gradients, scored, fast = case.alternate(*(updating(t, batch, config) for t in trainers))
    rows = [
        judge(Row("offload update", case.size, step.seconds, "s", fast.seconds, "on-device s", "<= 2.0x")),
        Row("offload update, perLayer", case.size, layer.seconds, "s", fast.seconds, "on-device s"),
        Row("offload update, gradientsOnDevice", case.size, gradients.seconds, "s", fast.seconds, "on-device s"),
        Row("offload update, fused log-probs", case.size, scored.seconds, "s", fast.seconds, "on-device s"),
    ]
    if all(timing.peak_bytes for timing in (step, layer, gradients, scored, fast)):
        device_peak, baseline = fast.peak_bytes / GIB, "on-device GiB"
        peak = step.peak_bytes / GIB
        rows.append(judge(Row("offload peak memory", case.size, peak, "GiB", device_peak, baseline, "<= 0.7x")))
        for item, timing in (
            ("offload peak memory, perLayer", layer),
            ("offload peak memory, gradientsOnDevice", gradients),
            ("offload peak memory, fused log-probs", scored),
        ):
            rows.append(Row(item, case.size, timing.peak_bytes / GIB, "GiB", device_peak, baseline))
    return rows


def critic_rows(case: Case) -> list[Row]:
    from kuberl.runtime.engines.updates import update_critic

    critic, actor, batch = case.trainer(critic=True), case.trainer(), case.batch()
    config = update_config(case.work, value_clip=0.2)
    value, baseline = case.alternate(lambda: update_critic(critic, batch, config), updating(actor, batch, config))
    note = f"value head; peak {gib(value.peak_bytes)}"
    return [Row("critic update", case.size, value.seconds, "s", baseline.seconds, "actor update s", note=note)]


def kl_rows(case: Case) -> list[Row]:
    with_kl, without, batch = case.trainer(), case.trainer(), case.batch()
    kl_config = update_config(case.work, kl_in_loss_coef=0.001, kl_estimator="k3")
    kl, baseline = case.alternate(
        updating(with_kl, batch, kl_config), updating(without, batch, update_config(case.work))
    )
    return [judge(Row("KL in the loss (k3)", case.size, kl.seconds, "s", baseline.seconds, "without KL s", "<= 1.1x"))]


def reference_rows(case: Case) -> list[Row]:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.inputs import forward_input

    reference, batch, micro = case.trainer(optimizer=False), case.batch(), case.work.micro
    model = AutoModelForCausalLM.from_pretrained(case.model_dir, dtype=torch.float32).to(case.device)
    fwd = forward_input(batch)
    kuberl, baseline = case.alternate(
        lambda: reference.logprobs(fwd, 1.0, micro), lambda: plain_logprobs(model, batch, case.device, micro).cpu()
    )
    row = Row("reference log-probs", case.size, kuberl.seconds, "s", baseline.seconds, "plain s", "<= 1.1x")
    return [judge(row)]


def token_score_rows(case: Case) -> list[Row]:
    """Log-probs (and entropies) of one pass's response tokens (micro-batch x R of them) from bf16 logits, forward and
    backward: `token_scores` (float32 a slice at a time) against the same in float32 over the whole logits."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # bench/: its token_scores.py
    from token_scores import scored

    generator = torch.Generator(case.device).manual_seed(0)
    tokens, vocab = case.work.micro * case.work.response, case.env.vocab
    logits = torch.randn(tokens, vocab, device=case.device, dtype=torch.bfloat16, generator=generator)
    logits.requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=case.device, generator=generator)

    rows = []
    for entropy, item in ((False, "token scores"), (True, "token scores, entropy too")):
        ours, theirs = case.alternate(
            lambda e=entropy: scored(logits, labels, True, e), lambda e=entropy: scored(logits, labels, False, e)
        )
        note = f"{tokens} x {vocab} bf16 logits ({gib(logits.numel() * 2)})"
        if ours.peak_bytes is not None and theirs.peak_bytes is not None:
            note += f"; peak {gib(ours.peak_bytes)}, whole {gib(theirs.peak_bytes)}"
        rows.append(Row(item, case.size, ours.seconds, "s", theirs.seconds, "whole s", note=note))
    return rows


def checkpoint_rows(case: Case) -> list[Row]:
    from kuberl.runtime.checkpoint.state import load_trainer_state, save_trainer_state
    from kuberl.runtime.engines.updates import update_policy

    trainer, restored = case.trainer(), case.trainer()
    update_policy(trainer, case.batch(), update_config(case.work))  # AdamW state to save
    assert trainer.optimizer is not None
    with tempfile.TemporaryDirectory(prefix="kuberl-gpu-checkpoint-") as scratch:
        location, path = str(Path(scratch) / "dcp"), Path(scratch) / "plain.pt"
        started = time.perf_counter()
        save_trainer_state(trainer, location, "actor", 0)
        load_trainer_state(restored, location, "actor", 0)
        dcp_seconds = time.perf_counter() - started
        saved = dict(trainer.full_tensors())
        differs = [name for name, tensor in restored.full_tensors() if not torch.equal(tensor, saved[name])]
        started = time.perf_counter()
        torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}, path)
        torch.load(path, map_location=case.device, weights_only=True)
        plain_seconds = time.perf_counter() - started
    note = f"{len(differs)} weights differ after the load" if differs else "every weight equal after the load"
    row = Row("checkpoint save + load", case.size, dcp_seconds, "s", plain_seconds, "torch.save + load s", note=note)
    row.status = FAILED if differs else OK
    return [row]


def hf_engine_rows(case: Case) -> list[Row]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kuberl.runtime.engines.base import SamplingParams
    from kuberl.runtime.engines.hf import HFRolloutEngine

    device, work = case.device, case.work
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(case.model_dir, dtype=dtype).to(device)
    engine = HFRolloutEngine(model, AutoTokenizer.from_pretrained(case.model_dir), device)
    trainer = case.trainer(optimizer=False)
    tensors = [(name, tensor.to(dtype)) for name, tensor in trainer.full_tensors()]
    targets = [torch.empty_like(tensor) for _, tensor in tensors]

    def floor() -> None:
        for target, (_, tensor) in zip(targets, tensors, strict=True):
            target.copy_(tensor)

    sync, copy = case.alternate(lambda: engine.load_weights(trainer.full_tensors()), floor)
    size = gib(sum(tensor.numel() * tensor.element_size() for _, tensor in tensors))
    rows = [
        judge(Row("hf engine sync", case.size, sync.seconds, "s", copy.seconds, "d2d copy s", "<= 1.5x", note=size))
    ]
    tensors.clear()
    targets.clear()

    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (work.prompt,), generator=generator).tolist() for _ in range(work.sequences // 2)]
    params = SamplingParams(temperature=1.0, max_new_tokens=max(4, work.response // 4), n=2, seed=1)
    made: dict[str, int] = {}

    def generate() -> None:
        made["tokens"] = sum(len(g.token_ids) for gens in engine.generate(prompts, params) for g in gens)

    (timing,) = alternate(device, max(1, case.repeats // 2), generate)
    note = f"{len(prompts)} prompts x 2 samples, {made['tokens']} tokens"
    rows.append(Row("hf engine generate", case.size, made["tokens"] / timing.seconds, "tok/s", note=note))

    freed = engine.sleep(2)
    engine.wake_up()
    woke = bool(engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, seed=1))[0][0].token_ids)
    row = Row("hf engine sleep", case.size, freed / GIB, "GiB freed", note="the weights go to the host while asleep")
    row.status = OK if woke and (freed > 0 or device.type != "cuda") else FAILED
    rows.append(row)
    return rows


#: The workload of an item measured again on the larger model: the packing rows, whose 0.5B passes were bound by
#: the host's kernel launches on an H200 (bench/README.md), so packing's fewer tokens saved time nobody waited for.
LARGER_MODEL = "packing, larger model"

#: (item, the function that measures it, the workload it trains on, full size / smoke size)
TRAINER_ITEMS = (
    ("update", update_rows, "update"),
    ("LoRA update", lora_rows, "update"),
    ("padding-free update", packing_rows, "packing"),
    ("padding-free update", larger_packing_rows, LARGER_MODEL),
    ("offload update", offload_rows, "offload"),
    ("critic update", critic_rows, "packing"),
    ("KL in the loss (k3)", kl_rows, "packing"),
    ("reference log-probs", reference_rows, "update"),
    ("token scores", token_score_rows, "update"),
    ("checkpoint save + load", checkpoint_rows, "packing"),
    ("hf engine", hf_engine_rows, "packing"),
    # last: their first updates compile (a minute or so each); a run cut short by its time limit loses only them
    ("update, compiled", compiled_rows, "update"),
    ("padding-free update, compiled", compiled_packing_rows, "packing"),
)
