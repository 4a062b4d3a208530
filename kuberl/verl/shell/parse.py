"""A script's tokens (words.py) as bash's grammar groups them: simple commands, pipelines, `&&`/`||` lists, and
the compound commands launch scripts use (`if`, `case`, `for`, `while`, `until`, `{ ...; }`, `( ... )`,
`[[ ... ]]`, `(( ... ))`, function definitions). Redirections are dropped: they move output, not values.

    >>> script = parse("if [ $A = 1 ]; then B=2; else B=3; fi\\npython3 -m x | tee log")
    >>> [type(command).__name__ for command in script.commands]
    ['If', 'Pipeline']
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from kuberl.verl.shell.errors import ScriptError
from kuberl.verl.shell.words import Arithmetic, ArrayWord, Literal, Operator, Token, Word, is_name, tokens


@dataclass(frozen=True)
class Simple:
    """A command: its words (assignments first), as written."""

    words: tuple[Word | ArrayWord, ...]
    line: int


@dataclass(frozen=True)
class Sequence:
    commands: tuple["Node", ...]


@dataclass(frozen=True)
class Pipeline:
    """`a | b`: each part runs in a subshell of its own (bash without lastpipe)."""

    commands: tuple["Node", ...]
    negated: bool
    line: int


@dataclass(frozen=True)
class AndOr:
    """`a && b || c`: each command after the first runs depending on the exit status before it."""

    first: "Node"
    rest: tuple[tuple[str, "Node"], ...]


@dataclass(frozen=True)
class If:
    clauses: tuple[tuple["Node", "Node"], ...]  # (condition, body) for `if` and each `elif`
    otherwise: "Node | None"
    line: int


@dataclass(frozen=True)
class Case:
    word: Word
    arms: tuple[tuple[tuple[Word, ...], "Node"], ...]
    line: int


@dataclass(frozen=True)
class Loop:
    """`for`, `while` or `until`: its body runs any number of times."""

    kind: str
    variable: str | None  # for NAME in ...
    condition: "Node | None"  # while / until
    body: "Node"
    line: int


@dataclass(frozen=True)
class Group:
    body: "Node"
    subshell: bool  # ( ... ): assignments inside do not outlive it
    line: int


@dataclass(frozen=True)
class Function:
    name: str
    body: "Node"
    line: int


@dataclass(frozen=True)
class Test:
    """`[[ ... ]]`: its words and operators as written."""

    tokens: tuple[Word | Operator, ...]
    line: int


@dataclass(frozen=True)
class ArithmeticCommand:
    expression: str
    line: int


Node = Simple | Sequence | Pipeline | AndOr | If | Case | Loop | Group | Function | Test | ArithmeticCommand

_LIST_ENDS = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}
_ARM_ENDS = (";;", ";&", ";;&")


def parse(script: str) -> Sequence:
    """The script's commands (see the module docstring); ScriptError naming the line where bash would refuse it."""
    parser = _Parser(tokens(script))
    program = parser.command_list()
    leftover = parser.peek()
    if leftover is not None:
        raise ScriptError(f"syntax error near {_text(leftover)!r}", leftover.line)
    return program


def keyword(token: Token | None) -> str | None:
    """A reserved word's text, when the token is a plain unquoted word."""
    if isinstance(token, Word) and len(token.parts) == 1 and isinstance(token.parts[0], Literal):
        return None if token.parts[0].quoted else token.parts[0].text
    return None


def _text(token: Token) -> str:
    return token.text


#: Compound commands nested deeper than this are refused (bash scripts nest a handful; Python's stack is finite).
MAX_NESTING = 64


