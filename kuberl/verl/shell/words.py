"""A launch script cut into bash's tokens: words (each a run of literal, quoted and expanded parts) and operators.

This is bash's own tokenising (bash(1), QUOTING and DEFINITIONS) for what launch scripts write: blanks and newlines
between words, `\\` escapes and line continuations, '...' and "..." (and $'...'), `#` comments, the operators
`; & && || | ( ) ;;`, redirections (a heredoc's body is skipped), `NAME=(...)` arrays, `((...))` arithmetic
commands, and inside words the expansions `$NAME`, `${...}`, `$((...))`, `$(...)` and backquotes, kept as written
for expand.py. Nothing is run or expanded here.

    >>> [token.text for token in tokens("A=\\"x y\\" # note\\necho $A 2>&1 | tee log")]
    ['A="x y"', '\\n', 'echo', '$A', '2>&', '1', '|', 'tee', 'log', '\\n']
"""

from dataclasses import dataclass

from kuberl.verl.shell.errors import ScriptError


@dataclass(frozen=True)
class Literal:
    """Text as it stands; `quoted` when quotes or a backslash protect it from word splitting."""

    text: str
    quoted: bool


@dataclass(frozen=True)
class Expansion:
    """`$NAME`, `${...}`, `$((...))`, `$(...)`, a backquoted command or `<(...)`, as written; `quoted` inside "..."."""

    source: str
    quoted: bool


Part = Literal | Expansion


@dataclass(frozen=True)
class Word:
    parts: tuple[Part, ...]
    text: str  # as written, for messages
    line: int


@dataclass(frozen=True)
class ArrayWord:
    """`NAME=(word ...)` or `NAME+=(word ...)`: an array assignment, its elements not yet expanded."""

    name: str
    elements: tuple[Word, ...]
    append: bool
    text: str
    line: int


@dataclass(frozen=True)
class Operator:
    """`;`, `&`, `&&`, `||`, `|`, `(`, `)`, `;;`, a newline (text "\\n"), or a redirection (`>`, `2>&`, `<<<`, ...)."""

    text: str
    line: int

    @property
    def redirection(self) -> bool:
        return self.text.lstrip("0123456789") in _REDIRECTIONS


@dataclass(frozen=True)
class Arithmetic:
    """`(( expression ))` as a command; `expression` as written."""

    expression: str
    text: str
    line: int


Token = Word | ArrayWord | Operator | Arithmetic

_BLANKS = " \t"
_METACHARACTERS = " \t\n;&|()<>"
_OPERATORS = ("&&", "||", ";;", ";&", "|&", ";", "&", "|", "(", ")")
_REDIRECTIONS = ("<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">")
#: bash's escapes inside "...": a backslash before anything else stays.
_DOUBLE_QUOTE_ESCAPES = '$`"\\'
_ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "e": "\x1b", "0": "\0"}


def tokens(script: str) -> list[Token]:
    """The script's tokens; a newline token ends every line that holds any (see the module docstring)."""
    return _Lexer(script).run()


def operand_parts(text: str, quoted: bool, line: int) -> tuple[Part, ...]:
    """The parts of a word inside an expansion (`word` of `${NAME:-word}`, a pattern, an arithmetic text), where
    blanks do not end it; `quoted` when the expansion stands inside "...", where a `'` is literal.

    >>> [(type(part).__name__, part.quoted) for part in operand_parts('a "b c" $X', quoted=False, line=1)]
    [('Literal', False), ('Literal', True), ('Literal', False), ('Expansion', False)]
    """
    return tuple(_Lexer(text, line).operand(quoted))


def is_name(text: str) -> bool:
    """A shell variable name: a letter or `_`, then letters, digits and `_`."""
    return bool(text) and (text[0].isalpha() or text[0] == "_") and all(c.isalnum() or c == "_" for c in text)


