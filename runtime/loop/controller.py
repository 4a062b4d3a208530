"""The single controller: one short loop over the role worker groups.

    rollout -> reward [-> more rounds: dynamic sampling] -> sleep -> reference / old log-probs -> correction
    -> critic -> advantages -> update -> sync [-> validation]

A colocated engine sleeps while the trainer's passes run (its device memory goes to them: the hybrid engine)
and wakes in the sync, its weights before they are written and its KV cache after (`Engines.sleep`,
`ModelWorker.sync_weights`).

The loop never branches on an algorithm's name: the estimator, the loss and the KL estimator
are looked up in registries, and a stage runs when the configuration asks for what it makes
(a KL coefficient needs reference log-probs, a critic needs values, an estimator that reads
`baseline_scores` needs the greedy baseline, dynamic sampling needs more rounds).

A sample whose reward failed trains nothing and counts in no statistic: not in its group's, not in
reward/mean, not in the critic's targets (batch.scored, batch.loss_mask).

The rollout is a stage of its own (runtime/rollout/), chosen by configuration: one response per
sample, or multi-turn episodes when the job has an environment. The loop is the same for both; an
episode's environment tokens are outside `response_mask`, so nothing below trains on them.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kuberl.api import OverlongPrompt
from kuberl.runtime.algorithms.advantages import AdvantageInputs, estimator_reads
from kuberl.runtime.algorithms.correction import rollout_correction
from kuberl.runtime.algorithms.kl import kl_penalty
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from kuberl.runtime.algorithms.shaping import overlong_penalty
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.deadline import step_deadline
from kuberl.runtime.engines.updates import token_rewards_from_scores
from kuberl.runtime.loop.dynamic_sampling import DynamicSampler, filter_values
from kuberl.runtime.loop.plan import RunPlan
from kuberl.runtime.loop.step_metrics import reward_extra_metrics, reward_metrics, trained_batch_metrics
from kuberl.runtime.loop.validation import Scored, validation_metrics
from kuberl.runtime.pools.launch import Groups
from kuberl.runtime.report.telemetry import stage_throughput
from kuberl.runtime.rewards.functions import RewardResult
from kuberl.runtime.rewards.sample import data_source
from kuberl.runtime.rollout import rollout_stage
from kuberl.runtime.rollout.base import VALIDATION_STREAM, Engines

log = logging.getLogger(__name__)


class SyncMismatchError(RuntimeError):
    """The rollout engine's log-probs differ from the trainer's after a weight sync."""


def dropped_prompt_metrics(plan: RunPlan) -> dict[str, float]:
    """How many prompts data.overlongPrompt: drop left out of each split (constant over the run)."""
    metrics = {"data/dropped_overlong_prompts": float(plan.loader.dataset.dropped_overlong)}
    if plan.validation is not None:
        metrics["data/dropped_overlong_validation_prompts"] = float(plan.validation.dropped_overlong)
    return metrics


@dataclass
class StepResult:
    step: int
    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Generated:
    """A step's rollout, scored: what `Controller.train` takes (the asynchronous driver makes it ahead)."""

    step: int
    epoch: int
    generated: RolloutBatch  # every response of the step, over all dynamic-sampling rounds
    batch: RolloutBatch | None  # the rows that train; None when dynamic sampling found nothing worth it
    metrics: dict[str, float]  # of the rollout and the rewards
    timings: dict[str, float]  # time/<stage> of the stages that made it


