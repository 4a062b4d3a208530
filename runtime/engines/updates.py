"""The actor and critic updates of one rank: PPO epochs over mini-batches over micro-batches.

The controller hands each rank a shard laid out as `mini_batches` equal consecutive parts,
one per mini-batch (see `Controller._layout_for_update`). Denominators of the loss are the
counts of the whole mini-batch across all ranks, so the summed gradient is the gradient of
the unsharded mini-batch's loss (verl's "global batch info").

The policy loss is looked up by name (spec.algorithm.policyLoss) in the registry; nothing here
knows one loss from another. The tokens that train are `batch.loss_mask`: a sample whose reward
failed has none, and the rollout correction may have rejected some.

Devices: the batch stays on the host, and each pass's tensors reach the trainer's device together, in one
`MicroBatch` (engines/inputs.py). Nothing inside the passes reads a value back: losses and metrics are summed
on the device, a mini-batch's denominators are counted on the host before its passes, the optimiser step reads
one verdict (skip it or not), and an update reads its metrics once, at its end (`_Totals.reduce`).
"""

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from kuberl.runtime.algorithms.correction import CorrectionConfig, rollout_correction
from kuberl.runtime.algorithms.kl import kl_penalty
from kuberl.runtime.algorithms.losses import (
    PolicyLossConfig,
    PolicyLossInputs,
    aggregate_loss,
    policy_loss,
    value_loss,
)
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.fsdp import FSDPTrainer, global_sum
from kuberl.runtime.engines.inputs import MicroBatch, forward_input, micro_batches_on
from kuberl.runtime.engines.micro_batches import MicroBatching


@dataclass(frozen=True)
class UpdateConfig:
    ppo_epochs: int
    mini_batches: int
    micro_batch_size: int  # rows per forward/backward pass (models.<role>.microBatchSize)
    world_size: int
    temperature: float
    aggregation: str
    max_response_length: int
    policy_loss: str  # spec.algorithm.policyLoss: a POLICY_LOSSES name
    loss_config: PolicyLossConfig = PolicyLossConfig()
    #: Rollout correction computed per micro-batch against the current policy: bypass mode only
    #: (rollout.useEngineLogprobs), where the old log-probs are the engine's. In decoupled mode the
    #: controller corrects the whole batch before the update (batch.is_weights, batch.loss_mask).
    bypass_correction: CorrectionConfig | None = None
    seed: int = 0  # training.seed: with the optimizer step and micro-batch, seeds the losses' random draws
    kl_in_loss_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    value_clip: float | None = None
    #: One epoch over one mini-batch: the behaviour policy is the policy before this update, so its
    #: log-probs are the update's own forward pass, detached (the ratio is exactly 1), and no separate
    #: old-log-prob pass runs (verl's and TRL's on-policy shortcut). The batch comes without them.
    on_policy: bool = False
    #: With `on_policy`, the decoupled rollout correction (rollout.useEngineLogprobs false) computed per
    #: micro-batch: log pi_old is the update's own forward, detached, so w = pi_old / pi_engine needs no
    #: old-log-prob pass either. Without rejection only: a rejected token must leave the loss denominators,
    #: which are counted before the first forward (the controller corrects the whole batch then).
    on_policy_correction: CorrectionConfig | None = None
    #: models.<role>.maxTokensPerMicroBatch: micro-batches cut by tokens instead of `micro_batch_size` rows.
    max_tokens_per_micro_batch: int | None = None

    @property
    def micro_batching(self) -> MicroBatching:
        return MicroBatching(self.micro_batch_size, self.max_tokens_per_micro_batch)


