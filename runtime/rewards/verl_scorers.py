"""verl's default rule-based scorers, chosen per sample by its `data_source` (`reward.function: by_data_source`).

verl scores a sample of its preprocessed data with `default_compute_score(data_source, solution_str,
ground_truth)` (verl/utils/reward_score/__init__.py) when no custom reward is given. This module gives
the same scores as verl at commit b178a3cd (2026-01-29) for the math sources:

- openai/gsm8k (verl's gsm8k.py, strict): 1.0 when the number after the last `#### ` in the response's
  last 300 characters, less commas and `$`, equals the ground truth; else 0.0.
- lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500 (math_reward.py): 1.0 when the
  last `\\boxed{}` equals the ground truth after Hendrycks' MATH normalisation; else 0.0.
- math_dapo, math, math_dapo_reasoning, aime* (math_dapo.py): +1.0 when the last `Answer: ...` line in the
  response's last 300 characters equals the ground truth after Minerva's normalisation; else -1.0; with verl's
  `acc` (1 or 0, logged as a metric) and `pred` (the normalised answer, which validation's majority vote reads).

A ground truth that is not a string (a number in a JSONL file) is used as it is, as verl uses it: gsm8k and MATH
compare it with the extracted text and never match (0.0), math_dapo cannot normalise it and the sample fails,
naming the type (verl raises there). A data source without a scorer is refused when the job starts
(rewards/checks.py) instead of raising NotImplementedError on the first sample. verl's code scorers (sandbox),
prime_math (numina_*), geo3k and search-R1 sources are not here: name a reward function for them.
The comparison tests hold every scorer to a plain restatement of verl's on a table of cases
(tests/unit/runtime/rewards/test_verl_scorers.py, tests/unit/runtime/rewards/verl_reward_reference.py).
"""

import re
from collections.abc import Callable
from typing import Any

from kuberl.runtime.rewards.sample import data_source, require_ground_truth

#: verl scores only the end of a response: regular expressions on long text are slow, answers come last.
TAIL_CHARS = 300

Scorer = Callable[[str, Any], float | dict[str, Any]]


# ---------------------------------------------------------------------------------------------- gsm8k

