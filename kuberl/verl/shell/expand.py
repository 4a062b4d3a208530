"""bash's expansions of a word, done on values the script gave (or the environment), never by running anything.

A word's parts (words.py) become fields as bash makes them (bash(1), EXPANSION): tilde, parameter expansion
(`$NAME`, `${NAME}`, `${NAME:-word}` and the other defaults, `${#NAME}`, `${NAME:offset:length}`,
`${NAME#pattern}` and `%`, `${NAME/pattern/string}`, `${NAME^^}` and `,,`, arrays `${A[@]}`, `${A[*]}`, `${A[i]}`,
`${#A[@]}`, the script's arguments `$@`, `${@:2}`, `$1` and `$#`), arithmetic (arithmetic.py), then word
splitting of what an unquoted expansion gave, and quote removal. Globbing is not done: verl's overrides never
name files by pattern.

The script runs with no arguments: `$@` gives no words, `${1:-vllm}` its default. What the converter cannot know
is an `Unresolved` value, which carries why and the line that read it through every assignment it passes: a
variable set neither in the script nor in the environment, a command's output (`$(date)`; `$(pwd)` is $PWD), `$1`
with no default, `$RANDOM`. bash's fatal expansion errors (`${NAME:?message}` on an unset NAME, an arithmetic
error) raise ScriptError. Every value is bounded (MAX_VALUE characters; expansions nested MAX_NESTING deep).
"""

import re
from dataclasses import dataclass, replace

from kuberl.verl.shell import arithmetic
from kuberl.verl.shell.arithmetic import Lookup
from kuberl.verl.shell.errors import ScriptError
from kuberl.verl.shell.words import Expansion, Literal, Part, Word, is_name, operand_parts

MAX_VALUE = 1_000_000
MAX_NESTING = 32
#: Pattern operators on values longer than this are not evaluated (each tries every prefix or suffix).
MAX_PATTERN_SUBJECT = 10_000


@dataclass(frozen=True)
class Unresolved:
    """A value the converter cannot know without running something: why, the line that read it, and the
    assignments (name, line) it went through on its way."""

    why: str
    line: int
    via: tuple[tuple[str, int], ...] = ()

    def through(self, name: str, line: int) -> "Unresolved":
        return replace(self, via=(*self.via, (name, line)))

    def __str__(self) -> str:
        path = "".join(f", then {name} (line {line})" for name, line in self.via)
        return f"{self.why} (line {self.line}{path})"


#: A variable's value: a string, an array, or what the converter cannot know.
Value = str | tuple[str, ...] | Unresolved


@dataclass(frozen=True)
class _Piece:
    """Expanded text; `split` when it came from an unquoted expansion (bash splits it at blanks); `exists` when it
    makes the word a word even if empty (quoted text does, an unquoted empty expansion does not)."""

    text: str
    split: bool
    exists: bool


#: A field boundary between the elements of an array expansion.
_BREAK = _Piece("", False, False)
Pieces = list[_Piece]

_PARAMETER = re.compile(r"(?P<name>[A-Za-z_]\w*|\d+|[@*#?$!-])(?:\[(?P<subscript>[^\]]*)\])?(?P<rest>.*)", re.S)
_POSITIONAL = ("@", "*")