class _Totals:
    """Metrics of one update, summed on the trainer's device and reduced over ranks at the end. Three kinds:

    - `mean`: a per-token mean on this rank, weighted by its tokens;
    - `share`: this rank's share of a mini-batch total (the shares of all ranks sum to it);
    - `same`: a number every rank holds identically (the gradient norm, the learning rate).
    Each is averaged over the mini-batches and epochs of the update. Values may be device tensors or numbers.
    """

    def __init__(self, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self.device = device
        self.sums: dict[str, Tensor | float] = {}
        self.weights: dict[str, Tensor | float] = {}

    def _add(self, name: str, total: Tensor | float, weight: Tensor | float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + total
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def mean(self, name: str, value: Tensor, tokens: Tensor) -> None:
        self._add(name, value.double() * tokens, tokens)

    def share(self, name: str, value: Tensor | float) -> None:
        self._add(name, value, 1.0 / self.world_size)

    def same(self, name: str, value: Tensor | float) -> None:
        self._add(name, value / self.world_size, 1.0 / self.world_size)

    def reduce(self, trainer: FSDPTrainer) -> dict[str, float]:
        """Each metric over all ranks: one all-reduce of one vector, and the update's one read of its metrics."""
        names = sorted(self.sums)
        totals = torch.stack([self._on_device(part[name]) for part in (self.sums, self.weights) for name in names])
        if dist.is_initialized():
            dist.all_reduce(totals)
        values = trainer.to_host(totals).tolist()
        return {name: values[i] / max(values[len(names) + i], 1e-12) for i, name in enumerate(names)}

    def _on_device(self, value: Tensor | float) -> Tensor:
        if isinstance(value, Tensor):
            return value.to(dtype=torch.float64)
        return torch.full((), value, dtype=torch.float64, device=self.device)  # a fill, not a copy from the host


def trained_mask(batch: RolloutBatch) -> Tensor:
    """(N, R) the tokens the actor trains on: batch.loss_mask, or every response token."""
    return batch.loss_mask if batch.loss_mask is not None else batch.response_mask


def critic_mask(batch: RolloutBatch) -> Tensor:
    """(N, R) the tokens the critic regresses: those of samples whose reward succeeded."""
    mask = batch.response_mask  # (N, R)
    return mask if batch.scored is None else mask * batch.scored.float()[:, None]


def _mini_batch_counts(mask: Tensor) -> tuple[float, float]:
    """Tokens and sequences with a token in one mini-batch (a host mask), summed over all ranks."""
    return global_sum(mask.sum()), global_sum(mask.bool().any(-1).sum())


def loss_seed(cfg: UpdateConfig, trainer: FSDPTrainer, micro_index: int) -> int:
    """A seed for the losses' random draws from the job's seed, the optimizer step, the rank and the
    micro-batch: a resumed run (the scheduler's step is checkpointed) draws the same."""
    step = trainer.scheduler.last_epoch if trainer.scheduler is not None else 0
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return (((cfg.seed * 1_000_003 + step) * 1_009 + rank) * 10_007 + micro_index) % (1 << 62)


def update_policy(trainer: FSDPTrainer, batch: RolloutBatch, cfg: UpdateConfig) -> dict[str, float]:
    """Policy-loss update of the actor on this rank's shard; returns metrics averaged over all ranks.

    With `cfg.on_policy` the behaviour log-probs are taken from the forward pass and left in
    `batch.old_logprobs` (this rank's rows, masked) for the caller.
    """
    assert batch.advantages is not None
    if cfg.on_policy:
        assert cfg.ppo_epochs == 1 and cfg.mini_batches == 1, "on_policy needs one epoch over one mini-batch"
    else:
        assert batch.old_logprobs is not None
    trainer.model.train()
    fwd, mask = forward_input(batch), trained_mask(batch)  # on the host: micro-batches are cut there
    totals = _Totals(cfg.world_size, trainer.device)
    behaviour: list[Tensor] = []  # on-policy: each pass's log pi_old (m, R), on the device
    mini_rows = len(batch) // cfg.mini_batches
    for _ in range(cfg.ppo_epochs):
        for mini in range(cfg.mini_batches):
            span = slice(mini * mini_rows, (mini + 1) * mini_rows)
            global_tokens, global_seqs = _mini_batch_counts(mask[span])
            counts: dict[str, Any] = {
                "global_tokens": global_tokens,
                "global_seqs": global_seqs,
                "max_response_length": cfg.max_response_length,
            }
            shares: dict[str, Tensor | float] = {"actor/loss": 0.0, "actor/kl_loss": 0.0, "actor/entropy": 0.0}
            passes = trainer.micro_batches(fwd, cfg.micro_batching, span)
            on_device = micro_batches_on(trainer.device, batch, passes, mask, pack=trainer.padding_free)
            for index, micro in enumerate(on_device):
                trainer.before_pass(last=index == len(passes) - 1)
                loss, old_logprobs = _policy_pass(trainer, micro, cfg, counts, shares, totals, index)
                loss.backward()
                shares["actor/loss"] = shares["actor/loss"] + loss.detach()
                if cfg.on_policy:
                    behaviour.append(old_logprobs)
            step = trainer.optimizer_step(shares["actor/loss"])
            for name, share_value in shares.items():
                totals.share(name, share_value)
            totals.same("actor/grad_norm", step["grad_norm"])
            totals.same("actor/lr", step["lr"])
            totals.same("actor/update_skipped", step["skipped"])  # runtime/health.py counts these
            totals.same("actor/micro_batches", len(passes))  # forward/backward passes per optimiser step
    if cfg.on_policy:  # one mini-batch, its passes in row order
        batch.old_logprobs = trainer.to_host(torch.cat(behaviour))  # (n, R)
    return totals.reduce(trainer)


def _policy_pass(
    trainer: FSDPTrainer,
    micro: MicroBatch,
    cfg: UpdateConfig,
    counts: dict[str, Any],
    shares: dict[str, Tensor | float],
    totals: _Totals,
    index: int,
) -> tuple[Tensor, Tensor]:
    """One forward pass of the policy update: its loss (to backward) and the log pi_old it used, (m, R)."""
    assert micro.advantages is not None
    logprobs, entropy = trainer.response_logprobs(
        micro.forward, cfg.temperature, with_entropy=cfg.entropy_coef > 0
    )  # (m, R)
    old_logprobs = logprobs.detach() * micro.response_mask if cfg.on_policy else micro.old_logprobs  # (m, R)
    assert old_logprobs is not None
    inputs = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=micro.advantages,
        mask=micro.mask,
        is_weights=micro.is_weights,
        seed=loss_seed(cfg, trainer, index),
    )
    if cfg.bypass_correction is not None:
        inputs = _bypass_rejection(inputs, cfg.bypass_correction, totals)
    if cfg.on_policy_correction is not None:
        assert micro.engine_logprobs is not None
        inputs = _on_policy_weights(inputs, micro.engine_logprobs, cfg.on_policy_correction, totals)
    loss, metrics = policy_loss(cfg.policy_loss, inputs, cfg.loss_config, cfg.aggregation, **counts)
    if cfg.kl_in_loss_coef > 0:
        assert micro.ref_logprobs is not None
        kl = kl_penalty(logprobs, micro.ref_logprobs, cfg.kl_estimator)  # (m, R)
        kl_loss = aggregate_loss(kl, micro.mask, cfg.aggregation, **counts)  # ()
        loss = loss + cfg.kl_in_loss_coef * kl_loss
        shares["actor/kl_loss"] = shares["actor/kl_loss"] + kl_loss.detach()
    if entropy is not None:
        entropy_term = aggregate_loss(entropy, micro.mask, cfg.aggregation, **counts)  # ()
        loss = loss - cfg.entropy_coef * entropy_term
        shares["actor/entropy"] = shares["actor/entropy"] + entropy_term.detach()
    tokens = micro.mask.sum()  # ()
    for name, metric in metrics.items():
        totals.mean(f"actor/{name}", metric, tokens)
    return loss, old_logprobs


def _bypass_rejection(inputs: PolicyLossInputs, config: CorrectionConfig, totals: _Totals) -> PolicyLossInputs:
    """Bypass mode: reject tokens by pi_theta / pi_engine; a rejected token's loss is 0 (verl's bypass mode).

    The weight compares the current policy with the engine (the old log-probs are the engine's). The
    token stays in the denominators, which were counted for the whole mini-batch before the update.
    """
    correction = rollout_correction(inputs.logprobs, inputs.old_logprobs, inputs.mask, config)
    tokens = inputs.mask.sum()  # ()
    for name, value in correction.metrics.items():
        totals.mean(f"correction/{name}", value, tokens)
    kept = correction.keep.float()  # (m, R)
    weights = kept if inputs.is_weights is None else inputs.is_weights * kept  # (m, R)
    return replace(inputs, is_weights=weights)


def _on_policy_weights(
    inputs: PolicyLossInputs, engine_logprobs: Tensor, config: CorrectionConfig, totals: _Totals
) -> PolicyLossInputs:
    """Decoupled correction on one micro-batch of an on-policy update: w = pi_old / pi_engine, truncated.

    pi_old is this forward pass, detached (the policy has not moved yet), so the weights equal those the
    controller would compute from a separate old-log-prob pass. Each metric is averaged with the weight
    its whole-batch form has: tokens, or responses for the `*_response_fraction` ones.
    """
    assert config.rejection is None, "rejection changes the loss denominators: the controller corrects then"
    correction = rollout_correction(inputs.old_logprobs, engine_logprobs, inputs.mask, config)
    tokens = inputs.mask.sum()  # ()
    responses = inputs.mask.bool().any(-1).sum()  # ()
    for name, value in correction.metrics.items():
        totals.mean(f"correction/{name}", value, responses if name.endswith("response_fraction") else tokens)
    return replace(inputs, is_weights=correction.weights)


def update_critic(trainer: FSDPTrainer, batch: RolloutBatch, cfg: UpdateConfig) -> dict[str, float]:
    """Clipped value regression toward the returns; same layout and denominators as the actor."""
    assert batch.values is not None and batch.returns is not None
    trainer.model.train()
    fwd, mask = forward_input(batch), critic_mask(batch)
    totals = _Totals(cfg.world_size, trainer.device)
    mini_rows = len(batch) // cfg.mini_batches
    for _ in range(cfg.ppo_epochs):
        for mini in range(cfg.mini_batches):
            span = slice(mini * mini_rows, (mini + 1) * mini_rows)
            global_tokens, global_seqs = _mini_batch_counts(mask[span])
            loss_share: Tensor | float = 0.0
            passes = trainer.micro_batches(fwd, cfg.micro_batching, span)
            on_device = micro_batches_on(trainer.device, batch, passes, mask, pack=trainer.padding_free)
            for index, micro in enumerate(on_device):
                trainer.before_pass(last=index == len(passes) - 1)
                assert micro.values is not None and micro.returns is not None
                loss, metrics = value_loss(
                    trainer.forward_values(micro.forward),
                    micro.values,
                    micro.returns,
                    micro.mask,
                    clip=cfg.value_clip,
                    aggregation=cfg.aggregation,
                    global_tokens=global_tokens,
                    global_seqs=global_seqs,
                    max_response_length=cfg.max_response_length,
                )
                loss.backward()
                loss_share = loss_share + loss.detach()
                tokens = micro.mask.sum()  # ()
                for name, value in metrics.items():
                    totals.mean(f"critic/{name}", value, tokens)
            step = trainer.optimizer_step(loss_share)
            totals.share("critic/loss", loss_share)
            totals.same("critic/grad_norm", step["grad_norm"])
            totals.same("critic/update_skipped", step["skipped"])
            totals.same("critic/micro_batches", len(passes))  # forward/backward passes per optimiser step
    return totals.reduce(trainer)


def token_rewards_from_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The sequence score placed on each response's last valid token (in an episode: the model's last token)."""
    positions = torch.arange(response_mask.shape[1]).expand_as(response_mask)  # (N, R)
    last = torch.where(response_mask.bool(), positions, 0).max(-1).values  # (N,)
    rewards = torch.zeros_like(response_mask, dtype=torch.float32)  # (N, R)
    rewards[torch.arange(len(scores)), last] = scores.float()  # (N, R)
    return rewards * response_mask  # (N, R)
