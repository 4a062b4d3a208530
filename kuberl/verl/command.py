"""Reading a verl launch: a shell script or one command line, down to its Hydra overrides.

    overrides = read_launch(text)     # {"algorithm.adv_estimator": "grpo", "data.train_batch_size": 1024, ...}

verl's examples (`examples/**/*.sh`) are bash: variables set at the top (`gsm8k_train=$HOME/data/...`,
`export VAR=...`, `VAR=${VAR:-default}`, `ENGINE=${1:-vllm}`, arrays of overrides), sometimes a test or a
function, then `python3 -m verl.trainer.main_ppo key=value ... "$@"`. The shell package reads the script as bash
would with no arguments, running nothing (kuberl/verl/shell/run.py says how far), up to the first command that
runs a verl trainer module, and this module reads that command's overrides.

A value the converter cannot know without running something (a variable set nowhere, `$(date)`, a value that
depends on a test it cannot decide) is refused when an override reads it, with the line and the assignments
it went through; it never reaches a manifest.

Override values are read as Hydra reads them: true/false (any case), null, ints, floats, `[a, b]` lists
(items quoted or bare), and strings; `+key=value` and `++key=value` add or force a key as plain `key=value`.
"""

import re
from collections.abc import Mapping
from typing import Any

from kuberl.verl.errors import LaunchError
from kuberl.verl.shell.run import Field, NotFound, UnknownWord, follow

__all__ = ["LaunchError", "hydra_value", "parse_overrides", "read_launch", "trainer_arguments"]

#: `-m` and a module that starts verl's PPO-family trainer (the recipes reuse its config).
TRAINER_MODULE = re.compile(r"verl\.trainer\.main_\w+|recipe\.[\w.]*main_\w+")


def read_launch(text: str, environment: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Hydra overrides of the script's (or command line's) verl trainer command, values parsed."""
    try:
        command = follow(text, dict(environment or {}), trainer_arguments)
    except NotFound as error:
        raise LaunchError(
            f"no verl trainer command found ({error}): expected a line running "
            "`python3 -m verl.trainer.main_ppo key=value ...` (or a recipe's main module)"
        ) from None
    return parse_overrides(list(command.arguments), command.line)


def trainer_arguments(fields: list[Field]) -> int | None:
    """Where the arguments start after `-m <verl trainer module>`; None when the words run something else."""
    for position in range(len(fields) - 1):
        module = fields[position + 1]
        if fields[position] == "-m" and isinstance(module, str) and TRAINER_MODULE.fullmatch(module):
            return position + 2
    return None


def parse_overrides(words: list[Field], line: int = 1) -> dict[str, Any]:
    """`key=value` words as {key: value}; redirections and words without `=` are skipped. Of the options,
    `--config-name` is kept (as the key `--config-name`: it picks verl's defaults); the others are skipped.
    A word the script leaves unknown is refused, naming it, unless it is the value of a skipped option."""
    overrides: dict[str, Any] = {}
    unknown: list[UnknownWord] = []
    option = ""
    for word in words:
        if option:
            if option == "--config-name":
                overrides[option] = _known(word, unknown)
            option = ""
            continue
        text = word.text if isinstance(word, UnknownWord) else word
        if text.startswith("--"):
            name, equals, value = text.partition("=")
            if name == "--config-name" and equals:
                overrides[name] = _known(word, unknown) and value
            option = "" if equals else name
            continue
        if "=" not in text:
            continue
        if isinstance(word, UnknownWord):
            unknown.append(word)
            continue
        key, _, raw = word.partition("=")
        if raw.startswith("[") and not raw.endswith("]"):  # [a, b] unquoted: bash cut it at the space
            raise LaunchError(
                f"{key}={raw}: the list is cut at a space, so Hydra would refuse it too; quote the whole value, "
                f'as verl\'s examples do: {key}="[a, b]"'
            )
        overrides[key.lstrip("+~")] = hydra_value(raw)
    if unknown:
        reasons = "\n".join(f"  {word.text}: {word.value}" for word in unknown)
        raise LaunchError(
            f"line {line}: the verl command reads values the converter cannot know without running the script:\n"
            f"{reasons}\nexport each variable named, or pass it as --env NAME=VALUE"
        )
    return overrides


def _known(word: Field, unknown: list[UnknownWord]) -> str:
    if isinstance(word, UnknownWord):
        unknown.append(word)
        return ""
    return word


def hydra_value(raw: str) -> Any:
    """A Hydra override value as Python: bool, None, int, float, list, or the string.

    >>> hydra_value("True"), hydra_value("null"), hydra_value("1e-6"), hydra_value("['a.parquet', b.parquet]")
    (True, None, 1e-06, ['a.parquet', 'b.parquet'])
    """
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [] if not inner else [hydra_value(item) for item in _split_list(inner)]
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _split_list(inner: str) -> list[str]:
    items, depth, quote, current = [], 0, "", ""
    for char in inner:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        current += char
    return [*items, current.strip()]
