"""Reading a verl launch: a shell script or one command line, down to its Hydra overrides.

    overrides = read_launch(text)     # {"algorithm.adv_estimator": "grpo", "data.train_batch_size": 1024, ...}

verl's examples (`examples/**/*.sh`) are bash: variables set at the top (`gsm8k_train=$HOME/data/...`,
`export VAR=...`, `VAR=${VAR:-default}`), then `python3 -m verl.trainer.main_ppo key=value ... $@` over
backslash-continued lines. This reads exactly that much bash: assignments (with `$VAR`, `${VAR}`,
`${VAR:-default}`, `${VAR-default}` and integer `$((arithmetic))` expanded from the script and then the
environment given), line continuations, quotes, comments, and the first command that runs a verl trainer
module. Command substitution (`$(...)`) is not run; its text stays as written.

Override values are read as Hydra reads them: true/false (any case), null, ints, floats, `[a, b]` lists
(items quoted or bare), and strings; `+key=value` and `++key=value` add or force a key as plain `key=value`.
"""

import ast
import operator
import re
import shlex
from collections.abc import Mapping
from typing import Any


class LaunchError(ValueError):
    """A launch that cannot be read; the message says what was expected."""


#: `-m` and a module that starts verl's PPO-family trainer (the recipes reuse its config).
TRAINER_MODULE = re.compile(r"-m (verl\.trainer\.main_\w+|recipe\.[\w.]*main_\w+)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=", re.S)
_BARE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def logical_lines(text: str) -> list[str]:
    """The script's lines with backslash continuations joined and whole-line comments dropped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def expand(text: str, variables: Mapping[str, str], unresolved: set[str] | None = None) -> str:
    """`$VAR`, `${VAR}`, `${VAR:-default}` (defaults may nest) expanded; an unknown variable stays as written
    and its name goes into `unresolved`.

    >>> missing = set()
    >>> expand('${A:-"${B}/x"} $B ${C} $D', {"B": "/b"}, missing), sorted(missing)
    ('"/b/x" /b ${C} $D', ['C', 'D'])
    """
    unresolved = set() if unresolved is None else unresolved
    out, position = [], 0
    while position < len(text):
        if text.startswith("$((", position):
            end = _arithmetic_end(text, position + 3)
            if end is not None:
                value = arithmetic(text[position + 3 : end], variables)
                if value is None:
                    unresolved.add(text[position : end + 2])
                out.append(value or text[position : end + 2])
                position = end + 2
                continue
        if text.startswith("${", position):
            end, depth = position + 2, 1
            while end < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
            out.append(_braced(text[position + 2 : end - 1], variables, unresolved) if depth == 0 else text[position:])
            position = end
            continue
        bare = _BARE.match(text, position)
        if bare:
            if bare.group(1) not in variables:
                unresolved.add(bare.group(1))
            out.append(variables.get(bare.group(1), bare.group(0)))
            position = bare.end()
            continue
        out.append(text[position])
        position += 1
    return "".join(out)


def _arithmetic_end(text: str, start: int) -> int | None:
    """Where the `))` closing a `$((` opened before `start` begins; None when it is not closed."""
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "(":
            depth += 1
        elif text[position] == ")":
            if depth == 0:
                return position if text.startswith("))", position) else None
            depth -= 1
    return None


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash divides integers
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def arithmetic(expression: str, variables: Mapping[str, str]) -> str | None:
    """bash's `$((expression))` on integers: + - * / % ** and parentheses, names read from `variables`.

    None when it is anything else (the text then stays as written).

    >>> arithmetic("(max_prompt + 1024 * 2) / 2", {"max_prompt": "2048"}), arithmetic("RANDOM % 5", {})
    ('2048', None)
    """
    expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expression)
    try:
        tree = ast.parse(expanded.strip(), mode="eval").body
        return str(_evaluate(tree, variables))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _evaluate(node: ast.expr, variables: Mapping[str, str]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in variables:
        return _evaluate(ast.parse(variables[node.id].strip() or "0", mode="eval").body, variables)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, variables)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _evaluate(node.left, variables), _evaluate(node.right, variables)
        return int(_ARITHMETIC[type(node.op)](left, right))
    raise ValueError(f"not integer arithmetic: {ast.dump(node)}")


_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+?])(.*))?", re.S)


def _braced(inner: str, variables: Mapping[str, str], unresolved: set[str]) -> str:
    """`${NAME}` and bash's `${NAME:-word}`, `${NAME:=word}`, `${NAME:+word}`, `${NAME:?}` (and the forms
    without `:`, which test for unset rather than empty); `${@}` and `${*}` are the script's arguments: none.
    Any other form (`${#NAME}`, `${NAME/a/b}`) is not read: it stays as written, unresolved.

    >>> missing = set()
    >>> [_braced(inner, {"E": "", "S": "s"}, missing) for inner in ("S", "E:-d", "E-d", "S:+alt", "E:+alt", "@")]
    ['s', 'd', '', 'alt', '', '']
    >>> _braced("#S", {"S": "s"}, missing), sorted(missing)
    ('${#S}', ['${#S}'])
    """
    if inner in ("@", "*"):
        return ""
    match = _BRACED.fullmatch(inner)
    if match is None:
        unresolved.add("${" + inner + "}")
        return "${" + inner + "}"
    name, operator, word = match.groups()
    value = variables.get(name)
    is_set = value is not None and (value != "" or not operator or not operator.startswith(":"))
    if operator is None or (operator[-1] == "?" and is_set):
        if value is None:
            unresolved.add(name)
        return "${" + inner + "}" if value is None else value
    if operator[-1] in "-=":
        return value if is_set and value is not None else expand(word, variables, unresolved)
    if operator[-1] == "+":
        return expand(word, variables, unresolved) if is_set else ""
    unresolved.add(name)  # ${NAME:?message} with NAME unset: bash stops the script here
    return "${" + inner + "}"


def _words(line: str, variables: Mapping[str, str], unresolved: set[str] | None = None) -> list[str]:
    """A line's words as bash would split them: variables expanded outside single quotes, then shlex."""
    runs = _quoted_runs(line)
    expanded = "".join(text if single else expand(text, variables, unresolved) for text, single in runs)
    try:
        return shlex.split(expanded, comments=True)
    except ValueError as error:
        raise LaunchError(f"cannot split {line[:80]!r} into words ({error})") from error


