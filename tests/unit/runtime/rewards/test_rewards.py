"""Reward functions: the built-ins, loading a reward by name, scoring without ever raising, the reward model."""

import doctest
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.api.spec import BUILTIN_REWARDS as SCHEMA_BUILTIN_REWARDS
from kuberl.runtime.models.tiny import build_tiny_model
from kuberl.runtime.rewards import builtin
from kuberl.runtime.rewards.builtin import (
    BUILTIN_REWARDS,
    extract_final_answer,
    format_answer_tag,
    math_exact,
    math_numeric,
    tiny_task,
)
from kuberl.runtime.rewards.functions import (
    RewardConfigError,
    RewardResult,
    load_reward_function,
    score_batch,
    score_safely,
)
from kuberl.runtime.rewards.model import RewardModelScorer

GARBAGE = ["", "   ", "\x00\x01\ufffd", "}{\\boxed{", "####", "<answer>", "9" * 5000 + "x"]


def test_builtin_rewards_are_exactly_the_ones_the_schema_accepts() -> None:
    assert tuple(BUILTIN_REWARDS) == SCHEMA_BUILTIN_REWARDS


def test_docstring_examples_are_true() -> None:
    result = doctest.testmod(builtin)
    assert result.attempted > 10 and result.failed == 0


# ----------------------------------------------------------------------------- answer extraction


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so \\boxed{42} and later 7", "42"),  # boxed wins over a later number
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("work... #### 1,234\nmore text", "1,234"),  # GSM8K marker: the rest of its line
        ("<answer>a</answer> then <answer> b </answer>", "b"),  # the last tag, stripped
        ("3 apples, then 5, then -2.5", "-2.5"),  # the last number
        ("three quarters: 3/4", "3/4"),
        ("nothing numeric", None),
        ("\\boxed{unclosed 5", "5"),  # an unclosed box is no box: falls through to the last number
    ],
)
def test_final_answer_extraction_order(completion: str, answer: str | None) -> None:
    assert extract_final_answer(completion) == answer


# ----------------------------------------------------------------------------- math_exact / math_numeric


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("The answer is \\boxed{18}.", "18", 1.0),
        ("#### 18", "18", 1.0),
        ("I get $1,000.", "1000", 1.0),  # commas, $ and the trailing period are normalised away
        ("I get 1000", "$1,000", 1.0),
        ("It is 18.0", "18", 0.0),  # exact: strings, not numbers
        ("It is 17", "18", 0.0),
        ("Natalia sold 48 + 24 = 72 clips.", "#### 72", 1.0),  # a GSM8K solution as the reference
        ("The answer is 72", "She sold 48/2 = 24 in May.\n#### 72", 1.0),
        ("no number", "18", 0.0),
    ],
)
def test_math_exact(completion: str, answer: str, score: float) -> None:
    assert math_exact(completion, {"answer": answer}) == score


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("It is 18.0", "18", 1.0),
        ("<answer>0.75</answer>", "3/4", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("#### 1,234,567", "1234567", 1.0),
        ("about 1000000.5", "1000000", 1.0),  # |0.5| <= 1e-6 * 1e6: inside the relative tolerance
        ("about 1000002", "1000000", 0.0),  # 2 > 1e-6 * 1e6 = 1
        ("it is 0", "0", 1.0),
        ("\\boxed{nan}", "nan", 0.0),  # not numbers, however float() reads them
        ("\\boxed{1/0}", "1", 0.0),
        ("\\boxed{twelve}", "12", 0.0),
    ],
)
def test_math_numeric(completion: str, answer: str, score: float) -> None:
    assert math_numeric(completion, {"answer": answer}) == score


@pytest.mark.parametrize("reward", [math_exact, math_numeric])
@pytest.mark.parametrize("completion", GARBAGE)
def test_math_rewards_score_garbage_zero(reward, completion: str) -> None:
    assert reward(completion, {"answer": "18"}) == 0.0


