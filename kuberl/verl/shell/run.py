"""Following a script's commands to the one the caller looks for, keeping every variable it sets, running nothing.

    found = follow(script, environment, is_wanted)     # the wanted command's words, expanded, and its line

The script's commands are taken in order (parse.py), as bash would take them with no arguments:
- assignments (`NAME=value`, `NAME+=value`, `NAME=(...)` arrays, `export`/`declare`/`local`/`readonly`), `unset`
  and `cd` (which moves $PWD) change the variables; `read`, `mapfile` and `readarray` leave what they set unknown;
- `if`/`elif`, `case`, `&&` and `||` take the branch their test decides (`[ ]`, `test`, `[[ ]]` and `(( ))` on
  known values, `true`, `false`); a test the converter cannot decide (a file test, an unknown value, another
  command's exit status) runs every branch on a copy, and a variable the branches leave different becomes
  unknown, naming the condition's line;
- a loop's body may run any number of times: what it sets becomes unknown;
- a function runs where it is called, with its arguments as $1...; `( ... )` and each part of a pipeline run on a
  copy of the variables (bash's subshells);
- `exit` ends the script; a branch that exits is left out of what follows it;
- every other command (`echo`, `python prepare.py`, `ray start`, `source file`, `eval`) is not run and changes
  nothing here: a command's success is assumed, as the script's author assumes it, except as an `if`'s condition.

The wanted command (the first whose words `is_wanted` accepts) ends the walk; found under a condition the
converter cannot decide, it is refused. Bounded: MAX_COMMANDS commands in all, functions MAX_CALLS deep, arrays of
MAX_ELEMENTS elements.
"""

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from kuberl.verl.shell.conditions import Operand, Status, Term, decide, is_operator
from kuberl.verl.shell.errors import ScriptError
from kuberl.verl.shell.expand import Expander, Unresolved, Value
from kuberl.verl.shell.parse import (
    AndOr,
    ArithmeticCommand,
    Case,
    Function,
    Group,
    If,
    Loop,
    Node,
    Pipeline,
    Sequence,
    Simple,
    Test,
    arithmetic_names,
    keyword,
    parse,
)
from kuberl.verl.shell.words import ArrayWord, Literal, Operator, Word, is_name

MAX_COMMANDS = 10_000
MAX_CALLS = 32
MAX_ELEMENTS = 10_000


@dataclass(frozen=True)
class UnknownWord:
    """A word of the wanted command whose value the converter cannot know: as written, and why."""

    text: str
    value: Unresolved


Field = str | UnknownWord


@dataclass(frozen=True)
class FoundCommand:
    fields: tuple[Field, ...]  # every word expanded (an unknown one stays one UnknownWord)
    start: int  # where the arguments start: the index `is_wanted` gave
    line: int

    @property
    def arguments(self) -> tuple[Field, ...]:
        return self.fields[self.start :]


#: Given a command's fields, the index where its arguments start when it is the wanted command, else None.
Wanted = Callable[[list[Field]], int | None]


class NotFound(ScriptError):
    """The script never reaches a command `is_wanted` accepts."""


def follow(script: str, environment: dict[str, str], is_wanted: Wanted) -> FoundCommand:
    """The first command `is_wanted` accepts, its words expanded (see the module docstring)."""
    runner = _Runner(dict(environment), is_wanted)
    try:
        runner.run(parse(script))
    except _Found as found:
        return found.command
    except _Exit as ended:
        raise NotFound("the script exits here", ended.line) from None
    except RecursionError:  # nested commands inside nested calls, past Python's stack
        raise ScriptError("commands and calls nest deeper than the converter reads", runner.line) from None
    raise NotFound("the script ends", script.count("\n") + 1)


# --------------------------------------------------------------------------------------------- signals


class _Found(Exception):
    def __init__(self, command: FoundCommand) -> None:
        self.command = command