class StageTimes:
    """Seconds per stage of one step, as `time/<stage>`; a stage may run once per dynamic-sampling round."""

    def __init__(self, seconds: dict[str, float] | None = None) -> None:
        self.seconds = seconds if seconds is not None else {}

    def __call__(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        out = fn(*args)
        key = f"time/{stage}"
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started
        return out


class Controller:
    def __init__(self, plan: RunPlan, groups: Groups) -> None:
        self.plan = plan
        self.groups = groups
        spec = plan.job.spec
        self.spec = spec
        self.settings = plan.settings
        self.group_size = self.settings.group_size
        self.estimator = ADVANTAGE_ESTIMATORS.get(str(spec.algorithm.advantage_estimator))
        self.needs_baseline = "baseline_scores" in estimator_reads(self.estimator)
        self.needs_sum_pi_squared = "sum_pi_squared" in estimator_reads(self.estimator)
        self.algo = spec.algorithm
        sampling = spec.algorithm.dynamic_sampling
        self.sampler = None
        if sampling is not None and sampling.enabled:
            rows_unit = plan.mini_batches * plan.actor_world_size
            self.sampler = DynamicSampler(
                sampling, plan.loader.dataset, spec.data.batch_size, self.group_size, rows_unit, spec.training.seed
            )
        self.data_metrics = dropped_prompt_metrics(plan) if spec.data.overlong_prompt == OverlongPrompt.DROP else {}
        self.pad_id = plan.tokenizer.pad_token_id if plan.tokenizer.pad_token_id is not None else 0
        self.weight_version = 0  # the training step whose weights the engines hold (0: the initial model)
        self.engines = Engines(groups.actor, groups.rollout, split=spec.rollout.tensor_parallel_size)
        self.rollout_stage = rollout_stage(plan, groups, self.engines)
        self.update_config = self.settings.update

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, start_step: int, on_step: Callable[[StepResult], None]) -> None:
        if start_step > 0 and self.groups.rollout is not None:
            self.sync(None, start_step)  # the pool starts from the initial model; resumed weights are newer
        for step in range(start_step, self.plan.total_steps):
            with step_deadline(step + 1, self.spec.training.step_timeout_seconds):
                result = self.step(step)
            self.validate_when_due(result)
            on_step(result)

    def step(self, step: int) -> StepResult:
        return self.train(self.generate(step))

    def generate(self, step: int) -> Generated:
        """The step's rollout, scored: every dynamic-sampling round, and the batch to train (if any)."""
        epoch, prompts = self.plan.loader.batch(step)
        timed = StageTimes()
        rewards: list[RewardResult] = []  # every round's

        def generate_and_score(round_prompts: list[Prompt], round_index: int) -> tuple[RolloutBatch, torch.Tensor]:
            batch = timed("rollout", self.rollout, round_prompts, step, round_index)
            results = timed("reward", self.score, batch, round_prompts, step, round_index)
            rewards.extend(results)
            metric = self.algo.dynamic_sampling.metric if self.algo.dynamic_sampling is not None else "score"
            return batch, filter_values(metric, batch, results)

        sampling_metrics: dict[str, float] = {}
        if self.sampler is None:
            generated = generate_and_score(prompts, 0)[0]
            batch: RolloutBatch | None = generated
        else:
            generated, batch, sampling_metrics = self.sampler.collect(prompts, step, generate_and_score)
        settings = self.settings
        metrics = {**reward_metrics(generated, settings.max_response_tokens, settings.overlong), **sampling_metrics}
        metrics.update(reward_extra_metrics(rewards))
        metrics.update(self.rollout_stage.take_metrics())
        return Generated(step, epoch, generated, batch, metrics, timed.seconds)

    def train(self, generated: Generated) -> StepResult:
        """Reference and old log-probs, correction, critic, advantages, the update and the weight sync."""
        step, batch, metrics = generated.step, generated.batch, dict(generated.metrics)
        timed = StageTimes(dict(generated.timings))
        if batch is not None:  # dynamic sampling may find nothing worth training on
            metrics.update(timed("sleep", self.engines.sleep))  # colocated: the engine's memory to the trainer
            timed("reference", self.reference_logprobs, batch)
            timed("old_logprobs", self.old_logprobs, batch)
            metrics.update(timed("correction", self.training_tokens, batch))
            timed("critic", self.critic_values, batch)
            timed("advantages", self.advantages, batch)
            metrics.update(timed("update", self.update, batch))
            metrics.update(timed("sync", self.sync, batch, step + 1))  # wakes the engine: weights, then KV cache
            metrics.update(trained_batch_metrics(batch, engine_is_behaviour=self.settings.use_engine_logprobs))
        metrics.update(timed.seconds)
        metrics.update(self.data_metrics)
        metrics.update(self.groups.reward.metrics())
        if self.groups.rollout is not None:
            metrics.update(self.groups.rollout.metrics())
        metrics["time/step"] = sum(timed.seconds.values())
        trained_tokens = float(batch.response_mask.sum()) if batch is not None else None
        metrics.update(stage_throughput(timed.seconds, float(generated.generated.response_mask.sum()), trained_tokens))
        return StepResult(step, generated.epoch, metrics)

    # -- stages -------------------------------------------------------------------------------------
    def rollout(self, prompts: list[Prompt], step: int, round_index: int = 0) -> RolloutBatch:
        """The responses to `prompts`, each row stamped with the weight version that generated it."""
        version = self.engines.version  # a separate replica refuses to generate with any other
        batch = self.rollout_stage.run(prompts, step, stream=round_index)
        if batch.weight_version is None:  # a stage that does not say which engine made each row (episodes)
            batch.weight_version = torch.full((len(batch),), version, dtype=torch.long)  # (N,)
        return batch

    def _score_texts(self, prompt_texts: list[str], texts: list[str], samples: list[dict[str, Any]]) -> list[Any]:
        return self.groups.reward.score(prompt_texts, texts, samples)

    def score_rows(self, batch: RolloutBatch, prompt_texts: list[str]) -> list[RewardResult]:
        """Each row's reward: the one its environment gave, else spec.reward's score of its text."""
        given = batch.environment_rewards or [None] * len(batch)
        unscored = [row for row, result in enumerate(given) if result is None]
        scored = self._score_texts(
            [prompt_texts[row] for row in unscored],
            [batch.texts[row] for row in unscored],
            [batch.samples[row] for row in unscored],
        )
        results = list(given)
        for row, result in zip(unscored, scored, strict=True):
            results[row] = result
        return results

    def score(self, batch: RolloutBatch, prompts: list[Prompt], step: int, round_index: int = 0) -> list[Any]:
        """Scores (with any overlong penalty) and which rewards succeeded into the batch; returns the results."""
        prompt_texts = [p.text for p in prompts for _ in range(self.group_size)]
        results = self.score_rows(batch, prompt_texts)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32)  # (N,)
        scored = torch.tensor([r.error is None for r in results])  # (N,)
        for row in (~scored).nonzero().flatten().tolist():
            log.warning("step %d: reward failed for response %d: %s", step + 1, row, results[row].error)
        scores = scores + self.shaping(batch.response_lengths)  # (N,)
        if self.needs_baseline:
            greedy = self.rollout_stage.run(prompts, step, greedy=True, stream=round_index, record=False)
            base = self.score_rows(greedy, [p.text for p in prompts])
            baseline = torch.tensor([r.score for r in base]) + self.shaping(
                greedy.response_lengths
            )  # (B,) shaped alike
            batch.baseline_scores = baseline.repeat_interleave(self.group_size)  # (N,)
            # a failed baseline is no baseline: the prompt's samples would be compared with a placeholder
            scored &= torch.tensor([r.error is None for r in base]).repeat_interleave(self.group_size)  # (N,)
        batch.scores, batch.scored = scores, scored
        return results

    def shaping(self, lengths: torch.Tensor) -> torch.Tensor:
        """(N,) what reward.overlongPenalty adds to responses of `lengths` tokens (0 when it is off)."""
        overlong = self.settings.overlong
        if overlong is None:
            return torch.zeros(len(lengths))
        budget = self.settings.max_response_tokens
        return overlong_penalty(lengths, budget, overlong.buffer_length, overlong.penalty_factor)

    def _forward(self, role: str, batch: RolloutBatch) -> torch.Tensor:
        group = self.groups.host(role)
        micro = self.settings.micro.forward(role)
        if role == "critic":
            parts = group.call_sharded(
                "compute_values", batch, micro_batch_size=micro.rows, max_tokens=micro.max_tokens
            )
        else:
            parts = group.call_sharded(
                "compute_logprobs",
                batch,
                role=role,
                temperature=self.settings.sampling.temperature,
                micro_batch_size=micro.rows,
                max_tokens=micro.max_tokens,
            )
        return torch.cat(parts) * batch.response_mask  # (N, R)

    def _old_logprobs_and_sum_pi_squared(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's old-log-prob pass, returning each token's sum_v pi(v)^2 too (a token-baseline estimator)."""
        micro = self.settings.micro.forward("actor")
        parts = self.groups.host("actor").call_sharded(
            "compute_logprobs",
            batch,
            role="actor",
            temperature=self.settings.sampling.temperature,
            micro_batch_size=micro.rows,
            max_tokens=micro.max_tokens,
            sum_pi_squared=True,
        )
        logprobs = torch.cat([part[0] for part in parts]) * batch.response_mask  # (N, R)
        return logprobs, torch.cat([part[1] for part in parts]) * batch.response_mask  # (N, R) each

    def reference_logprobs(self, batch: RolloutBatch) -> None:
        """batch.ref_logprobs, unless the asynchronous producer already computed them (AsyncController.generate)."""
        if self.settings.kl.coef > 0 and batch.ref_logprobs is None:
            batch.ref_logprobs = self._forward("reference", batch)

    def old_logprobs(self, batch: RolloutBatch) -> None:
        if self.settings.use_engine_logprobs:
            batch.old_logprobs = batch.engine_logprobs
        elif self.needs_sum_pi_squared:  # the estimator reads both before the update: one pass gives them
            batch.old_logprobs, batch.sum_pi_squared = self._old_logprobs_and_sum_pi_squared(batch)
        elif not self.update_config.on_policy:
            batch.old_logprobs = self._forward("actor", batch)

    def training_tokens(self, batch: RolloutBatch) -> dict[str, float]:
        """batch.loss_mask: the response tokens of samples whose reward succeeded, less those the rollout
        correction rejects; with truncated importance sampling, batch.is_weights. Returns the correction's metrics.

        Decoupled mode only: in bypass mode (rollout.useEngineLogprobs) the update corrects each micro-batch
        against the current policy (UpdateConfig.bypass_correction).
        """
        assert batch.scored is not None
        batch.loss_mask = batch.response_mask * batch.scored.float()[:, None]  # (N, R)
        correction_config = self.settings.correction
        if correction_config is None or self.settings.use_engine_logprobs or self.update_config.on_policy:
            return {}  # none, bypass mode's or the on-policy update's own (UpdateConfig.on_policy_correction)
        assert batch.old_logprobs is not None and batch.engine_logprobs is not None
        correction = rollout_correction(batch.old_logprobs, batch.engine_logprobs, batch.loss_mask, correction_config)
        batch.is_weights = correction.weights
        batch.loss_mask = batch.loss_mask * correction.keep  # (N, R)
        return {f"correction/{name}": float(value) for name, value in correction.metrics.items()}

    def critic_values(self, batch: RolloutBatch) -> None:
        if self.spec.models.critic is not None:
            batch.values = self._forward("critic", batch)

    def advantages(self, batch: RolloutBatch) -> None:
        assert batch.scores is not None
        rewards = token_rewards_from_scores(batch.scores, batch.response_mask)  # (N, R)
        kl_settings = self.settings.kl
        if kl_settings.in_reward:
            assert batch.ref_logprobs is not None and batch.old_logprobs is not None
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, kl_settings.estimator)  # (N, R)
            rewards = rewards - kl_settings.coef * kl * batch.response_mask  # (N, R)
        batch.token_rewards = rewards
        inputs = AdvantageInputs(
            token_rewards=rewards,
            response_mask=batch.response_mask,
            group_index=batch.group_index,
            values=batch.values,
            baseline_scores=batch.baseline_scores,
            gamma=self.algo.gamma,
            lam=self.algo.lam,
            normalize_std=bool(self.algo.normalize_advantage_std),
            scored=batch.scored,
            old_logprobs=batch.old_logprobs,
            sum_pi_squared=batch.sum_pi_squared,
            is_weights=batch.is_weights,
        )
        batch.advantages, batch.returns = self.estimator(inputs)  # (N, R), (N, R)

    def _layout_for_update(self, batch: RolloutBatch, world: int) -> RolloutBatch:
        """Rows reordered so that rank r of `world` gets, as its contiguous shard, its part of every mini-batch."""
        minis = self.plan.mini_batches
        mini_rows = len(batch) // minis
        part = mini_rows // world
        order = [m * mini_rows + r * part + i for r in range(world) for m in range(minis) for i in range(part)]
        return batch.select(order)

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        laid_out = self._layout_for_update(batch, self.plan.actor_world_size)
        metrics: dict[str, float] = {}
        if self.spec.models.critic is not None:
            critic = self.groups.host("critic")  # a pool of its own may have another rank count than the actor's
            critic_batch = self._layout_for_update(batch, critic.world_size)
            config = replace(
                self.update_config,
                world_size=critic.world_size,
                micro_batch_size=self.settings.micro.critic_update,
                max_tokens_per_micro_batch=self.settings.micro.critic_update_tokens,
            )
            metrics.update(critic.call_sharded("update_critic", critic_batch, config=config)[0])
        results = self.groups.actor.call_sharded("update_actor", laid_out, config=self.update_config)
        metrics.update(results[0][0])
        if self.update_config.on_policy:  # one mini-batch: the layout is the batch's own order
            batch.old_logprobs = torch.cat([behaviour for _, behaviour in results])  # (N, R)
        return metrics

    def sync(self, batch: RolloutBatch | None, version: int) -> dict[str, float]:
        """The actor's new weights into the engines: in place (colocated) or by broadcast (separate)."""
        if self.groups.rollout is None:
            results = self.groups.actor.call("sync_weights")
            self.engines.colocated_version = version
        else:  # the pool keeps the buckets until the next sync, for the replicas that join meanwhile
            results = self.load_pool(self.publish_weights(), version)
        self.weight_version = version
        metrics = {  # a pool scaled to 0 replicas loads nothing now: its next replica loads the weights
            "sync/seconds": max((r["sync/seconds"] for r in results), default=0.0),
            "sync/bytes": results[0]["sync/bytes"] if results else 0.0,
        }
        if self.spec.rollout.verify_sync and batch is not None:
            metrics["sync/max_logprob_diff"] = self.verify_sync(batch)
        return metrics

    def publish_weights(self) -> list[Any]:
        """The actor's weights in the object store, as buckets (ObjectRefs) the rollout pool loads from."""
        return list(self.groups.actor.call("publish_weights", self.spec.rollout.sync_bucket_mb)[0])

    def load_pool(self, buckets: list[Any], version: int) -> list[dict[str, float]]:
        """Every rollout replica loads `buckets` in place and takes on `version`; the per-replica sync metrics."""
        assert self.groups.rollout is not None
        return self.groups.rollout.load(buckets, version)

    def verify_sync(self, batch: RolloutBatch) -> float:
        """Score a fixed probe with trainer and engine; fail beyond rollout.verifySyncTolerance."""
        prompt = batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist()
        response = batch.response_ids[0][batch.response_attention_mask[0].bool()].tolist() or [self.pad_id]
        temperature = self.settings.sampling.temperature
        probes = self.groups.actor.call("probe_logprobs", prompt, response, temperature)
        pairs = [(p["trainer"], p["engine"]) for p in probes if p["engine"]]
        if self.groups.rollout is not None:
            engines = self.groups.rollout.call("response_logprobs", prompt, response, temperature, self.weight_version)
            pairs += [(probes[0]["trainer"], engine) for engine in engines]
        diff = max(float((torch.tensor(t) - torch.tensor(e)).abs().max()) for t, e in pairs)
        if diff > self.spec.rollout.verify_sync_tolerance:
            raise SyncMismatchError(
                f"after the weight sync the rollout engine's log-probs differ from the trainer's by {diff:.3g} "
                f"(> spec.rollout.verifySyncTolerance {self.spec.rollout.verify_sync_tolerance:g})"
            )
        return diff

    # -- validation ---------------------------------------------------------------------------------
    def validate_when_due(self, result: StepResult) -> None:
        """The validation metrics into the step's result when validation is due after it."""
        if not self.validation_due(result.step):
            return
        started = time.perf_counter()
        with step_deadline(result.step + 1, self.spec.training.step_timeout_seconds):  # a budget of its own
            result.metrics.update(self.validate(result.step))
        result.metrics["time/validation"] = time.perf_counter() - started

    def validate_before_training(self, start_step: int) -> dict[str, float] | None:
        """training.validateBeforeTraining: the untrained model's validation metrics, before the first step of a
        fresh run (None otherwise). It samples with step 0's validation seeds, as the validation after the first
        step does: the two differ by the weights only."""
        if start_step > 0 or not self.spec.training.validate_before_training or self.plan.validation is None:
            return None
        started = time.perf_counter()
        with step_deadline(0, self.spec.training.step_timeout_seconds):
            metrics = self.validate(0)
        metrics["time/validation"] = time.perf_counter() - started
        return metrics

    def validation_due(self, step: int) -> bool:
        """data.validation is scored every training.validationEverySteps steps and after the last step."""
        if self.plan.validation is None:
            return False
        done, every = step + 1, self.spec.training.validation_every_steps
        return done == self.plan.total_steps or (every is not None and done % every == 0)

    def validate(self, step: int) -> dict[str, float]:
        """Greedy and groupSize sampled responses to every validation prompt, scored (see loop/validation.py)."""
        assert self.plan.validation is not None
        prompts = self.plan.validation.prompts

        def scored(greedy: bool) -> list[list[Scored]]:
            batch = self.rollout_stage.run(prompts, step, greedy=greedy, stream=VALIDATION_STREAM, record=False)
            per_prompt = len(batch) // len(prompts)
            results = self.score_rows(batch, [p.text for p in prompts for _ in range(per_prompt)])
            ranked = [
                Scored(text, result.score, result.error is None, data_source(sample), result.metrics, result.pred)
                for text, result, sample in zip(batch.texts, results, batch.samples or [{}] * len(results), strict=True)
            ]
            return [ranked[i * per_prompt : (i + 1) * per_prompt] for i in range(len(prompts))]

        greedy = scored(greedy=True)
        sampled = scored(greedy=False)
        return validation_metrics([responses[0] for responses in greedy], sampled)
