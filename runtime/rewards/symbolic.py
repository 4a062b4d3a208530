"""`reward.function: math_verify`: answers compared as mathematics, with Hugging Face's Math-Verify.

Where math_exact compares strings and math_numeric numbers, math_verify parses both sides (LaTeX or a
plain expression) into sympy and compares them symbolically: `\\frac{1}{2}`, `0.5` and `1/2` agree, so
do `x+1` and `1+x`, and intervals, sets and matrices. It follows verl's optional
verl/utils/reward_score/math_verify.py (verl b178a3cd): the ground truth is wrapped in `\\boxed{}` and parsed
as LaTeX; the completion is parsed as an expression or LaTeX (its last boxed or final answer). Score 1.0 or 0.0.

A ground truth that is not a string (a number in a JSONL file) fails the sample, naming its type, as verl's
raises when it joins `"\\boxed{" + ground_truth + "}"`: write the answers as strings. (kuberl's math_exact and
math_numeric read any answer as its text; verl's by_data_source scorers are in verl_scorers.py.)

Math-Verify's own time limits use SIGALRM, which works only on a process's main thread; they are off
here, and a reward call that runs long is bounded by the reward worker instead.
"""

from typing import Any

from kuberl.runtime.rewards.sample import require_ground_truth


def math_verify(completion: str, sample: dict[str, Any]) -> float:
    r"""1.0 when the completion's answer equals the expected answer mathematically, else 0.0.

    >>> math_verify(r"so the answer is $\boxed{0.5}$", {"answer": r"\frac{1}{2}"})
    1.0
    >>> math_verify("It is 3/4", {"reward_model": {"ground_truth": "0.75"}}), math_verify("It is 3", {"answer": "4"})
    (1.0, 0.0)
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    truth = require_ground_truth(sample)
    if not isinstance(truth, str):
        raise TypeError(
            f"ground truth {truth!r} is a {type(truth).__name__}, not a string; verl's math_verify cannot use it "
            "either (write the answers as strings)"
        )
    gold = parse(
        "\\boxed{" + truth + "}",
        extraction_config=(LatexExtractionConfig(),),
        parsing_timeout=None,  # type: ignore[arg-type]
    )
    predicted = parse(
        completion,
        extraction_config=(ExprExtractionConfig(), LatexExtractionConfig()),
        parsing_timeout=None,  # type: ignore[arg-type]
    )
    if not gold or not predicted:
        return 0.0
    return 1.0 if verify(gold, predicted, timeout_seconds=None) else 0.0
