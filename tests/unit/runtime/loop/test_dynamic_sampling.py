"""DAPO's dynamic sampling: which groups teach, how many rounds a step takes, and the stop when it cannot fill."""

import pytest
import torch

from kuberl.api.algorithm import DynamicSamplingSpec
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt, PromptDataset
from kuberl.runtime.loop.dynamic_sampling import (
    DynamicSampler,
    DynamicSamplingStalled,
    extra_prompts,
    informative_groups,
    trainable_groups,
)
from kuberl.runtime.loop.plan import RunConfigError

GROUP_SIZE = 2
DATASET = PromptDataset([Prompt(i, [1, 2, i + 3], f"p{i}", {"i": i}) for i in range(40)])
FLAT, MIXED = (1.0, 1.0), (0.0, 1.0)  # the values of a group's two members


def test_a_group_teaches_when_two_scored_members_differ() -> None:
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.7])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    scored = torch.tensor([True, True, True, True, True, False, True])
    # group 0 all equal; 1 differs; 2 has one scored member (the failed 0.0 is no evidence); 3 is alone
    assert informative_groups(values, groups, scored).tolist() == [False, True, False, False]


@pytest.mark.parametrize(
    ("available", "wanted", "expected"),
    [(9, 8, 8), (8, 8, 8), (5, 8, 4), (1, 8, 0), (0, 8, 0)],  # rows (groups x 2) must split into 8
)
def test_trainable_groups_split_evenly_over_ranks_and_mini_batches(available: int, wanted: int, expected: int) -> None:
    assert trainable_groups(available, wanted, group_size=2, rows_unit=8) == expected


def test_extra_prompts_are_a_pure_function_of_seed_step_and_round() -> None:
    first = [p.index for p in extra_prompts(DATASET, 4, seed=7, step=3, round_index=1)]
    assert first == [p.index for p in extra_prompts(DATASET, 4, seed=7, step=3, round_index=1)]
    assert first != [p.index for p in extra_prompts(DATASET, 4, seed=7, step=3, round_index=2)]
    assert len(set(first)) == 4


class Rounds:
    """A fake generate-and-score: round r's groups get the member values in `plan[r]`, in prompt order."""

    def __init__(self, plan: list[list[tuple[float, float]]]) -> None:
        self.plan = plan
        self.prompts: list[list[int]] = []

    def __call__(self, prompts: list[Prompt], round_index: int) -> tuple[RolloutBatch, torch.Tensor]:
        self.prompts.append([p.index for p in prompts])
        groups = self.plan[round_index]
        n = len(groups) * GROUP_SIZE
        values = torch.tensor([v for group in groups for v in group])  # (n,)
        batch = RolloutBatch(
            prompt_ids=torch.ones(n, 2).long(),
            prompt_mask=torch.ones(n, 2).long(),
            response_ids=torch.ones(n, 3).long(),
            response_mask=torch.ones(n, 3),
            group_index=torch.arange(len(groups)).repeat_interleave(GROUP_SIZE),
            scores=values.clone(),
            scored=torch.ones(n).bool(),
            texts=[f"r{round_index}g{i // GROUP_SIZE}" for i in range(n)],
        )
        return batch, values


def sampler(batch_size: int = 4, max_rounds: int = 4, max_capped_steps: int = 3) -> DynamicSampler:
    spec = DynamicSamplingSpec(maxRoundsPerStep=max_rounds, maxCappedSteps=max_capped_steps)
    return DynamicSampler(spec, DATASET, batch_size, GROUP_SIZE, rows_unit=2, seed=0)


def first_prompts(count: int = 4) -> list[Prompt]:
    return [DATASET[i] for i in range(count)]


def test_rounds_continue_until_the_batch_is_full_of_groups_that_differ() -> None:
    rounds = Rounds([[MIXED, FLAT, MIXED, FLAT], [FLAT, MIXED, MIXED, FLAT]])
    generated, train, metrics = sampler().collect(first_prompts(), step=0, generate_and_score=rounds)
    assert train is not None and len(train) == 4 * GROUP_SIZE
    # the batch never trains on a group whose members all score alike
    for group in torch.unique(train.group_index):
        assert train.scores[train.group_index == group].unique().numel() > 1
    # the two informative groups of round 0, then two of round 1, in order
    assert [text[:4] for text in train.texts[::GROUP_SIZE]] == ["r0g0", "r0g2", "r1g1", "r1g2"]
    assert len(generated) == 8 * GROUP_SIZE and generated.group_index.unique().numel() == 8
    assert rounds.prompts[0] == [0, 1, 2, 3] and rounds.prompts[1] != rounds.prompts[0]
    assert metrics == {
        "dynamic_sampling/rounds": 2.0,
        "dynamic_sampling/groups_generated": 8.0,
        "dynamic_sampling/groups_informative": 4.0,
        "dynamic_sampling/groups_trained": 4.0,
        "dynamic_sampling/capped": 0.0,
        "dynamic_sampling/filtered_fraction": 0.5,
    }


def test_surplus_groups_are_cut_to_the_batch_size() -> None:
    rounds = Rounds([[MIXED, FLAT, MIXED, FLAT], [MIXED, MIXED, MIXED, MIXED]])
    _, train, metrics = sampler().collect(first_prompts(), step=0, generate_and_score=rounds)
    assert train is not None and train.group_index.unique().tolist() == [0, 1, 2, 3]
    assert metrics["dynamic_sampling/groups_informative"] == 6.0


def test_a_capped_step_trains_on_what_it_found_and_one_with_nothing_does_not_train() -> None:
    rounds = Rounds([[MIXED, FLAT, FLAT, FLAT], [FLAT, FLAT, FLAT, FLAT]])
    _, train, metrics = sampler(max_rounds=2).collect(first_prompts(), step=0, generate_and_score=rounds)
    assert train is not None and train.group_index.unique().numel() == 1
    assert metrics["dynamic_sampling/capped"] == 1.0
    rounds = Rounds([[FLAT] * 4, [FLAT] * 4])
    _, train, metrics = sampler(max_rounds=2).collect(first_prompts(), step=1, generate_and_score=rounds)
    assert train is None and metrics["dynamic_sampling/groups_trained"] == 0.0


def test_hitting_the_cap_steps_in_a_row_stops_the_job_naming_the_field() -> None:
    watcher = sampler(max_rounds=1, max_capped_steps=2)
    watcher.collect(first_prompts(), 0, Rounds([[FLAT, MIXED, FLAT, FLAT]]))
    watcher.collect(first_prompts(), 1, Rounds([[MIXED] * 4]))  # a full step resets the count
    watcher.collect(first_prompts(), 2, Rounds([[FLAT] * 4]))
    with pytest.raises(DynamicSamplingStalled, match=r"spec.algorithm.dynamicSampling: for 2 steps in a row") as error:
        watcher.collect(first_prompts(), 3, Rounds([[FLAT] * 4]))
    assert isinstance(error.value, RunConfigError)  # `kuberl run` reports it and exits with the config error code
    assert "maxRoundsPerStep" in str(error.value)
