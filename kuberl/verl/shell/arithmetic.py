"""bash's integer arithmetic, `$((expression))` and `((expression))`, evaluated without running anything.

It follows bash(1), ARITHMETIC EVALUATION: 64-bit signed integers; the operators, by precedence, unary `- + ! ~`,
`**` (right to left, after the unary minus: `-2**2` is 4), `* / %` (truncating toward zero: `-7/2` is -3),
`+ -`, `<< >>`, `< <= > >=`, `== !=`, `&`, `^`, `|`, `&&`, `||` (both short-circuit), `?:` and `,`;
numbers in decimal, `0x` hex, `0` octal and `base#digits`; a name stands for its value, itself evaluated as an
expression (an empty value is 0).

Where bash stops the script (division by 0, a negative exponent, a name that refers to itself, bad syntax) this
raises ScriptError naming the line. Where bash would give a number the converter cannot vouch for, it raises
Unknown, and the value is unresolved: a name set nowhere (bash reads 0), a result past 64 bits (bash wraps it
silently), and assignments inside the expression (`x = 1`, `i++`), which the converter does not perform.
Everything is bounded: parentheses and name references 32 deep, 10,000 operations per expression.

    >>> values = {"n": "4", "m": "n * 2", "e": ""}
    >>> [evaluate(text, values.__getitem__, 1) for text in ("(n + m) / 3", "-2**2", "-7 / 2", "e + 010", "2#101")]
    [4, 4, -3, 8, 5]
"""

import re
from collections.abc import Callable
from typing import Any

from kuberl.verl.shell.errors import ScriptError

MAX_DEPTH = 32
MAX_OPERATIONS = 10_000
LOWEST, HIGHEST = -(2**63), 2**63 - 1


class Unknown(Exception):
    """A value the converter cannot know without running the script; the message says why."""


#: A name's value as text; raises Unknown when the script leaves it unknown.
Lookup = Callable[[str], str]

_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+#[0-9A-Za-z@_]+|0[xX][0-9a-fA-F]+|\d+)|(?P<name>[A-Za-z_]\w*)|"
    r"(?P<op>\*\*=|<<=|>>=|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^]=|[-+*/%<>&|^!~?:,()=\[\]]))"
)
_ASSIGNING = {"=", "++", "--", "*=", "/=", "%=", "+=", "-=", "<<=", ">>=", "&=", "^=", "|=", "**=", "["}
#: Binary operators by precedence, lowest first (`**` and the unary ones are parsed apart).
_BINARY_LEVELS = (("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="), ("<<", ">>"))
_ADDITIVE, _MULTIPLICATIVE = ("+", "-"), ("*", "/", "%")
_LEVELS = (*_BINARY_LEVELS, _ADDITIVE, _MULTIPLICATIVE)


def evaluate(expression: str, lookup: Lookup, line: int) -> int:
    """The value of a bash arithmetic expression (see the module docstring)."""
    try:
        return _Evaluator(lookup, line, expression).value_of(expression, depth=0)
    except RecursionError:  # a long chain of operators, each a level of the tree: past Python's stack
        raise ScriptError(f"{expression[:80]}: an expression longer than the converter reads", line) from None


def integer(text: str, line: int) -> int:
    """A bash number: decimal, `0x` hex, `0` octal or `base#digits`.

    >>> integer("0x1F", 1), integer("017", 1), integer("16#ff", 1), integer("64#_", 1)
    (31, 15, 255, 63)
    """
    if "#" in text:
        base_text, digits = text.split("#", 1)
        base = int(base_text)
        if not 2 <= base <= 64:
            raise ScriptError(f"{text}: invalid arithmetic base", line)
    elif text[:2] in ("0x", "0X"):
        base, digits = 16, text[2:]
    elif len(text) > 1 and text[0] == "0":
        base, digits = 8, text[1:]
    else:
        base, digits = 10, text
    value = 0
    for digit in digits:
        worth = _digit_value(digit, base)
        if worth >= base:
            raise ScriptError(f"{text}: value too great for base", line)
        value = value * base + worth
    return _in_range(value, text)


def _digit_value(digit: str, base: int) -> int:
    if digit.isdigit():
        return int(digit)
    if digit.islower():
        return ord(digit) - ord("a") + 10
    if digit.isupper():
        return ord(digit) - ord("A") + (36 if base > 36 else 10)
    return {"@": 62, "_": 63}[digit]


def _in_range(value: int, text: str) -> int:
    if not LOWEST <= value <= HIGHEST:
        raise Unknown(f"$(({text})) overflows bash's 64-bit integers, which bash wraps around without a word")
    return value


def _tokens(expression: str, line: int) -> list[str]:
    out, position, expression = [], 0, expression.rstrip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None or match.end() == position:
            raise ScriptError(
                f"{expression}: syntax error in expression (error token is {expression[position:]!r})", line
            )
        out.append(match.group(match.lastgroup or "op"))
        position = match.end()
    assigning = [token for token in out if token in _ASSIGNING]
    if assigning:
        raise Unknown(f"$(({expression})) assigns ({assigning[0]}), which the converter does not do")
    return out