class _Lexer:
    def __init__(self, script: str, line: int = 1) -> None:
        self.text, self.position, self.line = script, 0, line
        self.out: list[Token] = []
        self.heredocs: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs) waiting for the next newline

    def run(self) -> list[Token]:
        while self.position < len(self.text):
            char = self.text[self.position]
            if char in _BLANKS:
                self.position += 1
            elif self.text.startswith("\\\n", self.position):
                self._advance(2)
            elif char == "#":
                end = self.text.find("\n", self.position)
                self.position = len(self.text) if end < 0 else end
            elif char == "\n":
                self.out.append(Operator("\n", self.line))
                self._advance(1)
                self._skip_heredocs()
            elif self.text.startswith("((", self.position):
                self.out.append(self._arithmetic_command())
            elif char in "<>" and self.text.startswith("(", self.position + 1):
                self.out.append(self._word())  # <(...) process substitution: a word
            elif char in _METACHARACTERS:
                self.out.append(self._operator())
            else:
                self.out.append(self._word())
        if self.out and not (isinstance(self.out[-1], Operator) and self.out[-1].text == "\n"):
            self.out.append(Operator("\n", self.line))
        return self.out

    def _advance(self, count: int) -> str:
        taken = self.text[self.position : self.position + count]
        self.line += taken.count("\n")
        self.position += count
        return taken

    def _operator(self) -> Operator:
        line = self.line
        for operator in _REDIRECTIONS + _OPERATORS:
            if self.text.startswith(operator, self.position):
                self._advance(len(operator))
                if operator in ("<<", "<<-"):
                    self._heredoc(strip_tabs=operator == "<<-")
                return Operator(operator, line)
        raise ScriptError(f"unexpected {self.text[self.position]!r}", line)

    def _heredoc(self, strip_tabs: bool) -> None:
        """Read the delimiter word after `<<`; its body is skipped at the end of this line."""
        while self.position < len(self.text) and self.text[self.position] in _BLANKS:
            self.position += 1
        word = self._word()
        if not isinstance(word, Word):
            raise ScriptError("a heredoc needs a delimiter word after <<", word.line)
        delimiter = "".join(part.text if isinstance(part, Literal) else part.source for part in word.parts)
        self.heredocs.append((delimiter, strip_tabs))

    def _skip_heredocs(self) -> None:
        for delimiter, strip_tabs in self.heredocs:
            while self.position < len(self.text):
                end = self.text.find("\n", self.position)
                end = len(self.text) if end < 0 else end
                line = self.text[self.position : end]
                self._advance(end - self.position + 1)
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.heredocs = []

    def _arithmetic_command(self) -> Arithmetic:
        line, start = self.line, self.position
        end = _matching_parenthesis(self.text, self.position + 1, line)  # the `)` closing the inner `(`
        if not self.text.startswith(")", end + 1):
            raise ScriptError("(( without its closing ))", line)
        self._advance(end + 2 - self.position)
        return Arithmetic(self.text[start + 2 : end], self.text[start : end + 2], line)

    def _word(self) -> Word | ArrayWord | Operator:
        line, start = self.line, self.position
        parts: list[Part] = []
        literal: list[str] = []

        def flush() -> None:
            if literal:
                parts.append(Literal("".join(literal), quoted=False))
                literal.clear()

        while self.position < len(self.text):
            char = self.text[self.position]
            if char == "(" and not parts and (literal[-1:] == ["="]) and is_name("".join(literal).rstrip("+=")):
                return self._array("".join(literal), line, start)
            if char in "<>" and self.text.startswith("(", self.position + 1):
                flush()
                end = _matching_parenthesis(self.text, self.position + 1, line)
                parts.append(Expansion(self._advance(end + 1 - self.position), quoted=False))
                continue
            if char in _METACHARACTERS:
                break
            if char == "\\":
                if self.text.startswith("\\\n", self.position):
                    self._advance(2)
                    continue
                flush()
                parts.append(Literal(self._advance(2)[1:], quoted=True))
            elif char == "'":
                flush()
                parts.append(Literal(self._single_quoted(line), quoted=True))
            elif char == '"':
                flush()
                self._advance(1)
                parts.extend(self._double_quoted(line))
            elif self.text.startswith("$'", self.position):
                flush()
                self._advance(1)
                parts.append(Literal(_ansi_c(self._single_quoted(line)), quoted=True))
            elif self.text.startswith('$"', self.position):
                flush()
                self._advance(2)
                parts.extend(self._double_quoted(line))
            elif char in "$`" and (expansion := self._expansion(line)) is not None:
                flush()
                parts.append(Expansion(expansion, quoted=False))
            else:
                literal.append(self._advance(1))
        flush()
        if self.position < len(self.text) and self.text[self.position] in "<>" and _is_io_number(parts):
            digits = parts[0]
            assert isinstance(digits, Literal)  # _is_io_number
            operator = self._operator()  # 2>&1: the digits belong to the redirection
            return Operator(self.text[start : start + len(digits.text)] + operator.text, line)
        return Word(tuple(parts), self.text[start : self.position], line)

    def operand(self, quoted: bool) -> list[Part]:
        """The whole text as parts of one word (see operand_parts)."""
        line = self.line
        parts: list[Part] = []
        literal: list[str] = []

        def flush() -> None:
            if literal:
                parts.append(Literal("".join(literal), quoted=quoted))
                literal.clear()

        while self.position < len(self.text):
            char, following = self.text[self.position], self.text[self.position + 1 : self.position + 2]
            if char == "\\" and following == "\n":
                self._advance(2)
            elif char == "\\" and (not quoted or following in _DOUBLE_QUOTE_ESCAPES):
                flush()
                parts.append(Literal(self._advance(2)[1:], quoted=True))
            elif char == "'" and not quoted:
                flush()
                parts.append(Literal(self._single_quoted(line), quoted=True))
            elif char == '"':
                flush()
                self._advance(1)
                parts.extend(self._double_quoted(line))
            elif char in "$`" and (expansion := self._expansion(line)) is not None:
                flush()
                parts.append(Expansion(expansion, quoted=quoted))
            else:
                literal.append(self._advance(1))
        flush()
        return parts

    def _single_quoted(self, line: int) -> str:
        end = self.text.find("'", self.position + 1)
        if end < 0:
            raise ScriptError("a ' that is never closed", line)
        return self._advance(end + 1 - self.position)[1:-1]

    def _double_quoted(self, line: int) -> list[Part]:
        """The parts of "..." after its opening quote, up to and past the closing one."""
        parts: list[Part] = []
        literal: list[str] = []
        while self.position < len(self.text):
            char = self.text[self.position]
            if char == '"':
                self._advance(1)
                if literal or not parts:
                    parts.append(Literal("".join(literal), quoted=True))
                return parts
            if char == "\\" and self.text[self.position + 1 : self.position + 2] == "\n":
                self._advance(2)
            elif char == "\\" and self.text[self.position + 1 : self.position + 2] in _DOUBLE_QUOTE_ESCAPES:
                literal.append(self._advance(2)[1])
            elif char in "$`" and (expansion := self._expansion(line)) is not None:
                if literal:
                    parts.append(Literal("".join(literal), quoted=True))
                    literal = []
                parts.append(Expansion(expansion, quoted=True))
            else:
                literal.append(self._advance(1))
        raise ScriptError('a " that is never closed', line)

    def _expansion(self, line: int) -> str | None:
        """The expansion starting here, as written (and consumed); None for a `$` that starts none."""
        text, start = self.text, self.position
        if text[start] == "`":
            end = start + 1
            while end < len(text) and text[end] != "`":
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                raise ScriptError("a ` that is never closed", line)
            return self._advance(end + 1 - start)
        following = text[start + 1 : start + 2]
        if following == "(":
            end = _matching_parenthesis(text, start + 1, line)
            return self._advance(end + 1 - start)
        if following == "{":
            end = _matching_brace(text, start + 1, line)
            return self._advance(end + 1 - start)
        if following and (following.isalpha() or following == "_"):
            end = start + 1
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            return self._advance(end - start)
        if following and (following.isdigit() or following in "@*#?$!-"):
            return self._advance(2)
        return None

    def _array(self, head: str, line: int, start: int) -> ArrayWord:
        """`NAME=(` was read: the elements up to the closing `)`, across lines and comments."""
        append = head.endswith("+=")
        name = head[: -2 if append else -1]
        self._advance(1)
        elements: list[Word] = []
        while True:
            while self.position < len(self.text) and self.text[self.position] in _BLANKS + "\n":
                self._advance(1)
            if self.text.startswith("\\\n", self.position):
                self._advance(2)
                continue
            if self.position >= len(self.text):
                raise ScriptError(f"the array {name}=( is never closed", line)
            char = self.text[self.position]
            if char == "#":
                end = self.text.find("\n", self.position)
                self.position = len(self.text) if end < 0 else end
            elif char == ")":
                self._advance(1)
                return ArrayWord(name, tuple(elements), append, self.text[start : self.position], line)
            else:
                element = self._word()
                if not isinstance(element, Word) or not element.parts:
                    raise ScriptError(f"the array {name}=( holds {self.text[self.position]!r}", self.line)
                elements.append(element)