def _quoted_runs(line: str) -> list[tuple[str, bool]]:
    """The line cut into runs, each marked True when bash would not expand it (inside '...' outside "...")."""
    runs: list[tuple[str, bool]] = []
    current, single, double = "", False, False
    for char in line:
        if char == "'" and not double:
            runs.append((current + char, single) if single else (current, False))
            current, single = ("", False) if single else (char, True)
            continue
        if char == '"' and not single:
            double = not double
        current += char
    runs.append((current, single))
    return runs


def read_launch(text: str, environment: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Hydra overrides of the script's (or command line's) verl trainer command, values parsed."""
    variables = dict(environment or {})
    for line in logical_lines(text):
        unresolved: set[str] = set()
        words = _words(line, variables, unresolved)
        if words and words[0] in ("export", "declare", "local", "readonly"):
            words = [word for word in words[1:] if not word.startswith("-")]
        if words and all(_ASSIGNMENT.match(word) for word in words):  # VAR=x [OTHER=y]: assignments only
            for word in words:
                name, _, value = word.partition("=")
                variables[name] = value
            continue
        arguments = trainer_arguments(words)
        if arguments is not None:
            passed = " ".join(arguments)  # not the launcher's own options (ray job submit --working-dir $PWD ...)
            unresolved = {
                name
                for name in unresolved
                if (name in passed if name.startswith("$") else re.search(rf"\$\{{?{name}\b", passed))
            }
            if unresolved:
                names = ", ".join(sorted(unresolved))
                raise LaunchError(
                    f"the verl command reads shell variables the script does not set: {names}; "
                    "export them, or pass each as --env NAME=VALUE"
                )
            return parse_overrides(arguments)
    raise LaunchError(
        "no verl trainer command found: expected a line running `python3 -m verl.trainer.main_ppo key=value ...` "
        "(or a recipe's main module)"
    )


def trainer_arguments(words: list[str]) -> list[str] | None:
    """The words after `-m <verl trainer module>`; None when the words run something else."""
    for position in range(len(words) - 1):
        if TRAINER_MODULE.fullmatch(" ".join(words[position : position + 2])):
            return words[position + 2 :]
    return None


def parse_overrides(words: list[str]) -> dict[str, Any]:
    """`key=value` words as {key: value}; `$@`, redirections and words without `=` are skipped. Of the options,
    `--config-name` is kept (as the key `--config-name`: it picks verl's defaults); the others are skipped."""
    overrides: dict[str, Any] = {}
    option = ""
    for word in words:
        if option:
            if option == "--config-name":
                overrides[option] = word
            option = ""
            continue
        if word in ("$@", '"$@"', "$*") or word.startswith(("|", ">", "2>", "&")):
            continue
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            if name == "--config-name" and equals:
                overrides[name] = value
            option = "" if equals else name
            continue
        if "=" not in word:
            continue
        key, _, raw = word.partition("=")
        if raw.startswith("[") and not raw.endswith("]"):  # [a, b] unquoted: bash cut it at the space
            raise LaunchError(
                f"{key}={raw}: the list is cut at a space, so Hydra would refuse it too; quote the whole value, "
                f'as verl\'s examples do: {key}="[a, b]"'
            )
        overrides[key.lstrip("+~")] = hydra_value(raw)
    return overrides


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
