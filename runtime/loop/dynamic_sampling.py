"""DAPO's dynamic sampling (arXiv 2503.14476, section 3.2): train only on groups whose rewards differ.

A group whose scored members all share one value of the filter metric (all right, all wrong) has
zero advantage under a group baseline: it costs a forward and backward pass and teaches nothing. Dynamic
sampling drops such groups and generates more prompts until `data.batchSize` groups remain, at most
`maxRoundsPerStep` rounds per step. Pure pieces here; the controller runs the rounds.

Follows verl's DAPO trainer (recipe/dapo: filter_groups with metric and max_num_gen_batches). Departures:
- The prompts of round r > 0 are drawn at random from the training set with a seed derived from
  (training.seed, step, r), not taken from the data loader's next batch, so the batch of every step
  stays a pure function of the step and a resumed run replays exactly.
- verl raises as soon as one step runs out of rounds. Here such a step trains on the informative groups
  it has (as many as split evenly over the ranks and mini-batches; none means no update that step)
  and the job stops only after `maxCappedSteps` such steps in a row, with an error that says why.
- A group needs two scored members that differ: failed rewards are no evidence either way.
- The count of capped steps in a row lives in the driver, not in checkpoints: a resumed job counts afresh.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from kuberl.api.algorithm import DynamicSamplingSpec
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt, PromptDataset, epoch_seed
from kuberl.runtime.loop.plan import RunConfigError


class DynamicSamplingStalled(RunConfigError):
    """Too many steps in a row could not fill their batch with groups whose rewards differ."""


def informative_groups(values: Tensor, group_index: Tensor, scored: Tensor) -> Tensor:
    """(G,) bool per group id 0..G-1: at least two scored members whose values differ.

    >>> informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]), torch.ones(4).bool())
    tensor([False,  True])
    """
    groups = int(group_index.max()) + 1 if group_index.numel() else 0
    counted = scored.bool()  # (N,)
    index, kept = group_index[counted], values[counted].float()  # (n,), (n,) the scored members
    high = torch.full((groups,), -math.inf).scatter_reduce(0, index, kept, "amax")  # (G,)
    low = torch.full((groups,), math.inf).scatter_reduce(0, index, kept, "amin")  # (G,)
    members = torch.zeros(groups).index_add(0, index, torch.ones_like(kept))  # (G,)
    return (members >= 2) & (high > low)  # (G,)


def trainable_groups(available: int, wanted: int, group_size: int, rows_unit: int) -> int:
    """How many groups to train on: `wanted` when there are enough, else the most of `available` whose
    rows (x group_size) split evenly into `rows_unit` (ranks x mini-batches); 0 when none do."""
    if available >= wanted:
        return wanted
    fits = available
    while fits > 0 and (fits * group_size) % rows_unit:
        fits -= 1
    return fits


def extra_prompts(dataset: PromptDataset, count: int, seed: int, step: int, round_index: int) -> list[Prompt]:
    """`count` training prompts for generation round `round_index` (>= 1) of `step`: a pure function of them."""
    generator = torch.Generator().manual_seed(epoch_seed(seed, step * 1_000 + round_index))
    order = torch.randperm(len(dataset), generator=generator)[: min(count, len(dataset))].tolist()
    return [dataset[i] for i in order]


@dataclass
class CapWatch:
    """Counts the steps in a row that ran out of generation rounds; stops the job at `max_capped_steps`."""

    max_rounds: int
    max_capped_steps: int
    capped_in_a_row: int = 0

    def after_step(self, capped: bool, step: int, groups: int, wanted: int) -> None:
        self.capped_in_a_row = self.capped_in_a_row + 1 if capped else 0
        if self.capped_in_a_row >= self.max_capped_steps:
            raise DynamicSamplingStalled(
                f"spec.algorithm.dynamicSampling: for {self.capped_in_a_row} steps in a row (the last: step "
                f"{step + 1}) {self.max_rounds} rounds of generation found fewer than data.batchSize ({wanted}) "
                f"prompts whose responses differ in reward (the last step found {groups}); the prompts are too "
                "easy or too hard for the model. Raise dynamicSampling.maxRoundsPerStep or maxCappedSteps, lower "
                "data.batchSize, use other data, or set dynamicSampling.enabled: false"
            )


#: (prompts, round) -> (the round's batch, scored, with batch.scored set; each response's filter value (N,))
GenerateAndScore = Callable[[list[Prompt], int], tuple[RolloutBatch, Tensor]]


def renumber_groups(batches: list[RolloutBatch]) -> RolloutBatch:
    """The batches one after another, their group ids made distinct (0.. in order of appearance)."""
    offset = 0
    parts = []
    for batch in batches:
        _, dense = torch.unique(batch.group_index, return_inverse=True)  # (N,) 0..G-1 in id order
        parts.append(replace(batch, group_index=dense + offset))
        offset += int(dense.max()) + 1 if dense.numel() else 0
    return RolloutBatch.concat(parts)


def filter_values(metric: str, batch: RolloutBatch, results: list[Any]) -> Tensor:
    """(N,) what dynamic sampling compares within a group (spec.algorithm.dynamicSampling.metric): the reward
    function's score, the reward after shaping (batch.scores), or a metric the reward function returns."""
    if metric == "reward":
        assert batch.scores is not None
        return batch.scores
    if metric == "score":
        return torch.tensor([r.score for r in results], dtype=torch.float32)
    values = []
    for row, result in enumerate(results):
        if result.error is not None:
            values.append(0.0)  # not scored: never compared (informative_groups skips it)
        elif metric not in result.metrics:
            returned = ", ".join(sorted(result.metrics)) or "only a score"
            raise RunConfigError(
                f"spec.algorithm.dynamicSampling.metric {metric!r}: the reward returned no such metric for "
                f"response {row} (it returned {returned}); use score, reward or one of those"
            )
        else:
            values.append(result.metrics[metric])
    return torch.tensor(values, dtype=torch.float32)