def test_math_reward_without_an_answer_field_names_the_fields_it_has() -> None:
    with pytest.raises(KeyError, match="no expected answer in answer or reward_model.ground_truth.*prompt, solution"):
        math_exact("18", {"prompt": "q", "solution": "18"})


# ----------------------------------------------------------------------------- format_answer_tag


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<think>a</think><answer>b</answer>", 1.0),
        ("\n <think>\nmulti\nline\n</think>\n\n<answer> 4 </answer>\n", 1.0),
        ("<think></think><answer></answer>", 1.0),
        ("<answer>4</answer>", 0.0),
        ("<answer>4</answer><think>x</think>", 0.0),  # wrong order
        ("<think>x</think><answer>4</answer> trailing words", 0.0),
        ("prefix <think>x</think><answer>4</answer>", 0.0),
        *[(garbage, 0.0) for garbage in GARBAGE],
    ],
)
def test_format_answer_tag(completion: str, score: float) -> None:
    assert format_answer_tag(completion, {}) == score


#: The regular expression format_answer_tag used to run, and still defines its language.
FORMAT_ANSWER_TAG_LANGUAGE = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
TAG_PIECES = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\u2003", "x", "<", ">"])


@st.composite
def near_answers(draw: st.DrawFn) -> str:
    """Answers in the format, then a few pieces inserted or deleted: half of them still match."""
    spaces = st.lists(st.sampled_from([" ", "\n", "\u2003"]), max_size=2).map("".join)
    words = st.lists(TAG_PIECES, max_size=4).map("".join)
    pieces = [draw(spaces), "<think>", draw(words), "</think>", draw(spaces), "<answer>", draw(words), "</answer>"]
    pieces.append(draw(spaces))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        at = draw(st.integers(min_value=0, max_value=len(pieces)))
        if draw(st.booleans()) and at < len(pieces):
            del pieces[at]
        else:
            pieces.insert(at, draw(TAG_PIECES))
    return "".join(pieces)


@settings(max_examples=2000, deadline=None)
@given(st.lists(TAG_PIECES, max_size=12).map("".join) | near_answers())
def test_format_answer_tag_accepts_exactly_the_language_of_its_regular_expression(completion: str) -> None:
    expected = 1.0 if FORMAT_ANSWER_TAG_LANGUAGE.fullmatch(completion) else 0.0
    assert format_answer_tag(completion, {}) == expected


@pytest.mark.parametrize(
    "degenerate",
    [
        '"<think>" + "</think><answer>" * 65536',  # 1 MiB: every </think> x every later </answer> candidate
        '"<think>" + "</think><answer></answer>x" * 40330',  # 1 MiB that almost matches at every pair
        '"<think>" + "</think>" + " " * (1 << 20) + "x"',  # a megabyte of whitespace after the close
    ],
)
def test_format_answer_tag_scores_a_megabyte_of_degenerate_output_in_linear_time(degenerate: str) -> None:
    # The regular expression took 2.8 s on 64 KB of the first kind and grows with the square of the
    # length: about 12 minutes for this megabyte. The linear parse takes milliseconds. A process of its
    # own, stopped after 10 s, because a backtracking regular expression never lets go of the GIL.
    script = (
        "import time; from kuberl.runtime.rewards.builtin import format_answer_tag\n"
        f"text = {degenerate}\nassert len(text) >= 1 << 20\n"
        "started = time.perf_counter(); score = format_answer_tag(text, {})\n"
        "print(score, time.perf_counter() - started)"
    )
    try:
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=10, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("format_answer_tag ran for more than 10 s on a megabyte")
    score, seconds = run.stdout.split()
    assert float(score) == 0.0
    assert float(seconds) < 2.0  # a bound a busy machine meets and a quadratic parse cannot


# ----------------------------------------------------------------------------- tiny_task


