"""Validation scores (val/mean@k, pass@k, maj@k; verl's per-data-source metrics) and DAPO's overlong penalty."""

import random

import pytest
import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.shaping import overlong_penalty
from kuberl.runtime.loop.validation import (
    Scored,
    answer_key,
    per_data_source_metrics,
    validation_metrics,
    validation_status,
)
from tests.unit.runtime.loop import verl_validation_reference as verl_validation

RIGHT, WRONG = Scored("so #### 4", 1.0, True), Scored("so #### 5", 0.0, True)
FAILED = Scored("#### 4", 0.0, False)


def test_a_binary_reward_gets_mean_pass_and_majority_at_k() -> None:
    # prompt 0: greedy right; samples right, wrong, wrong -> 1 correct of 3, majority answer 5 (wrong)
    # prompt 1: greedy wrong; samples wrong, right, right -> majority 4 (right)
    # greedy_mean 1/2 ; mean@3 = 3/6 ; pass@3 = both prompts have a correct one = 1 ; maj@3 = 1/2
    metrics = validation_metrics([RIGHT, WRONG], [[RIGHT, WRONG, WRONG], [WRONG, RIGHT, RIGHT]])
    assert metrics == {
        "val/samples": 3.0,
        "val/greedy_mean": 0.5,
        "val/mean@3": 0.5,
        "val/pass@3": 1.0,
        "val/maj@3": 0.5,
    }


def test_a_graded_reward_gets_means_only() -> None:
    half = Scored("6 7", 0.5, True)
    metrics = validation_metrics([half], [[half, RIGHT]])
    assert metrics == {"val/samples": 2.0, "val/greedy_mean": 0.5, "val/mean@2": 0.75}


def test_failed_rewards_count_in_no_mean_and_never_pass() -> None:
    # samples: failed (its placeholder 0 is not a score), wrong -> mean@2 = 0 over the one scored ; pass@2 = 0
    metrics = validation_metrics([RIGHT], [[FAILED, WRONG]])
    assert metrics["val/mean@2"] == 0.0 and metrics["val/pass@2"] == 0.0 and metrics["val/greedy_mean"] == 1.0


def test_majority_ties_go_to_the_answer_seen_first() -> None:
    assert validation_metrics([RIGHT], [[RIGHT, WRONG]])["val/maj@2"] == 1.0
    assert validation_metrics([RIGHT], [[WRONG, RIGHT]])["val/maj@2"] == 0.0


def test_answer_key_is_the_final_answer_or_the_whole_text() -> None:
    assert answer_key(r"thus \boxed{12}") == answer_key("#### 12") == "12"
    assert answer_key("  no   number ") == "no number"


def test_status_carries_the_latest_scores_and_nothing_without_them() -> None:
    metrics = validation_metrics([RIGHT], [[RIGHT, WRONG]])
    assert validation_status(metrics, step=6) == {
        "step": 6,
        "samples": 2,
        "greedyMean": 1.0,
        "meanAtK": 0.5,
        "passAtK": 1.0,
        "majAtK": 1.0,
    }
    assert validation_status({"reward/mean": 0.3}, step=7) is None


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (12, 0.0),  # within maxNewTokens - bufferLength = 16
        (16, 0.0),  # at the edge
        (17, -0.25 * 2.0),  # 1 of 4 buffer tokens over, factor 2
        (20, -2.0),  # the whole buffer: the whole factor
    ],
)
def test_overlong_penalty_grows_linearly_through_the_buffer(length: int, expected: float) -> None:
    penalty = overlong_penalty(torch.tensor([length]), max_new_tokens=20, buffer_length=4, penalty_factor=2.0)
    assert_close(penalty, torch.tensor([expected]))


# ------------------------------------------------------------- verl's per-data-source metrics


def verl_layout_samples(seed: int, prompts: int, k: int) -> list[list[Scored]]:
    """Each prompt's k samples, as math_dapo scores them: +-1, acc, and the answer read (some agree)."""
    rng = random.Random(seed)
    sampled = []
    for prompt in range(prompts):
        source = ("math_dapo", "aime_2024")[prompt % 2]
        right = str(rng.randint(0, 3))
        responses = []
        for _ in range(k):
            pred = str(rng.randint(0, 3))
            correct = pred == right
            responses.append(Scored("", 1.0 if correct else -1.0, True, source, {"acc": float(correct)}, pred))
        sampled.append(responses)
    return sampled


@pytest.mark.parametrize(("seed", "k"), [(0, 8), (1, 5), (2, 2), (3, 1)])
def test_per_data_source_metrics_are_verls(seed: int, k: int) -> None:
    sampled = verl_layout_samples(seed, prompts=6, k=k)
    flat = [(prompt, response) for prompt, responses in enumerate(sampled) for response in responses]
    verl = verl_validation.process_validation_metrics(
        [response.data_source for _, response in flat],
        [prompt for prompt, _ in flat],
        {
            "reward": [response.score for _, response in flat],
            "acc": [bool(response.metrics["acc"]) for _, response in flat],  # verl's math_dapo returns a bool
            "pred": [response.pred for _, response in flat],
        },
    )
    ours = per_data_source_metrics(sampled)
    expected = {}
    for source, values in verl.items():
        for value, found in values.items():
            for name in ("mean", "best", "maj"):
                key = f"{name}@{k}" if name == "mean" else f"{name}@{k}/mean"
                if key in found:
                    expected[f"val/{source}/{value}/{name}@{k}"] = found[key]
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, abs=1e-12), key
    assert {f"val/math_dapo/acc/mean@{k}", f"val/aime_2024/reward/mean@{k}"} <= ours.keys()


def test_records_without_a_data_source_get_no_per_source_metrics() -> None:
    assert per_data_source_metrics([[RIGHT, WRONG]]) == {}
    without_pred = Scored("", 1.0, True, "openai/gsm8k")
    metrics = per_data_source_metrics([[without_pred, Scored("", 0.0, True, "openai/gsm8k")]])
    assert set(metrics) == {"val/openai/gsm8k/reward/mean@2", "val/openai/gsm8k/reward/best@2"}  # no pred: no maj