class Expander:
    """Expands words against `variables` (names to Value); assignments made by `${NAME:=word}` land there too."""

    def __init__(self, variables: dict[str, Value]) -> None:
        self.variables = variables
        self.arguments: tuple[str, ...] | Unresolved = ()  # $1 ...: the script's (none) or a function's
        self.nesting = 0

    # ---------------------------------------------------------------------------------------- entry points

    def fields(self, word: Word, after_equals: bool = True) -> list[str] | Unresolved:
        """The word's fields after splitting (a command's arguments; an array's elements, `after_equals` False)."""
        pieces = self._pieces(_with_tilde(word.parts, after_equals), word.line)
        return pieces if isinstance(pieces, Unresolved) else _split(pieces)

    def scalar(self, word: Word) -> str | Unresolved:
        """The word as one string, unsplit: an assignment's value, a `case` word, a `[[` operand."""
        pieces = self._pieces(_with_tilde(word.parts), word.line)
        if isinstance(pieces, Unresolved):
            return pieces
        return _joined(pieces)

    def value(self, parts: tuple[Part, ...], line: int) -> str | Unresolved:
        """Parts as one string, unsplit (an arithmetic expression's text, a pattern)."""
        pieces = self._pieces(parts, line)
        return pieces if isinstance(pieces, Unresolved) else _joined(pieces)

    def arithmetic(self, expression: str, line: int) -> int | Unresolved:
        """`$((expression))`: the text expanded as if double-quoted, then evaluated (arithmetic.py)."""
        text = self.value(operand_parts(expression, quoted=True, line=line), line)
        if isinstance(text, Unresolved):
            return text
        try:
            return arithmetic.evaluate(text, self._arithmetic_lookup(line), line)
        except arithmetic.Unknown as unknown:
            reason = unknown.args[0]
            return reason if isinstance(reason, Unresolved) else Unresolved(str(reason), line)

    # ------------------------------------------------------------------------------------------- pieces

    def _pieces(self, parts: tuple[Part, ...], line: int) -> Pieces | Unresolved:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise ScriptError(f"expansions nest deeper than {MAX_NESTING}", line)
            out: Pieces = []
            size = 0
            for part in parts:
                added = len(out)
                if isinstance(part, Literal):  # unquoted text splits where it holds blanks (`${X:-a b}`)
                    out.append(_Piece(part.text, not part.quoted, part.quoted or bool(part.text)))
                else:
                    expanded = self._expansion(part, line)
                    if isinstance(expanded, Unresolved):
                        return expanded
                    if part.quoted and not _gives_elements(part.source):
                        out.append(_Piece("", False, True))  # "$EMPTY" is still a word; "$@" with no arguments not
                    out.extend(expanded)
                size += sum(len(piece.text) + 1 for piece in out[added:])  # + 1: an element's boundary counts
                if size > MAX_VALUE:
                    raise ScriptError(f"a value longer than {MAX_VALUE} characters", line)
            return out
        finally:
            self.nesting -= 1

    def _expansion(self, part: Expansion, line: int) -> Pieces | Unresolved:
        source, quoted = part.source, part.quoted
        if source.startswith("$((") and source.endswith("))"):
            number = self.arithmetic(source[3:-2], line)
            return number if isinstance(number, Unresolved) else _text(str(number), quoted)
        if source.startswith(("$(", "`", "<(", ">(")):
            command = source[2:-1] if source.startswith("$(") else source[1:-1]
            if command.strip() == "pwd":  # the one command whose output the converter knows: $PWD
                return self._parameter_value("PWD", None, quoted, line)
            return Unresolved(f"{source} is a command, which the converter does not run", line)
        if source.startswith("${"):
            return self._braced(source[2:-1], quoted, line)
        return self._parameter_value(source[1:], None, quoted, line)

    # -------------------------------------------------------------------------------------- ${...} forms

    def _braced(self, inner: str, quoted: bool, line: int) -> Pieces | Unresolved:
        if inner.startswith("#") and len(inner) > 1:
            return self._length(inner[1:], line)
        match = _PARAMETER.fullmatch(inner)
        if match is None or inner.startswith("!"):
            return Unresolved(f"${{{inner}}} is an expansion the converter does not read", line)
        name, subscript, rest = match.group("name"), match.group("subscript"), match.group("rest")
        if not rest:
            return self._parameter_value(name, subscript, quoted, line)
        value = self._get(name, subscript, line)
        if isinstance(value, Unresolved):
            return value
        for operator in (":-", ":=", ":+", ":?", "-", "=", "+", "?"):
            if rest.startswith(operator):
                return self._default(name, subscript, value, operator, rest[len(operator) :], quoted, line)
        if value is None:  # the other operators act on the value: an unset one is unknown to the converter
            return _set_nowhere(name, line)
        if rest.startswith(":"):
            return self._substring(value, rest[1:], quoted, line)
        if rest[0] in "#%/^,":
            return self._pattern(value, rest, quoted, line)
        return Unresolved(f"${{{inner}}} is an expansion the converter does not read", line)

    def _parameter_value(self, name: str, subscript: str | None, quoted: bool, line: int) -> Pieces | Unresolved:
        value = self._get(name, subscript, line)
        if value is None and subscript is not None and name in self.variables:
            return _text("", quoted)  # an element past the end of an array the script set: empty, as in bash
        if value is None:
            return _set_nowhere(name, line)
        if isinstance(value, Unresolved):
            return value
        return _pieces_of(value, quoted, _separate(name, subscript, quoted))

    def _get(self, name: str, subscript: str | None, line: int) -> Value | None:
        """A parameter's value; None when it is unset. `NAME[@]` gives the array, `NAME` its first element."""
        if name in _POSITIONAL or name == "#" or (name.isdigit() and name != "0"):
            arguments = self.arguments
            if isinstance(arguments, Unresolved):
                return arguments
            if name == "#":
                return str(len(arguments))
            if name.isdigit():
                return arguments[int(name) - 1] if int(name) <= len(arguments) else None
            return arguments
        if name.isdigit() or name in "?$!-":
            return Unresolved(f"${name} is known only when the script runs", line)
        value = self.variables.get(name)
        if value is None or isinstance(value, Unresolved) or subscript in _POSITIONAL:
            return (value,) if isinstance(value, str) and subscript in _POSITIONAL else value
        elements = (value,) if isinstance(value, str) else value
        if subscript is None:
            return elements[0] if elements else None
        index = self.arithmetic(subscript, line)
        if isinstance(index, Unresolved):
            return index
        index = index + len(elements) if index < 0 else index
        return elements[index] if 0 <= index < len(elements) else None

    def _default(
        self,
        name: str,
        subscript: str | None,
        value: str | tuple[str, ...] | None,
        operator: str,
        word: str,
        quoted: bool,
        line: int,
    ) -> Pieces | Unresolved:
        """`-` `=` `+` `?`, and with `:` (a null value counts as unset too)."""
        is_set = value is not None and (not operator.startswith(":") or value not in ("", ()))
        kind = operator[-1]
        if kind == "+":
            return self._operand(word, quoted, line) if is_set else []
        if is_set:
            assert value is not None
            return _pieces_of(value, quoted, _separate(name, subscript, quoted))
        if kind == "?":
            message = self.value(operand_parts(word, quoted=True, line=line), line)
            raise ScriptError(f"{name}: {message or 'parameter null or not set'} (bash stops the script here)", line)
        pieces = self._operand(word, quoted, line)
        if kind == "=" and not isinstance(pieces, Unresolved):
            if not is_name(name) or subscript is not None:
                raise ScriptError(f"${{{name}{operator}...}}: cannot assign in this way", line)
            self.variables[name] = _joined(pieces)
        return pieces

    def _operand(self, word: str, quoted: bool, line: int) -> Pieces | Unresolved:
        return self._pieces(operand_parts(word, quoted=quoted, line=line), line)

    def _length(self, parameter: str, line: int) -> Pieces | Unresolved:
        """`${#NAME}` (characters) and `${#NAME[@]}` (elements)."""
        match = _PARAMETER.fullmatch(parameter)
        if match is None or match.group("rest"):
            return Unresolved(f"${{#{parameter}}} is an expansion the converter does not read", line)
        name, subscript = match.group("name"), match.group("subscript")
        value = self._get(name, subscript, line)
        if isinstance(value, Unresolved):
            return value
        if value is None:
            return _set_nowhere(name, line)
        count = len(value) if isinstance(value, tuple) else len(value)
        return _text(str(count), quoted=True)

    def _substring(self, value: str | tuple[str, ...], spec: str, quoted: bool, line: int) -> Pieces | Unresolved:
        """`${NAME:offset}` and `${NAME:offset:length}` (negative: from the end), on a string or an array."""
        offset_text, _, length_text = spec.partition(":")
        offset = self.arithmetic(offset_text, line)
        length = self.arithmetic(length_text, line) if length_text.strip() else None
        if isinstance(offset, Unresolved):
            return offset
        if isinstance(length, Unresolved):
            return length
        size = len(value)
        start = max(offset + size, 0) if offset < 0 else min(offset, size)
        end = size if length is None else (length + size if length < 0 else start + length)
        if end < start:
            raise ScriptError(f"{spec}: substring expression < 0", line)
        return _pieces_of(value[start:end], quoted, separate=True)

    def _pattern(self, value: str | tuple[str, ...], rest: str, quoted: bool, line: int) -> Pieces | Unresolved:
        """`#`, `##`, `%`, `%%` (remove a prefix or suffix), `/`, `//`, `/#`, `/%` (replace), `^^`, `^`, `,,`, `,`."""
        elements = value if isinstance(value, tuple) else (value,)
        if any(len(element) > MAX_PATTERN_SUBJECT for element in elements):
            return Unresolved(f"a pattern on a value longer than {MAX_PATTERN_SUBJECT} characters", line)
        if rest[0] in "^,":
            doubled = rest[1:2] == rest[0]
            if rest[1 + doubled :]:
                return Unresolved(f"${{...{rest}}}: case changes by pattern are not read", line)
            change = str.upper if rest[0] == "^" else str.lower
            changed = tuple(change(e) if doubled else change(e[:1]) + e[1:] for e in elements)
            return _pieces_of(changed if isinstance(value, tuple) else changed[0], quoted, separate=True)
        operator = rest[:2] if rest[:2] in ("##", "%%", "//", "/#", "/%") else rest[0]
        pattern_text, replacement_text = rest[len(operator) :], None
        if operator[0] == "/":
            pattern_text, _, replacement_text = _split_replacement(pattern_text)
        pattern = self.pattern(pattern_text, line)
        if isinstance(pattern, Unresolved):
            return pattern
        replacement = "" if replacement_text is None else self.value(operand_parts(replacement_text, True, line), line)
        if isinstance(replacement, Unresolved):
            return replacement
        if replacement_text is not None and "&" in replacement_text:
            return Unresolved("a replacement holding & (bash 5.2 puts the match there) is not read", line)
        changed = tuple(_apply_pattern(element, operator, pattern, replacement) for element in elements)
        return _pieces_of(changed if isinstance(value, tuple) else changed[0], quoted, separate=True)

    def pattern(self, text: str, line: int) -> "re.Pattern[str] | Unresolved":
        """A bash pattern as a regular expression: `*`, `?` and `[...]` where unquoted, the rest literal."""
        regex: list[str] = []
        for part in operand_parts(text, quoted=False, line=line):
            pieces = self._pieces((part,), line)
            if isinstance(pieces, Unresolved):
                return pieces
            piece_text = _joined(pieces)
            if not part.quoted:  # unquoted text and expansions are patterns; quoted ones are literal
                regex.append(_glob_to_regex(piece_text))
            else:
                regex.append(re.escape(piece_text))
        return re.compile("".join(regex), re.S)

    def _arithmetic_lookup(self, line: int) -> Lookup:
        def lookup(name: str) -> str:
            value = self.variables.get(name)
            if value is None:
                raise arithmetic.Unknown(_set_nowhere(name, line))
            if isinstance(value, Unresolved):
                raise arithmetic.Unknown(value)
            return value if isinstance(value, str) else (value[0] if value else "")

        return lookup