@pytest.mark.parametrize(
    ("completion", "score", "matched_share", "extra_words"),
    [
        (" 6 7 8", 1.0, 1.0, 0),
        ("6 7 8", 1.0, 1.0, 0),  # the leading space is the tokenizer's, not the task's
        (" 6 7 8 9 10", 3 / 5, 1.0, 2),  # counting on: 3 right of 5 words
        (" 6 7 8 9 10 11 12 13 14 15 16 17", 3 / 12, 1.0, 9),  # to the 12-token limit
        (" 7 8 9", 0.0, 0.0, 0),  # one off: no position matches
        (" 6 x 8", 2 / 3, 2 / 3, 0),
        (" x 6 7 8", 0.0, 0.0, 1),  # shifted by one word: no position matches
        (" 6", 1 / 3, 1 / 3, 0),  # stopped early: 1 of the 3 expected
        (" 6 7", 2 / 3, 2 / 3, 0),
        ("", 0.0, 0.0, 0),
        ("   ", 0.0, 0.0, 0),
        ("six seven eight", 0.0, 0.0, 0),
        ("6.0 7 8", 2 / 3, 2 / 3, 0),  # "6.0" is not the word "6"
    ],
)
def test_tiny_task(completion: str, score: float, matched_share: float, extra_words: int) -> None:
    got, metrics = tiny_task(completion, {"prompt": "count: 3 4 5", "answer": "6 7 8"})
    assert got == pytest.approx(score)
    assert metrics == pytest.approx({"matched_share": matched_share, "extra_words": extra_words})


def test_tiny_task_pays_most_for_the_right_numbers_and_then_stopping() -> None:
    sample = {"answer": "6 7 8"}
    ranked = [" 6 7 8", " 6 7 8 9", " 6 7", " 6 7 8 9 10 11 12", " 7 8 9"]
    scores = [tiny_task(completion, sample)[0] for completion in ranked]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0 and len(set(scores)) == len(scores)


@pytest.mark.parametrize("completion", GARBAGE)
def test_tiny_task_scores_garbage_in_zero_to_one(completion: str) -> None:
    score, _ = tiny_task(completion, {"answer": "6 7 8"})
    assert 0.0 <= score <= 1.0


# ----------------------------------------------------------------------------- score_safely


def raises(completion: str, sample: dict) -> float:
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        (float("nan"), "returned score nan"),
        (float("inf"), "returned score inf"),
        ("0.5", "returned score '0.5' (str)"),
        (None, "returned score None"),
        ([1.0], "returned score [1.0]"),
        ((1.0, {"m": 1.0}, "extra"), "expected a score or (score, {metric: value})"),
        ((1.0, [0.5]), "expected a score or (score, {metric: value})"),
        ((1.0, {"m": float("nan")}), "returned metric 'm': nan"),
        ((1.0, {"m": "high"}), "returned metric 'm': 'high'"),
        ((1.0, {3: 1.0}), "returned metric 3"),
        (torch.tensor([1.0, 2.0]), "returned score tensor"),
    ],
)
def test_score_safely_turns_a_malformed_return_into_a_failed_result(returned: object, reason: str) -> None:
    result = score_safely(lambda completion, sample: returned, "x", {})
    assert result.score == 0.0 and result.metrics == {}
    assert result.error is not None and reason in result.error


def test_score_safely_turns_an_exception_into_a_failed_result_and_logs_it(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="kuberl.runtime.rewards.functions"):
        result = score_safely(raises, "x", {})
    assert result == RewardResult(0.0, {}, error="RuntimeError: boom")
    assert "raises" in caplog.text and "RuntimeError: boom" in caplog.text


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (0.25, RewardResult(0.25, {})),
        (1, RewardResult(1.0, {})),
        (True, RewardResult(1.0, {})),  # `return answer == expected` is a fine reward
        (torch.tensor(0.5), RewardResult(0.5, {})),
        ((0.5, {"length": 3}), RewardResult(0.5, {"length": 3.0})),
        ((0.5, {}), RewardResult(0.5, {})),
    ],
)
def test_score_safely_accepts_numbers_and_score_metric_pairs(returned: object, expected: RewardResult) -> None:
    result = score_safely(lambda completion, sample: returned, "x", {})
    assert result == expected
    assert isinstance(result.score, float)


