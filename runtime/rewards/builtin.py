"""Reward functions that ship with kuberl, named in a manifest as `reward.function: NAME`.

A reward function is pure: `(completion, sample) -> score` or `-> (score, metrics)`, where
`completion` is the generated text (prompt excluded) and `sample` the prompt's raw data record
(its expected answer and whatever else the dataset carries). No I/O, no clock, no globals, so a
reward can be replayed and table-tested. The examples in the docstrings run as doctests.

The expected answer is the record's `answer`, or verl's `reward_model.ground_truth` (rewards/sample.py),
so kuberl's and verl's data layouts score alike. `by_data_source` applies verl's default scorer of each
sample's `data_source` (rewards/verl_scorers.py); `math_verify` compares answers symbolically
(rewards/symbolic.py).

Answer extraction (math_exact, math_numeric) takes the completion's final answer from, in
order: the last `\\boxed{...}`, the text after the last `####` (GSM8K), the last
`<answer>...</answer>`, and otherwise the last number in the text. The reference answer in
`sample["answer"]` goes through the same extraction when it carries a `\\boxed{}` or `####`
marker (so GSM8K's full solutions work as they are), and is used verbatim otherwise.
"""

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from kuberl.runtime.rewards.sample import require_ground_truth
from kuberl.runtime.rewards.symbolic import math_verify
from kuberl.runtime.rewards.verl_scorers import by_data_source