class DynamicSampler:
    """Runs the rounds of one step: generate, score, keep the informative groups, until the batch is full."""

    def __init__(
        self,
        spec: DynamicSamplingSpec,
        dataset: PromptDataset,
        batch_size: int,
        group_size: int,
        rows_unit: int,
        seed: int,
    ) -> None:
        self.spec = spec
        self.dataset = dataset
        self.batch_size = batch_size
        self.group_size = group_size
        self.rows_unit = rows_unit  # ranks x mini-batches: the trained rows must split evenly into these
        self.seed = seed
        self.watch = CapWatch(spec.max_rounds_per_step, spec.max_capped_steps)

    def collect(
        self, prompts: list[Prompt], step: int, generate_and_score: GenerateAndScore
    ) -> tuple[RolloutBatch, RolloutBatch | None, dict[str, float]]:
        """(every response generated this step, the batch to train on or None, metrics)."""
        generated: list[RolloutBatch] = []
        informative: list[RolloutBatch] = []
        found = 0
        while found < self.batch_size and len(generated) < self.spec.max_rounds_per_step:
            round_index = len(generated)
            if round_index:
                prompts = extra_prompts(self.dataset, self.batch_size, self.seed, step, round_index)
            batch, values = generate_and_score(prompts, round_index)
            assert batch.scored is not None
            keep = informative_groups(values, batch.group_index, batch.scored)  # (G,)
            generated.append(batch)
            if keep.any():
                informative.append(batch.select(torch.nonzero(keep[batch.group_index]).flatten().tolist()))
            found += int(keep.sum())
        capped = found < self.batch_size
        trained = trainable_groups(found, self.batch_size, self.group_size, self.rows_unit)
        metrics = {
            "dynamic_sampling/rounds": float(len(generated)),
            "dynamic_sampling/groups_generated": float(sum(int(b.group_index.max()) + 1 for b in generated)),
            "dynamic_sampling/groups_informative": float(found),
            "dynamic_sampling/groups_trained": float(trained),
            "dynamic_sampling/capped": float(capped),
        }
        metrics["dynamic_sampling/filtered_fraction"] = 1.0 - found / metrics["dynamic_sampling/groups_generated"]
        self.watch.after_step(capped, step, found, self.batch_size)
        train = None
        if trained:
            pool = renumber_groups(informative)
            train = pool.select(torch.nonzero(pool.group_index < trained).flatten().tolist())
        return renumber_groups(generated), train, metrics