def test_score_batch_scores_each_pair_and_isolates_failures() -> None:
    def fails_on_odd(completion: str, sample: dict) -> float:
        if int(completion) % 2:
            raise ValueError("odd")
        return float(completion) + sample["bonus"]

    results = score_batch(fails_on_odd, ["2", "3", "4"], [{"bonus": 0.5}] * 3)
    assert [r.score for r in results] == [2.5, 0.0, 4.5]
    assert [r.error for r in results] == [None, "ValueError: odd", None]


def test_score_batch_refuses_unpaired_lists() -> None:
    with pytest.raises(ValueError, match="2 completions but 1 samples"):
        score_batch(math_exact, ["a", "b"], [{"answer": "1"}])


def test_builtin_reward_without_an_answer_is_one_failed_sample_not_a_crash() -> None:
    result = score_safely(tiny_task, "6 7 8", {"prompt": "count: 3 4 5"})
    assert result.score == 0.0 and "no expected answer in answer or reward_model.ground_truth" in (result.error or "")


# ----------------------------------------------------------------------------- load_reward_function


def test_load_builtin_by_name() -> None:
    assert load_reward_function("math_exact") is math_exact


def test_load_module_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards").mkdir()
    (tmp_path / "my_rewards" / "__init__.py").write_text("")
    (tmp_path / "my_rewards" / "length.py").write_text(
        "def shorter_is_better(completion, sample):\n    return 1.0 / (1 + len(completion))\nNOT_A_FUNCTION = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    reward = load_reward_function("my_rewards.length:shorter_is_better")
    assert score_safely(reward, "abc", {}).score == 0.25  # 1 / (1 + 3)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("math_exactly", "unknown built-in reward 'math_exactly'; built-ins are math_exact, math_numeric"),
        ("no_such_package.rewards:score", "cannot import module 'no_such_package.rewards'.*PYTHONPATH"),
        ("math:no_such_function", "module 'math' has no attribute 'no_such_function'"),
        ("math:pi", "'math:pi' is a float, not a function"),
    ],
)
def test_load_reward_function_errors_name_the_field_and_what_to_do(ref: str, message: str) -> None:
    with pytest.raises(RewardConfigError, match=r"^spec\.reward\.function: " + message):
        load_reward_function(ref)


def test_reward_config_error_is_a_value_error() -> None:
    assert issubclass(RewardConfigError, ValueError)


# ----------------------------------------------------------------------------- RewardModelScorer


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("reward-demo", tmp_path_factory.mktemp("tiny") / "reward-demo")


PROMPTS = ["count: 1 2 3", "Hello", "count: 10 11 12", "<answer>"]
COMPLETIONS = [" 4 5 6", " there, how are you today? Fine.", "", " 7"]


def test_reward_model_gives_one_finite_score_per_pair(reward_model_dir: Path) -> None:
    scores = RewardModelScorer(reward_model_dir).score(PROMPTS, COMPLETIONS)
    assert len(scores) == 4
    assert all(isinstance(score, float) and math.isfinite(score) for score in scores)
    assert len(set(scores)) == 4  # a scorer that ignored its input would give equal scores


def test_reward_model_scores_do_not_depend_on_the_batch_size(reward_model_dir: Path) -> None:
    # Right padding comes after each sequence's last token, which causal attention keeps from seeing it.
    one_by_one = RewardModelScorer(reward_model_dir, batch_size=1).score(PROMPTS, COMPLETIONS)
    together = RewardModelScorer(reward_model_dir, batch_size=4).score(PROMPTS, COMPLETIONS)
    torch.testing.assert_close(torch.tensor(together), torch.tensor(one_by_one), atol=1e-5, rtol=0)


def test_reward_model_refuses_unpaired_lists(reward_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        RewardModelScorer(reward_model_dir).score(["a", "b"], ["c"])


def test_reward_model_refuses_an_unknown_dtype(reward_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="dtype 'float64'"):
        RewardModelScorer(reward_model_dir, dtype="float64")