#: What a reward function looks like: a score, (score, metrics), or verl's {"score": ..., name: value, "pred": ...};
#: `kuberl.runtime.rewards.functions.score_safely` checks what it returns.
RewardFn = Callable[[str, dict[str, Any]], float | tuple[float, dict[str, float]] | dict[str, Any]]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_CLOSES_ANSWER_OPENS = re.compile(r"</think>\s*<answer>")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_NUMERIC = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}`, nested braces included; None if there is none.

    >>> last_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{3}{4}}")
    '\\\\frac{3}{4}'
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for position in range(begin, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            if depth == 0:
                return text[begin:position]
            depth -= 1
    return None  # unbalanced: the model stopped mid-box


def extract_final_answer(text: str) -> str | None:
    """The final answer of a solution: boxed, then after ####, then <answer>, then the last number.

    >>> extract_final_answer("3 apples and 4 pears, 7 in all. #### 7")
    '7'
    >>> extract_final_answer("<answer> 1,000 </answer>")
    '1,000'
    >>> extract_final_answer("no digits here") is None
    True
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        after = text.rsplit("####", 1)[1].strip()
        return after.splitlines()[0].strip() if after else None
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return str(tags[-1]).strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


def normalise_answer(answer: str) -> str:
    """Strips whitespace, commas, dollar signs and a trailing period.

    >>> normalise_answer(" $1,234. ")
    '1234'
    """
    return answer.strip().replace(",", "").replace("$", "").strip().rstrip(".").strip()


def parse_number(answer: str) -> float | None:
    """A number from an answer: integers, decimals, thousands separators, a/b and \\frac{a}{b}; None otherwise.

    >>> parse_number("1,234.5"), parse_number("3/4"), parse_number(r"\\frac{1}{8}"), parse_number("twelve")
    (1234.5, 0.75, 0.125, None)
    """
    text = normalise_answer(answer).replace(" ", "").rstrip("%")
    text = _FRAC.sub(r"\1/\2", text)
    try:
        if "/" in text:
            numerator, denominator = text.split("/", 1)
            if not (_NUMERIC.fullmatch(numerator) and _NUMERIC.fullmatch(denominator)):
                return None
            return float(Fraction(numerator) / Fraction(denominator))
        # fullmatch first: float() alone would also accept "nan", "inf" and "1_000".
        return float(text) if _NUMERIC.fullmatch(text) else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def reference_answer(sample: dict[str, Any]) -> str:
    """The expected answer of a record (`answer`, else `reward_model.ground_truth`), extracted from a worked solution.

    >>> reference_answer({"answer": "3 + 4 = 7 #### 7"}), reference_answer({"reward_model": {"ground_truth": "72"}})
    ('7', '72')
    """
    answer = str(require_ground_truth(sample))
    if "####" in answer or "\\boxed{" in answer:
        return extract_final_answer(answer) or answer
    return answer


def math_exact(completion: str, sample: dict[str, Any]) -> float:
    """1.0 if the completion's final answer equals the reference as a normalised string, else 0.0.

    >>> math_exact("Half of 14 is 7, so \\\\boxed{7}.", {"answer": "7"})
    1.0
    >>> math_exact("The total is $1,200.", {"answer": "1200"})
    1.0
    >>> math_exact("It is 7.0", {"answer": "7"})
    0.0
    """
    predicted = extract_final_answer(completion)
    if predicted is None:
        return 0.0
    return 1.0 if normalise_answer(predicted) == normalise_answer(reference_answer(sample)) else 0.0


def math_numeric(completion: str, sample: dict[str, Any]) -> float:
    """1.0 if the completion's final answer equals the reference as a number (relative tolerance 1e-6), else 0.0.

    >>> math_numeric("It is 7.0", {"answer": "7"})
    1.0
    >>> math_numeric("<answer>3/4</answer>", {"answer": "0.75"})
    1.0
    >>> math_numeric("about 0.76", {"answer": "3/4"})
    0.0
    """
    predicted = extract_final_answer(completion)
    if predicted is None:
        return 0.0
    got, expected = parse_number(predicted), parse_number(reference_answer(sample))
    if got is None or expected is None:
        return 0.0
    return 1.0 if math.isclose(got, expected, rel_tol=1e-6) else 0.0


def format_answer_tag(completion: str, sample: dict[str, Any]) -> float:
    """1.0 if the completion is `<think>...</think>` then `<answer>...</answer>` (whitespace around allowed).

    >>> format_answer_tag("<think>2+2</think>\\n<answer>4</answer>", {})
    1.0
    >>> format_answer_tag("<answer>4</answer>", {})
    0.0

    The same language as the regular expression `\\s*<think>.*?</think>\\s*<answer>.*?</answer>\\s*` (DOTALL,
    fullmatch), decided in linear time: that expression backtracks over every `</think>` x `</answer>` pair,
    so a degenerate completion of a megabyte took minutes. Here: the text, stripped, opens with <think> and
    closes with </answer>, and between them some </think> is followed, after whitespace, by <answer>.
    """
    text = completion.strip()
    opening, closing = "<think>", "</answer>"
    if len(text) < len(opening) + len(closing) or not (text.startswith(opening) and text.endswith(closing)):
        return 0.0
    middle = text[len(opening) : len(text) - len(closing)]
    return 1.0 if _THINK_CLOSES_ANSWER_OPENS.search(middle) else 0.0


def tiny_task(completion: str, sample: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The demo task: continue "count: 3 4 5" with exactly "6 7 8", then stop.

    score = (expected numbers matched position by position) / max(words written, numbers expected):
    each right number earns its share, and every word beyond the expected ones dilutes it, so only
    the right three numbers and nothing after them score 1. The metrics split the two lessons:
    `matched_share` (the right numbers) and `extra_words` (not stopping).

    >>> tiny_task(" 6 7 8", {"answer": "6 7 8"})
    (1.0, {'matched_share': 1.0, 'extra_words': 0.0})

    Counting on past the answer: 3 matches over 5 words.

    >>> tiny_task(" 6 7 8 9 10", {"answer": "6 7 8"})
    (0.6, {'matched_share': 1.0, 'extra_words': 2.0})

    Stopping early, with a wrong second number: 1 match over the 3 expected.

    >>> tiny_task(" 6 9", {"answer": "6 7 8"})
    (0.3333333333333333, {'matched_share': 0.3333333333333333, 'extra_words': 0.0})
    """
    words = completion.split()
    expected = reference_answer(sample).split()
    matched = sum(1 for got, want in zip(words, expected, strict=False) if got == want)
    score = matched / max(len(words), len(expected), 1)
    matched_share = matched / len(expected) if expected else 0.0
    return score, {"matched_share": matched_share, "extra_words": float(max(0, len(words) - len(expected)))}


#: The built-in rewards by manifest name; the keys equal `kuberl.api.spec.BUILTIN_REWARDS` (a test checks).
BUILTIN_REWARDS: dict[str, RewardFn] = {
    "math_exact": math_exact,
    "math_numeric": math_numeric,
    "format_answer_tag": format_answer_tag,
    "tiny_task": tiny_task,
    "by_data_source": by_data_source,
    "math_verify": math_verify,
}

#: Built-ins that compare with the record's expected answer: a record without one stops the job at start.
NEEDS_GROUND_TRUTH = frozenset({"math_exact", "math_numeric", "tiny_task", "by_data_source", "math_verify"})