# ----------------------------------------------------------------------------------------------- helpers


def _gives_elements(source: str) -> bool:
    """`$@`, `${@...}` and `${NAME[@]...}`: expansions that give one word per element even when quoted."""
    return source == "$@" or source.startswith("${@") or bool(re.match(r"\$\{\w+\[@\]", source))


def _set_nowhere(name: str, line: int) -> Unresolved:
    if name.isdigit():
        why = f"${name} is the script's argument {name}; the converter reads the script as run with none"
        return Unresolved(why, line)
    return Unresolved(f"${name} is set neither in the script nor in the environment", line)


def _separate(name: str, subscript: str | None, quoted: bool) -> bool:
    """Whether an array's elements stay separate words: `[@]` and `$@` always, `[*]` and `$*` unquoted."""
    star = name == "*" or subscript == "*"
    return (name == "@" or subscript == "@") or (star and not quoted)


def _text(text: str, quoted: bool) -> Pieces:
    return [_Piece(text, split=not quoted, exists=quoted or bool(text))]


def _pieces_of(value: str | tuple[str, ...], quoted: bool, separate: bool) -> Pieces:
    """A value as pieces: a string; an array's elements as separate fields (`separate`: `[@]`, unquoted `[*]`), or
    joined by a space ("${A[*]}")."""
    if isinstance(value, str):
        return _text(value, quoted)
    if not separate:
        return _text(" ".join(value), quoted)
    out: Pieces = []
    for position, element in enumerate(value):
        if position:
            out.append(_BREAK)
        out.extend(_text(element, quoted))
    return out