class _Exit(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:\[(?P<index>[^\]]*)\])?(?P<append>\+?)=")
_DECLARATIONS = ("export", "declare", "typeset", "local", "readonly")
_READERS = ("read", "mapfile", "readarray")
_TESTS = ("[", "test", "true", "false", ":")


@dataclass
class _State:
    variables: dict[str, Value]
    functions: dict[str, Function]
    arguments: tuple[str, ...] | Unresolved


class _Runner:
    def __init__(self, variables: dict[str, Value], is_wanted: Wanted) -> None:
        self.expander = Expander(variables)
        self.functions: dict[str, Function] = {}
        self.is_wanted = is_wanted
        self.commands = 0
        self.calls = 0
        self.line = 1  # of the simple command being read
        self.undecided: list[str] = []  # the conditions around the current command that the converter cannot decide

    # ---------------------------------------------------------------------------------------- commands

    def run(self, node: Node) -> Status:
        if isinstance(node, Sequence):
            status: Status = True
            for command in node.commands:
                status = self.run(command)
            return status
        if isinstance(node, Simple):
            return self._simple(node)
        if isinstance(node, Pipeline):
            statuses = [self._on_copy(command, keep=False) for command in node.commands]
            last = statuses[-1]
            return (None if last is None else not last) if node.negated else last
        if isinstance(node, AndOr):
            return self._and_or(node)
        if isinstance(node, If):
            return self._if(list(node.clauses), node.otherwise, node.line)
        if isinstance(node, Case):
            return self._case(node)
        if isinstance(node, Loop):
            return self._loop(node)
        if isinstance(node, Group):
            return self._on_copy(node.body, keep=False) if node.subshell else self.run(node.body)
        if isinstance(node, Function):
            self.functions[node.name] = node
            return True
        if isinstance(node, Test):
            return self._double_bracket(node)
        return self._arithmetic_command(node)

    def _simple(self, node: Simple) -> Status:
        self.commands += 1
        self.line = node.line
        if self.commands > MAX_COMMANDS:
            raise ScriptError(f"the script runs more than {MAX_COMMANDS} commands before the one wanted", node.line)
        assignments = 0
        while assignments < len(node.words) and _is_assignment(node.words[assignments]):
            assignments += 1
        if assignments == len(node.words):
            for word in node.words:
                self._assign(word)
            return True
        fields = self._fields(node.words[assignments:])
        if not fields:  # the command's words expanded to nothing
            return True
        start = self.is_wanted(fields)
        if start is not None:
            self._found(FoundCommand(tuple(fields), start, node.line))
        name = fields[0] if isinstance(fields[0], str) else None
        arguments = node.words[assignments + 1 :]
        if name in _DECLARATIONS:
            return self._declare(name, arguments)
        if name == "unset":
            for field in fields[1:]:
                if isinstance(field, str) and not field.startswith("-"):
                    self.expander.variables.pop(field, None)
                    self.functions.pop(field, None)
            return True
        if name in ("cd", "pushd"):
            self._cd([field for field in fields[1:] if field not in ("-L", "-P", "--")], node.line)
            return True
        if name in _READERS:
            for field in fields[1:]:
                if isinstance(field, str) and is_name(field):
                    self.expander.variables[field] = Unresolved(f"${field} is read by {name}", node.line)
            return True
        if name == "exit":
            raise _Exit(node.line)
        if name in _TESTS:
            return self._test([field for field in fields[1:]], name, node.line)
        if name in self.functions:
            return self._call(self.functions[name], fields[1:], node.line)
        return True  # another command: not run, its success assumed

    def _found(self, command: FoundCommand) -> None:
        if self.undecided:
            raise ScriptError(
                f"the command runs only if {self.undecided[-1]}, which the converter cannot decide; give the values "
                "it tests (--env NAME=VALUE)",
                command.line,
            )
        raise _Found(command)

    def _fields(self, words: tuple[Word | ArrayWord, ...]) -> list[Field]:
        out: list[Field] = []
        for word in words:
            if isinstance(word, ArrayWord):  # an array assignment as an argument (declare -a A=(...)): as written
                out.append(word.text)
                continue
            fields = self.expander.fields(word)
            if isinstance(fields, Unresolved):
                out.append(UnknownWord(word.text, fields))
            else:
                out.extend(fields)
        return out

    # ------------------------------------------------------------------------------------- assignments

    def _assign(self, word: Word | ArrayWord) -> None:
        variables = self.expander.variables
        if isinstance(word, ArrayWord):
            elements: list[str] = []
            for element in word.elements:
                fields = self.expander.fields(element, after_equals=False)
                if isinstance(fields, Unresolved):
                    variables[word.name] = fields.through(word.name, word.line)
                    return
                elements.extend(fields)
            old = variables.get(word.name)
            if word.append and isinstance(old, Unresolved):
                return
            before: tuple[str, ...] = ()
            if word.append and isinstance(old, str):
                before = (old,)
            elif word.append and isinstance(old, tuple):
                before = old
            if len(before) + len(elements) > MAX_ELEMENTS:
                raise ScriptError(f"{word.name}: an array of more than {MAX_ELEMENTS} elements", word.line)
            variables[word.name] = (*before, *elements)
            return
        match = _ASSIGNMENT.match(word.parts[0].text)  # type: ignore[union-attr]
        assert match is not None
        name, index, append = match.group("name"), match.group("index"), match.group("append")
        value = self.expander.scalar(word)
        if isinstance(value, str):
            value = value[len(match.group(0)) :]  # the value after NAME=
        old = variables.get(name)
        if isinstance(value, Unresolved):
            variables[name] = value.through(name, word.line)
        elif isinstance(old, Unresolved) and (append or index is not None):
            variables[name] = old.through(name, word.line)
        elif index is not None:
            variables[name] = self._element(name, old, index, value, append == "+", word.line)
        elif append and isinstance(old, tuple):
            variables[name] = (old[0] + value, *old[1:]) if old else (value,)  # bash appends to element 0
        elif append:
            assert not isinstance(old, Unresolved | tuple)  # both handled above
            variables[name] = (old or "") + value
        else:
            variables[name] = value

    def _element(self, name: str, old: Value | None, index_text: str, value: str, append: bool, line: int) -> Value:
        """`NAME[i]=value`: i within the array or just past its end (bash's sparse arrays are not followed)."""
        elements = list((old,) if isinstance(old, str) else old or ())  # type: ignore[arg-type]
        index = self.expander.arithmetic(index_text, line)
        if isinstance(index, Unresolved):
            return index.through(name, line)
        if index < 0 or index > len(elements):
            return Unresolved(f"{name}[{index}]= leaves a gap in the array, which the converter does not follow", line)
        if index == len(elements):
            elements.append(value)
        else:
            elements[index] = elements[index] + value if append else value
        return tuple(elements)

    def _declare(self, builtin: str, words: tuple[Word | ArrayWord, ...]) -> Status:
        for word in words:
            if _is_assignment(word):
                self._assign(word)
            elif isinstance(word, Word):
                fields = self.expander.fields(word)
                for field in [] if isinstance(fields, Unresolved) else fields:
                    if is_name(field) and builtin != "export" and field not in self.expander.variables:
                        self.expander.variables[field] = ""  # declare NAME: set, empty
        return True

    def _cd(self, fields: list[Field], line: int) -> None:
        variables = self.expander.variables
        target = fields[0] if fields else variables.get("HOME")
        here = variables.get("PWD")
        if target == "-":
            target = variables.get("OLDPWD")
        if isinstance(target, str) and (target.startswith("/") or isinstance(here, str)):
            new: Value = os.path.normpath(os.path.join(here if isinstance(here, str) else "/", target))
        else:
            new = Unresolved("$PWD is where cd went, which the converter cannot tell", line)
        if here is not None:
            variables["OLDPWD"] = here
        variables["PWD"] = new

    # ----------------------------------------------------------------------------------------- branches

    def _and_or(self, node: AndOr) -> Status:
        status = self.run(node.first)
        for operator, command in node.rest:
            runs = status if operator == "&&" else (None if status is None else not status)
            if runs is True:
                status = self.run(command)
            elif runs is None:
                status = self._maybe(command, "the test before it", _line_of(command))
        return status

    def _if(self, clauses: list[tuple[Node, Node]], otherwise: Node | None, line: int) -> Status:
        if not clauses:
            return self.run(otherwise) if otherwise is not None else True
        (condition, body), rest = clauses[0], clauses[1:]
        decided = self._condition(condition)
        if decided is True:
            return self.run(body)
        if decided is False:
            return self._if(rest, otherwise, line)
        where = f"the condition on line {_line_of(condition)}"
        self._branches([lambda: self.run(body), lambda: self._if(rest, otherwise, line)], where, _line_of(condition))
        return None

    def _condition(self, condition: Node) -> Status:
        """An `if`'s condition: a test decides it; any other command's exit status is unknown here."""
        status = self.run(condition)
        last = condition.commands[-1] if isinstance(condition, Sequence) and condition.commands else condition
        return status if _is_test(last) else None

    def _case(self, node: Case) -> Status:
        subject = self.expander.scalar(node.word)
        for position, (patterns, body) in enumerate(node.arms):
            matched = self._case_matches(subject, patterns)
            if matched is True:
                return self.run(body)
            if matched is None:
                where = f"the case on line {node.line}"
                rest = Case(node.word, node.arms[position + 1 :], node.line)
                branches: list[Callable[[], Status]] = [
                    functools.partial(self.run, body),
                    functools.partial(self._case, rest),
                ]
                self._branches(branches, where, node.line)
                return None
        return True

    def _case_matches(self, subject: str | Unresolved, patterns: tuple[Word, ...]) -> Status:
        if isinstance(subject, Unresolved):
            return None
        for pattern in patterns:
            regex = self.expander.pattern(pattern.text, pattern.line)  # a pattern: unquoted text matches as a glob
            if isinstance(regex, Unresolved):
                return None
            if regex.fullmatch(subject):
                return True
        return False

    def _loop(self, node: Loop) -> Status:
        where = f"the loop on line {node.line}"

        def once() -> Status:
            if node.condition is not None:
                self.run(node.condition)
            for name in (node.variable or "").split(","):
                if name:
                    self.expander.variables[name] = Unresolved(f"${name} is set by {where}", node.line)
            return self.run(node.body)

        self._branches([once, lambda: True], where, node.line)
        return None

    def _maybe(self, command: Node, why: str, line: int) -> Status:
        self._branches([lambda: self.run(command), lambda: True], f"{why} (line {line})", line)
        return None

    def _branches(self, branches: list[Callable[[], Status]], where: str, line: int) -> None:
        """Run each branch on a copy of the state; what they leave alike stays known, the rest becomes unknown. A
        branch that exits the script is left out; when every branch exits, so does the script."""
        start = self._state()
        survivors: list[_State] = []
        self.undecided.append(where)
        try:
            for branch in branches:
                self._restore(_State(dict(start.variables), dict(start.functions), start.arguments))
                try:
                    branch()
                except _Exit:
                    continue
                survivors.append(self._state())
        finally:
            self.undecided.pop()
        if not survivors:
            raise _Exit(line)
        self._restore(_merge(survivors, where, line))

    def _on_copy(self, node: Node, keep: bool) -> Status:
        """A subshell: the node runs on a copy of the state, which is dropped after."""
        saved = self._state()
        self._restore(_State(dict(saved.variables), dict(saved.functions), saved.arguments))
        try:
            return self.run(node)
        finally:
            if not keep:
                self._restore(saved)

    def _state(self) -> _State:
        return _State(self.expander.variables, self.functions, self.expander.arguments)

    def _restore(self, state: _State) -> None:
        self.expander.variables, self.functions, self.expander.arguments = (
            state.variables,
            state.functions,
            state.arguments,
        )

    def _call(self, function: Function, arguments: list[Field], line: int) -> Status:
        self.calls += 1
        if self.calls > MAX_CALLS:
            raise ScriptError(f"{function.name}: functions call each other more than {MAX_CALLS} deep", line)
        saved = self.expander.arguments
        unknown = next((field.value for field in arguments if isinstance(field, UnknownWord)), None)
        self.expander.arguments = unknown if unknown is not None else tuple(str(field) for field in arguments)
        try:
            return self.run(function.body)
        finally:
            self.expander.arguments = saved
            self.calls -= 1

    # -------------------------------------------------------------------------------------------- tests

    def _test(self, fields: list[Field], name: str, line: int) -> Status:
        """`[ ... ]`, `test ...`, `true`, `false`, `:`."""
        if name in ("true", ":"):
            return True
        if name == "false":
            return False
        if name == "[":
            if not fields or fields[-1] != "]":
                raise ScriptError("[: missing `]'", line)
            fields = fields[:-1]
        if any(isinstance(field, UnknownWord) for field in fields):
            return None
        return decide([str(field) for field in fields], self.expander, line, double=False)

    def _double_bracket(self, node: Test) -> Status:
        """`[[ ... ]]`: operands are not split; `&&`, `||`, `!` and parentheses combine the tests."""
        terms: list[Term] = []
        for token in node.tokens:
            if isinstance(token, Word) and terms and is_operator(terms[-1], "==", "=", "!="):  # right of ==: a pattern
                value: Term | Unresolved = self.expander.pattern(token.text, token.line)
            elif isinstance(token, Operator) or keyword(token) is not None:  # as written: an operator, a plain word
                terms.append(token.text)
                continue
            else:
                value = self.expander.scalar(token)
                value = value if isinstance(value, Unresolved) else Operand(value)
            if isinstance(value, Unresolved):
                return None
            terms.append(value)
        return decide(terms, self.expander, node.line, double=True)

    def _arithmetic_command(self, node: ArithmeticCommand) -> Status:
        value = self.expander.arithmetic(node.expression, node.line)
        if isinstance(value, Unresolved):
            for name in arithmetic_names(node.expression):
                self.expander.variables[name] = Unresolved(
                    f"${name} is set by (( )), which the converter does not do", node.line
                )
            return None
        return value != 0