_GSM8K_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k(solution: str, truth: Any) -> float:
    """verl's gsm8k scorer, strict: the number after the last `#### `, less commas and dollar signs.

    >>> gsm8k("4 + 3 = 7 apples. #### 7", "7"), gsm8k("so 1,200 #### 1,200", "1200"), gsm8k("it is 7", "7")
    (1.0, 1.0, 0.0)
    """
    found = _GSM8K_FINAL.findall(solution[-TAIL_CHARS:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == truth else 0.0


# ----------------------------------------------------------------------- MATH (Hendrycks et al. 2021)


def last_boxed_span(text: str) -> str | None:
    """The last `\\boxed{...}` (or `\\fbox{...}`) with its braces; `\\boxed X` up to a `$`; None if there is none."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if text[position] == "}" and depth == 0:
            return text[start : position + 1]
    return None


def boxed_content(span: str) -> str | None:
    """What a `last_boxed_span` holds; None for a span it cannot open (an `\\fbox`)."""
    if "\\boxed " in span:
        return span[len("\\boxed ") :] if span.startswith("\\boxed ") else None
    if span.startswith("\\boxed{") and span.endswith("}"):
        return span[len("\\boxed{") : -1]
    return None


def _shorthand_fracs(text: str) -> str:
    r"""\frac12 -> \frac{1}{2}, \frac1{7} -> \frac{1}{7}; raises IndexError on a bare trailing \frac."""
    head, *rest = text.split("\\frac")
    out = [head]
    for part in rest:
        if part[0] == "{":
            out.append("\\frac" + part)
        elif len(part) < 2:
            return text
        elif part[1] == "{":
            out.append("\\frac{" + part[0] + "}" + part[1:])
        else:
            out.append("\\frac{" + part[0] + "}{" + part[1] + "}" + part[2:])
    return "".join(out)


def _shorthand_sqrts(text: str) -> str:
    r"""\sqrt3 -> \sqrt{3}; raises IndexError on a bare trailing \sqrt."""
    head, *rest = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]) for part in rest)


def _integer_slash(text: str) -> str:
    """`3/4` with plain integers -> \\frac{3}{4}; anything else unchanged."""
    parts = text.split("/")
    if len(parts) != 2 or not all(re.fullmatch(r"-?\d+", part) for part in parts):
        return text
    numerator, denominator = (int(part) for part in parts)
    return f"\\frac{{{numerator}}}{{{denominator}}}" if text == f"{numerator}/{denominator}" else text


#: Literal removals and replacements of the MATH normalisation, in order.
_MATH_REPLACEMENTS = (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
)


def normalise_math(text: str) -> str:
    r"""Hendrycks' MATH normalisation (lm-evaluation-harness, as verl's math.py applies it).

    >>> normalise_math(r"\dfrac{1}{2}"), normalise_math("0.5"), normalise_math("x = 3"), normalise_math(r"\frac12")
    ('\\frac{1}{2}', '\\frac{1}{2}', '3', '\\frac{1}{2}')
    """
    for before, after in _MATH_REPLACEMENTS:
        text = text.replace(before, after)
    if "\\text{ " in text:  # units on the right
        parts = text.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit")
        text = parts[0]
    text = text.replace("\\\\%", "").replace("\\%", "")  # percent signs: \\% (as verl's math_reward.py) and \%
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3", "k=4"
        text = sides[1]
    text = _shorthand_fracs(_shorthand_sqrts(text).replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _integer_slash(text)


def math_equivalent(answer: str, truth: Any) -> bool:
    """Equal after normalise_math; equal as written when normalising fails on either (verl catches every error
    there: a ground truth that is not a string is compared as it is, and never equals the answer's text)."""
    try:
        return normalise_math(answer) == normalise_math(truth)
    except (ValueError, IndexError, AttributeError, TypeError):
        return bool(answer == truth)


def hendrycks_math(solution: str, truth: Any) -> float:
    r"""verl's MATH scorer: 1.0 when the last boxed answer is equivalent to the ground truth.

    >>> hendrycks_math(r"so the answer is $\boxed{\dfrac{1}{2}}$", "0.5"), hendrycks_math("1/2", "1/2")
    (1.0, 0.0)
    """
    span = last_boxed_span(solution)
    answer = None if span is None else boxed_content(span)
    return 1.0 if answer is not None and math_equivalent(answer, truth) else 0.0


# ------------------------------------------------------------------------ DAPO (Minerva normalisation)

_MINERVA_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_MINERVA_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
#: (pattern, replacement) applied in order: keep what is inside $...$, \text{}, \textbf{}, \overline{}, \boxed{};
#: then \fracab -> \frac{a}{b} and \sqrta -> \sqrt{a}.
_MINERVA_PATTERNS = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def normalise_minerva(answer: str) -> str:
    r"""The normalisation of Minerva (Lewkowycz et al. 2022) that verl's math_dapo.py applies.

    >>> normalise_minerva("x = 1,000 dollars"), normalise_minerva(r"\boxed{\frac12}"), normalise_minerva("$5$")
    ('1000', '\\frac{1}{2}', '5')
    """
    answer = answer.split("=")[-1]
    for before, after in _MINERVA_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for removed in _MINERVA_REMOVED:
        answer = answer.replace(removed, "")
    for pattern, replacement in _MINERVA_PATTERNS:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def math_dapo(solution: str, truth: Any) -> dict[str, Any]:
    """verl's DAPO math scorer: +1 when the last `Answer: ...` equals the ground truth (both normalised), else -1;
    as verl's, a dict with `acc` (1 or 0) and `pred` (the normalised answer). A ground truth that is not a string
    fails, as verl's raises.

    >>> math_dapo("... so we get 5.\\nAnswer: $5$", "5"), math_dapo("I think 5", "5")
    ({'score': 1.0, 'acc': 1.0, 'pred': '5'}, {'score': -1.0, 'acc': 0.0, 'pred': '[INVALID]'})
    """
    if not isinstance(truth, str):
        raise TypeError(
            f"ground truth {truth!r} is a {type(truth).__name__}, not a string; verl's math_dapo scorer cannot "
            "normalise it either (write the answers as strings)"
        )
    found = _ANSWER_LINE.findall(solution[-TAIL_CHARS:])
    predicted = normalise_minerva(found[-1] if found else "[INVALID]")
    correct = predicted == normalise_minerva(truth)
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": predicted}


# ------------------------------------------------------------------------------------------- dispatch

#: data_source -> scorer, as verl's default_compute_score chooses; `aime*` is matched by prefix.
DATA_SOURCE_SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": gsm8k,
    "lighteval/MATH": hendrycks_math,
    "DigitalLearningGmbH/MATH-lighteval": hendrycks_math,
    "HuggingFaceH4/MATH-500": hendrycks_math,
    "math_dapo": math_dapo,
    "math": math_dapo,
    "math_dapo_reasoning": math_dapo,
}
PREFIX_SCORERS: dict[str, Scorer] = {"aime": math_dapo}


def scorer_for(source: str | None) -> Scorer | None:
    """The scorer of a data source; None when verl's defaults have none that kuberl carries."""
    if source is None:
        return None
    if source in DATA_SOURCE_SCORERS:
        return DATA_SOURCE_SCORERS[source]
    return next((scorer for prefix, scorer in PREFIX_SCORERS.items() if source.startswith(prefix)), None)


def known_sources() -> str:
    return ", ".join([*DATA_SOURCE_SCORERS, *(f"{prefix}*" for prefix in PREFIX_SCORERS)])


def by_data_source(completion: str, sample: dict[str, Any]) -> float | dict[str, Any]:
    """verl's default reward: the scorer of the sample's data_source against reward_model.ground_truth (as it is).

    >>> by_data_source("#### 72", {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}})
    1.0
    """
    source = data_source(sample)
    scorer = scorer_for(source)
    if scorer is None:
        raise ValueError(f"no built-in scorer for data_source {source!r}; known: {known_sources()}")
    return scorer(completion, require_ground_truth(sample))