def _joined(pieces: Pieces) -> str:
    """Pieces as one string (no splitting): array elements joined by a space."""
    return "".join(" " if piece is _BREAK else piece.text for piece in pieces)


def _split(pieces: Pieces) -> list[str]:
    """bash's word splitting: unquoted expansion results cut at blanks; array elements apart; empty
    unquoted expansions gone."""
    fields: list[str] = []
    current: list[str] = []
    exists = False

    def end_field() -> None:
        nonlocal current, exists
        if exists:
            fields.append("".join(current))
        current, exists = [], False

    for piece in pieces:
        if piece is _BREAK:
            end_field()
        elif not piece.split:
            current.append(piece.text)
            exists = exists or piece.exists
        elif piece.text:
            if piece.text[0] in " \t\n":
                end_field()
            for position, chunk in enumerate(piece.text.split()):
                if position:
                    end_field()
                current.append(chunk)
                exists = True
            if piece.text[-1] in " \t\n":
                end_field()
    end_field()
    return fields


_ASSIGNMENT_HEAD = re.compile(r"[A-Za-z_]\w*\+?=")


def _with_tilde(parts: tuple[Part, ...], after_equals: bool = True) -> tuple[Part, ...]:
    """A tilde prefix (`~` before a `/` or at the word's end) becomes `${HOME}`: at the start of a word and, in a
    word shaped NAME=value, at the start of the value and after each unquoted `:` (array elements, `after_equals`
    False, only at their start). bash(1), Tilde Expansion."""
    if not parts or not isinstance(parts[0], Literal) or parts[0].quoted:
        return parts
    head = _ASSIGNMENT_HEAD.match(parts[0].text) if after_equals else None
    out: list[Part] = []
    for index, part in enumerate(parts):
        if not isinstance(part, Literal) or part.quoted:
            out.append(part)
            continue
        text, last = part.text, index == len(parts) - 1
        starts = [0] if index == 0 and head is None else []
        if head is not None:
            begin = head.end() if index == 0 else 0
            starts = ([begin] if index == 0 else []) + [
                i + 1 for i, char in enumerate(text) if char == ":" and i >= begin
            ]
        cursor = 0
        for start in starts:
            after = text[start + 1 : start + 2]
            if text[start : start + 1] == "~" and (after == "/" or (head and after == ":") or (not after and last)):
                out += [Literal(text[cursor:start], quoted=False), Expansion("${HOME}", quoted=True)]
                cursor = start + 1
        out.append(Literal(text[cursor:], quoted=False))
    return tuple(part for part in out if not (isinstance(part, Literal) and not part.text and not part.quoted))