# ------------------------------------------------------------------------------------------------ helpers


def _is_assignment(word: Word | ArrayWord) -> bool:
    if isinstance(word, ArrayWord):
        return True
    first = word.parts[0] if word.parts else None
    return isinstance(first, Literal) and not first.quoted and _ASSIGNMENT.match(first.text) is not None


def _is_test(node: Node) -> bool:
    if isinstance(node, (Test, ArithmeticCommand)):
        return True
    if isinstance(node, Pipeline) and len(node.commands) == 1:
        return _is_test(node.commands[0])
    if isinstance(node, AndOr):
        return _is_test(node.first) and all(_is_test(command) for _, command in node.rest)
    if isinstance(node, Simple) and node.words:
        first = node.words[0]
        return isinstance(first, Word) and first.text in _TESTS
    return False


def _line_of(node: Node) -> int:
    if isinstance(node, Sequence):
        return _line_of(node.commands[0]) if node.commands else 0
    if isinstance(node, AndOr):
        return _line_of(node.first)
    return node.line


def _merge(states: list[_State], where: str, line: int) -> _State:
    """The variables every branch left alike, and the others unknown (naming the undecided condition)."""
    first = states[0]
    merged: dict[str, Value] = {}
    for name in set().union(*(state.variables for state in states)):
        values = [state.variables.get(name) for state in states]
        if all(value == values[0] for value in values):
            if values[0] is not None:
                merged[name] = values[0]
        else:
            merged[name] = Unresolved(f"${name} depends on {where}, which the converter cannot decide", line)
    functions = {
        name: body
        for name, body in first.functions.items()
        if all(state.functions.get(name) == body for state in states)
    }
    return _State(merged, functions, first.arguments)