class _Evaluator:
    def __init__(self, lookup: Lookup, line: int, top: str) -> None:
        self.lookup, self.line, self.top, self.operations = lookup, line, top, 0

    def _name(self, name: str, depth: int) -> int:
        if depth >= MAX_DEPTH:
            why = f"{name}: expression recursion level exceeded (its value names itself, directly or through others)"
            raise ScriptError(why, self.line)
        return self.value_of(self.lookup(name), depth + 1)

    def value_of(self, expression: str, depth: int) -> int:
        tokens = _tokens(expression, self.line)
        if not tokens:
            return 0
        parser = _Parser(tokens, expression, self.line)
        tree = parser.expression(0)
        if parser.position != len(tokens):
            raise ScriptError(
                f"{expression}: syntax error in expression (error token is {tokens[parser.position]!r})", self.line
            )
        return self._run(tree, self.top, depth)

    def _run(self, node: Any, text: str, depth: int) -> int:
        self.operations += 1
        if self.operations > MAX_OPERATIONS:
            raise ScriptError(f"{self.top}: more than {MAX_OPERATIONS} operations; the converter stops here", self.line)
        kind = node[0]
        if kind == "number":
            return integer(node[1], self.line)
        if kind == "name":
            return self._name(node[1], depth)
        if kind == "unary":
            value = self._run(node[2], text, depth)
            return _in_range({"-": -value, "+": value, "!": int(value == 0), "~": ~value}[node[1]], text)
        if kind == "ternary":
            chosen = node[2] if self._run(node[1], text, depth) else node[3]
            return self._run(chosen, text, depth)
        operator, left_node, right_node = node[1], node[2], node[3]
        left = self._run(left_node, text, depth)
        if operator == "&&" and not left:
            return 0
        if operator == "||" and left:
            return 1
        right = self._run(right_node, text, depth)
        return _in_range(self._binary(operator, left, right, text), text)

    def _binary(self, operator: str, left: int, right: int, text: str) -> int:
        if operator in ("/", "%") and right == 0:
            raise ScriptError(f"{text}: division by 0", self.line)
        if operator == "**":
            if right < 0:
                raise ScriptError(f"{text}: exponent less than 0", self.line)
            return _power(left, right, text)
        if operator in ("<<", ">>") and not 0 <= right < 64:
            raise Unknown(f"$(({text})) shifts by {right}, which bash takes modulo 64")
        quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1) if right else 0
        return {
            "+": lambda: left + right,
            "-": lambda: left - right,
            "*": lambda: left * right,
            "/": lambda: quotient,  # C's division, toward zero
            "%": lambda: left - right * quotient,  # its remainder takes the dividend's sign
            "<<": lambda: left << right,
            ">>": lambda: left >> right,
            "<": lambda: int(left < right),
            "<=": lambda: int(left <= right),
            ">": lambda: int(left > right),
            ">=": lambda: int(left >= right),
            "==": lambda: int(left == right),
            "!=": lambda: int(left != right),
            "&": lambda: left & right,
            "^": lambda: left ^ right,
            "|": lambda: left | right,
            "&&": lambda: int(bool(right)),
            "||": lambda: int(bool(right)),
            ",": lambda: right,
        }[operator]()


def _power(base: int, exponent: int, text: str) -> int:
    """base ** exponent by squaring, stopping as soon as a step leaves 64 bits (9**9**9 returns at once)."""
    result = 1
    while exponent:
        if exponent & 1:
            result = _in_range(result * base, text)
        exponent >>= 1
        if exponent:
            base = _in_range(base * base, text)
    return result


class _Parser:
    """Precedence climbing over the tokens into tuples: ("number", text), ("name", name), ("unary", op, operand),
    ("binary", op, left, right), ("ternary", condition, then, else)."""

    def __init__(self, tokens: list[str], text: str, line: int) -> None:
        self.tokens, self.text, self.line, self.position, self.depth = tokens, text, line, 0, 0

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            found = "the end" if token is None else repr(token)
            raise ScriptError(
                f"{self.text}: syntax error in expression ({expected or 'an operand'} expected, {found} found)",
                self.line,
            )
        self.position += 1
        return token

    def expression(self, level: int) -> Any:
        """level 0 is `,`; 1 the ternary; 2.. the binary levels; past them `**` and the unary operators."""
        if level == 0:
            node = self.expression(1)
            while self._peek() == ",":
                self._take()
                node = ("binary", ",", node, self.expression(1))
            return node
        if level == 1:
            condition = self.expression(2)
            if self._peek() != "?":
                return condition
            self._take()
            then = self._nested(lambda: self.expression(0))
            self._take(":")
            return ("ternary", condition, then, self._nested(lambda: self.expression(1)))
        if level - 2 < len(_LEVELS):
            node = self.expression(level + 1)
            while self._peek() in _LEVELS[level - 2]:
                operator = self._take()
                node = ("binary", operator, node, self.expression(level + 1))
            return node
        return self._power()

    def _power(self) -> Any:
        base = self._unary()
        if self._peek() == "**":
            self._take()
            return ("binary", "**", base, self._nested(self._power))
        return base

    def _nested(self, parse: Callable[[], Any]) -> Any:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ScriptError(f"{self.text}: expression nests deeper than {MAX_DEPTH}", self.line)
        try:
            return parse()
        finally:
            self.depth -= 1

    def _unary(self) -> Any:
        token = self._peek()
        if token in ("-", "+", "!", "~"):
            self._take()
            return ("unary", token, self._nested(self._unary))
        if token == "(":
            self._take()
            node = self._nested(lambda: self.expression(0))
            self._take(")")
            return node
        token = self._take()
        if token[0].isdigit():
            return ("number", token)
        if token[0].isalpha() or token[0] == "_":
            return ("name", token)
        raise ScriptError(f"{self.text}: syntax error in expression (error token is {token!r})", self.line)