def _split_replacement(text: str) -> tuple[str, str, str | None]:
    """`pattern/replacement` at the first unescaped, unquoted `/`."""
    position, quote = 0, ""
    while position < len(text):
        char = text[position]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "\\":
            position += 1
        elif char == "/":
            return text[:position], "/", text[position + 1 :]
        position += 1
    return text, "", None


def _glob_to_regex(text: str) -> str:
    out, position = [], 0
    while position < len(text):
        char = text[position]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and "]" in text[position + 2 :]:
            end = text.index("]", position + 2)
            body = text[position + 1 : end]
            out.append("[" + ("^" + body[1:] if body[:1] in "!^" else body).replace("\\", "\\\\") + "]")
            position = end
        elif char == "\\" and position + 1 < len(text):
            position += 1
            out.append(re.escape(text[position]))
        else:
            out.append(re.escape(char))
        position += 1
    return "".join(out)


def _apply_pattern(subject: str, operator: str, pattern: "re.Pattern[str]", replacement: str) -> str:
    if operator in ("#", "##"):
        lengths = range(len(subject) + 1) if operator == "#" else range(len(subject), -1, -1)
        cut = next((n for n in lengths if pattern.fullmatch(subject, 0, n)), 0)
        return subject[cut:]
    if operator in ("%", "%%"):
        starts = range(len(subject), -1, -1) if operator == "%" else range(len(subject) + 1)
        cut = next((n for n in starts if pattern.fullmatch(subject, n)), len(subject))
        return subject[:cut]
    if operator == "/#":
        for n in range(len(subject), -1, -1):
            if pattern.fullmatch(subject, 0, n):
                return replacement + subject[n:]
        return subject
    if operator == "/%":
        for n in range(len(subject) + 1):
            if pattern.fullmatch(subject, n):
                return subject[:n] + replacement
        return subject
    if not pattern.pattern:
        return subject
    return pattern.sub(lambda _: replacement, subject, count=0 if operator == "//" else 1)