def _is_io_number(parts: list[Part]) -> bool:
    return len(parts) == 1 and isinstance(parts[0], Literal) and not parts[0].quoted and parts[0].text.isdigit()


def _ansi_c(text: str) -> str:
    out, position = [], 0
    while position < len(text):
        if text[position] == "\\" and position + 1 < len(text):
            out.append(_ANSI_C.get(text[position + 1], "\\" + text[position + 1]))
            position += 2
        else:
            out.append(text[position])
            position += 1
    return "".join(out)


def _skip_quoted(text: str, position: int, line: int) -> int:
    """The position past the quoted string or escape that starts at `position`."""
    char = text[position]
    if char == "\\":
        return position + 2
    if char == "'":
        end = text.find("'", position + 1)
    else:
        end = position + 1
        while end < len(text) and text[end] != '"':
            end += 2 if text[end] == "\\" else 1
    if end < 0 or end >= len(text):
        raise ScriptError(f"a {char} that is never closed", line)
    return end + 1


def _matching_parenthesis(text: str, opening: int, line: int) -> int:
    """The position of the `)` that closes the `(` at `opening`, past quotes and nested parentheses."""
    return _closing(text, opening, "()", line)


def _matching_brace(text: str, opening: int, line: int) -> int:
    """The position of the `}` that closes the `{` of `${` at `opening`, past quotes and nested braces."""
    return _closing(text, opening, "{}", line)


def _closing(text: str, opening: int, pair: str, line: int) -> int:
    depth, position = 0, opening
    while position < len(text):
        char = text[position]
        if char in "'\"\\":
            position = _skip_quoted(text, position, line)
            continue
        depth += {pair[0]: 1, pair[1]: -1}.get(char, 0)
        if depth == 0:
            return position
        position += 1
    raise ScriptError(f"a {'$' if pair == '{}' else ''}{pair[0]} that is never closed", line)