class _Parser:
    def __init__(self, stream: list[Token]) -> None:
        self.tokens, self.position, self.nesting = stream, 0, 0

    def peek(self, ahead: int = 0) -> Token | None:
        index = self.position + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def take(self) -> Token:
        token = self.peek()
        if token is None:
            line = self.tokens[-1].line if self.tokens else 1
            raise ScriptError("syntax error: the script ends in the middle of a command", line)
        self.position += 1
        return token

    def expect(self, word: str) -> None:
        token = self.take()
        if keyword(token) != word and not (isinstance(token, Operator) and token.text == word):
            raise ScriptError(f"syntax error: {word!r} expected, {_text(token)!r} found", token.line)

    def _is_operator(self, *texts: str) -> bool:
        token = self.peek()
        return isinstance(token, Operator) and token.text in texts

    def _skip_newlines(self) -> None:
        while self._is_operator("\n"):
            self.position += 1

    # ------------------------------------------------------------------------------------------- lists

    def command_list(self) -> Sequence:
        """and-or lists separated by `;`, `&` and newlines, up to a reserved word that closes a compound command,
        a `)`, a `;;` or the end."""
        commands: list[Node] = []
        while True:
            while self._is_operator("\n", ";", "&"):
                self.position += 1
            token = self.peek()
            if token is None or keyword(token) in _LIST_ENDS or self._is_operator(")", *_ARM_ENDS):
                return Sequence(tuple(commands))
            commands.append(self._and_or())

    def _and_or(self) -> Node:
        first = self._pipeline()
        rest: list[tuple[str, Node]] = []
        while self._is_operator("&&", "||"):
            operator = self.take()
            self._skip_newlines()
            rest.append((operator.text, self._pipeline()))
        return AndOr(first, tuple(rest)) if rest else first

    def _pipeline(self) -> Node:
        token = self.peek()
        negated = keyword(token) == "!"
        if negated:
            self.position += 1
        line = token.line if token is not None else 1
        commands = [self._command()]
        while self._is_operator("|", "|&"):
            self.position += 1
            self._skip_newlines()
            commands.append(self._command())
        return Pipeline(tuple(commands), negated, line) if len(commands) > 1 or negated else commands[0]

    # ---------------------------------------------------------------------------------------- commands

    def _command(self) -> Node:
        token = self.peek()
        if token is None:
            raise ScriptError("syntax error: a command expected at the end of the script", self.tokens[-1].line)
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise ScriptError(f"commands nest deeper than {MAX_NESTING}", token.line)
            return self._nested_command(token)
        finally:
            self.nesting -= 1

    def _nested_command(self, token: Token) -> Node:
        word = keyword(token)
        if isinstance(token, Arithmetic):
            self.position += 1
            return self._redirected(ArithmeticCommand(token.expression, token.line))
        if isinstance(token, Operator) and token.text == "(":
            self.position += 1
            body = self.command_list()
            self.expect(")")
            return self._redirected(Group(body, subshell=True, line=token.line))
        compounds: dict[str, Callable[[], Node]] = {
            "{": self._group,
            "if": self._if,
            "while": self._while,
            "until": self._while,
            "for": self._for,
            "case": self._case,
            "[[": self._test,
            "function": self._function,
        }
        compound = compounds.get(word or "")
        if compound is not None:
            return self._redirected(compound())
        following, after = self.peek(1), self.peek(2)
        if (
            word is not None
            and is_name(word.replace("-", "_").replace(".", "_").replace(":", "_"))
            and isinstance(following, Operator)
            and following.text == "("
            and isinstance(after, Operator)
            and after.text == ")"
        ):
            self.position += 3
            return self._function_body(word, token.line)
        return self._simple()

    def _simple(self) -> Simple:
        words: list[Word | ArrayWord] = []
        first = self.peek()
        line = first.line if first is not None else 1
        redirected = False
        while True:
            token = self.peek()
            if isinstance(token, Operator) and token.redirection:
                self.position += 1
                self.take()  # the redirection's target
                redirected = True
                continue
            if not isinstance(token, (Word, ArrayWord)):
                break
            words.append(token)
            self.position += 1
        if not words and not redirected:
            found = self.peek()
            raise ScriptError(f"syntax error near {'the end' if found is None else repr(found.text)}", line)
        return Simple(tuple(words), line)

    def _redirected(self, node: Node) -> Node:
        """A compound command's trailing redirections (`done < file`, `} > log`), dropped."""
        while True:
            token = self.peek()
            if not (isinstance(token, Operator) and token.redirection):
                return node
            self.position += 1
            self.take()

    def _group(self) -> Group:
        line = self.take().line
        body = self.command_list()
        self.expect("}")
        return Group(body, subshell=False, line=line)

    def _if(self) -> If:
        line = self.take().line
        clauses = []
        condition = self.command_list()
        self.expect("then")
        clauses.append((condition, self.command_list()))
        otherwise = None
        while True:
            closing = self.take()
            word = keyword(closing)
            if word == "elif":
                condition = self.command_list()
                self.expect("then")
                clauses.append((condition, self.command_list()))
            elif word == "else":
                otherwise = self.command_list()
            elif word == "fi":
                return If(tuple(clauses), otherwise, line)
            else:
                raise ScriptError(f"syntax error: fi expected, {_text(closing)!r} found", closing.line)

    def _while(self) -> Loop:
        token = self.take()
        condition = self.command_list()
        body = self._do_done()
        return Loop(keyword(token) or "while", None, condition, body, token.line)

    def _for(self) -> Loop:
        line = self.take().line
        variable = None
        token = self.take()
        if isinstance(token, Arithmetic):  # for ((i = 0; i < n; i++))
            variable = ",".join(arithmetic_names(token.expression)) or None
        elif keyword(token) is not None and is_name(keyword(token) or ""):
            variable = keyword(token)
            if keyword(self.peek()) == "in":
                self.position += 1
                while isinstance(self.peek(), Word):
                    self.position += 1
        else:
            raise ScriptError(f"syntax error: a name expected after for, {_text(token)!r} found", token.line)
        while self._is_operator(";", "\n"):
            self.position += 1
        return Loop("for", variable, None, self._do_done(), line)

    def _do_done(self) -> Sequence:
        self._skip_newlines()
        self.expect("do")
        body = self.command_list()
        self.expect("done")
        return body

    def _case(self) -> Case:
        line = self.take().line
        subject = self.take()
        if not isinstance(subject, Word):
            raise ScriptError("syntax error: a word expected after case", line)
        self._skip_newlines()
        self.expect("in")
        arms: list[tuple[tuple[Word, ...], Node]] = []
        while True:
            self._skip_newlines()
            if keyword(self.peek()) == "esac":
                self.position += 1
                return Case(subject, tuple(arms), line)
            if self._is_operator("("):
                self.position += 1
            patterns: list[Word] = []
            while True:
                pattern = self.take()
                if not isinstance(pattern, Word):
                    raise ScriptError(f"syntax error in a case pattern near {_text(pattern)!r}", pattern.line)
                patterns.append(pattern)
                separator = self.take()
                if isinstance(separator, Operator) and separator.text == ")":
                    break
                if not (isinstance(separator, Operator) and separator.text == "|"):
                    raise ScriptError(f"syntax error in a case pattern near {_text(separator)!r}", separator.line)
            arms.append((tuple(patterns), self.command_list()))
            if self._is_operator(*_ARM_ENDS):
                self.position += 1

    def _test(self) -> Test:
        line = self.take().line
        found: list[Word | Operator] = []
        while keyword(self.peek()) != "]]":
            token = self.take()
            if isinstance(token, (Word, Operator)) and not (isinstance(token, Operator) and token.text == "\n"):
                found.append(token)
            elif isinstance(token, (ArrayWord, Arithmetic)):
                raise ScriptError(f"syntax error in [[ near {_text(token)!r}", token.line)
        self.position += 1
        return Test(tuple(found), line)

    def _function(self) -> Function:
        line = self.take().line
        name = keyword(self.take())
        if name is None:
            raise ScriptError("syntax error: a name expected after function", line)
        if self._is_operator("(") and isinstance(self.peek(1), Operator):
            self.position += 2
        return self._function_body(name, line)

    def _function_body(self, name: str, line: int) -> Function:
        self._skip_newlines()
        return Function(name, self._command(), line)


def arithmetic_names(expression: str) -> list[str]:
    """The names an arithmetic expression assigns: `i = 0`, `i++`, `++i`, `i += 2`.

    >>> arithmetic_names("i = 1; i <= n; i++"), arithmetic_names("x += 2, y == 3")
    (['i'], ['x'])
    """
    pattern = (
        r"([A-Za-z_]\w*)\s*(?:[-+*/%&|^]|<<|>>|\*\*)?=(?!=)|([A-Za-z_]\w*)\s*(?:\+\+|--)|(?:\+\+|--)\s*([A-Za-z_]\w*)"
    )
    return sorted({name for groups in re.findall(pattern, expression) for name in groups if name})
