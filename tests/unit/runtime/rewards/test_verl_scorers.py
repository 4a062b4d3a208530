"""by_data_source gives verl's default scores: each scorer against a plain restatement of verl's, by hand and fuzzed."""

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.runtime.rewards import sample, symbolic, verl_scorers
from kuberl.runtime.rewards.builtin import math_exact, math_numeric
from kuberl.runtime.rewards.functions import score_safely
from kuberl.runtime.rewards.verl_scorers import by_data_source
from tests.unit.runtime.rewards import verl_reward_reference as verl


def verl_layout(source: str, truth: str) -> dict:
    return {"data_source": source, "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {}}


def kuberl_score(source: str, solution: str, truth: str) -> float:
    result = score_safely(by_data_source, solution, verl_layout(source, truth))
    assert result.error is None, result.error
    return result.score


def verl_score(source: str, solution: str, truth: str) -> float:
    score = verl.default_compute_score(source, solution, truth)
    return float(score["score"]) if isinstance(score, dict) else score


def test_docstring_examples_are_true() -> None:
    for module in (verl_scorers, sample, symbolic):
        assert doctest.testmod(module).failed == 0, module.__name__


MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning", "aime_2024", "aime25")
GSM8K = [
    ("Natalia sold 48 + 24 = 72 clips. #### 72", "72", 1.0),
    ("so it is #### 1,200", "1200", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 3.50", "3.5", 0.0),  # strings, not numbers
    ("####72", "72", 0.0),  # the space after #### is part of the format
    ("#### $5", "5", 0.0),
    ("The answer is 72", "72", 0.0),  # strict: no #### no score
    ("#### 7 then #### 8", "8", 1.0),  # the last one counts
    ("#### 72" + " and so on" * 40, "72", 0.0),  # only the last 300 characters are read
]
MATH = [
    (r"So $\boxed{\frac{1}{2}}$.", r"\frac12", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),
    (r"the answer is \boxed 5$ indeed", "5", 1.0),
    (r"\fbox{5}", "5", 0.0),
    (r"\boxed{x = 3}", "3", 1.0),
    (r"\boxed{10\%}", "10", 1.0),
    (r"\boxed{10\\\\%}", "10", 1.0),  # \\ becomes \, and verl's math_reward.py then removes \\% too
    (r"\boxed{\sqrt2}", r"\sqrt{2}", 1.0),
    (r"\boxed{.5}", "0.5", 1.0),
    (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
    (r"\boxed{\frac{1}{\sqrt{3}}}", r"\frac{1}{\sqrt3}", 1.0),
    (r"\boxed{3", "3", 0.0),  # unbalanced
    (r"\boxed{\frac}", r"\frac", 1.0),  # normalising fails on both: compared as written
    (r"\boxed{5^\circ}", "5", 1.0),
    (r"\boxed{5 \text{ cm}}", "5", 1.0),
    (r"\boxed{7}", "8", 0.0),
    ("no box at all: 7", "7", 0.0),
]
DAPO = [
    ("so we get 5.\nAnswer: $5$", "5", 1.0),
    (r"Answer:  $\frac12$", r"\frac{1}{2}", 1.0),
    ("Answer: 1,000 dollars", "1000", 1.0),
    ("Answer: x = 4", "4", 1.0),
    (r"Answer: \boxed{7}", "7", 1.0),
    ("I think it is 5", "5", -1.0),
    ("Answer: 6", "5", -1.0),
]


@pytest.mark.parametrize(
    ("source", "solution", "truth", "expected"),
    [("openai/gsm8k", *case) for case in GSM8K]
    + [(source, *case) for case in MATH for source in MATH_SOURCES]
    + [(source, *case) for case in DAPO for source in DAPO_SOURCES],
)
def test_scores_equal_verls_and_the_worked_value(source: str, solution: str, truth: str, expected: float) -> None:
    assert verl_score(source, solution, truth) == expected  # the table is right about verl
    assert kuberl_score(source, solution, truth) == expected


PIECES = [
    "\\boxed{", "\\boxed ", "\\fbox{", "}", "{", "\\frac", "\\dfrac", "\\sqrt", "1", "2", "72", "0", "/", " ", ".",
    ",", "=", "-", "$", "\\$", "\\text{ ", "\\text{", "\\%", "\\!", "\\left(", "\\right)", "^\\circ", "####", "#### ",
    "Answer:", "answer: ", "\n", "x", "a ", "an ", "dollars", "\\overline{", "\\\\", "\\\\\\\\%",
]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(source=st.sampled_from(["openai/gsm8k", *MATH_SOURCES, *DAPO_SOURCES]), solution=texts, truth=texts)
def test_fuzzed_answers_score_as_verl_scores_them(source: str, solution: str, truth: str) -> None:
    assert kuberl_score(source, solution, truth) == verl_score(source, solution, truth)


def test_math_dapo_reports_accuracy_and_its_prediction_beside_its_plus_minus_one_score() -> None:
    right = score_safely(by_data_source, "Answer: 5", verl_layout("math_dapo", "5"))
    wrong = score_safely(by_data_source, "so x = 4 dollars\nAnswer: x = 4 dollars", verl_layout("math_dapo", "5"))
    assert (right.score, right.metrics, right.pred) == (1.0, {"acc": 1.0}, "5")
    assert (wrong.score, wrong.metrics, wrong.pred) == (-1.0, {"acc": 0.0}, "4")
    verl_wrong = verl.default_compute_score("math_dapo", "so x = 4 dollars\nAnswer: x = 4 dollars", "5")
    assert (verl_wrong["acc"], verl_wrong["pred"]) == (False, "4")


@pytest.mark.parametrize("source", ["openai/gsm8k", *MATH_SOURCES])
def test_a_number_as_ground_truth_never_matches_the_answers_text_as_in_verl(source: str) -> None:
    # a JSONL file may hold 72 rather than "72": verl compares the extracted text with the number as it is
    solution = "#### 72" if source == "openai/gsm8k" else r"\boxed{72}"
    assert verl.default_compute_score(source, solution, 72) == 0.0
    result = score_safely(by_data_source, solution, verl_layout(source, 72))
    assert (result.score, result.error) == (0.0, None)


@pytest.mark.parametrize("source", DAPO_SOURCES)
def test_a_number_as_ground_truth_fails_the_sample_where_verl_raises(source: str) -> None:
    with pytest.raises(AttributeError):  # verl's normalize_final_answer(72): 72.split
        verl.default_compute_score(source, "Answer: 72", 72)
    result = score_safely(by_data_source, "Answer: 72", verl_layout(source, 72))
    assert result.score == 0.0 and result.error is not None and "is a int, not a string" in result.error
    with pytest.raises(TypeError):  # "\\boxed{" + 72
        verl.math_verify_compute_score("72", 72)
    failed = score_safely(symbolic.math_verify, "72", {"answer": 72})
    assert failed.error is not None and "is a int, not a string" in failed.error


def test_an_unknown_data_source_fails_the_sample_naming_the_known_ones() -> None:
    result = score_safely(by_data_source, "#### 72", verl_layout("my/dataset", "72"))
    assert result.error is not None and "my/dataset" in result.error and "openai/gsm8k" in result.error


def test_the_math_builtins_read_verls_ground_truth_as_they_read_answer() -> None:
    verl_record = verl_layout("openai/gsm8k", "1200")
    kuberl_record = {"prompt": "...", "answer": "1200"}
    for reward in (math_exact, math_numeric, symbolic.math_verify):
        assert reward("The total is $1,200.", verl_record) == reward("The total is $1,200.", kuberl_record) == 1.0


@pytest.mark.parametrize(
    ("completion", "truth", "expected"),
    [
        (r"so $\boxed{\frac{2}{4}}$", "0.5", 1.0),
        ("the answer is 1/2", r"\frac{1}{2}", 1.0),
        (r"$\boxed{x + 1}$", "1 + x", 1.0),
        (r"\boxed{[1, 2)}", r"[1,2)", 1.0),
        (r"\boxed{3}", "4", 0.0),
        ("no answer", "4", 0.0),
    ],
)
def test_math_verify_compares_answers_as_mathematics(completion: str, truth: str, expected: float) -> None:
    assert symbolic.math_verify(completion, {"answer": truth}) == expected
