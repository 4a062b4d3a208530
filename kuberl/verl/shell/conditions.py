"""bash's tests on known strings: `test` / `[ ... ]` and `[[ ... ]]`, decided without touching the system.

>>> shell = Expander({})
>>> decide(["a", "=", "a", "-a", "-n", ""], shell, 1, double=False), decide(["-f", "x"], shell, 1, double=True)
(False, None)
"""

import operator
import re

from kuberl.verl.shell.errors import ScriptError
from kuberl.verl.shell.expand import Expander, Unresolved

#: An exit status: True (0), False (not 0) or None (the converter cannot tell).
Status = bool | None

_UNARY = {"-z": lambda value: value == "", "-n": lambda value: value != ""}
_STRING = {"=": str.__eq__, "==": str.__eq__, "!=": str.__ne__, "<": str.__lt__, ">": str.__gt__}
_INTEGER = {"-eq": "==", "-ne": "!=", "-lt": "<", "-le": "<=", "-gt": ">", "-ge": ">="}
_COMPARISONS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class Operand(str):
    """A `[[` operand that came from a quoted or expanded word: never an operator, whatever its text (bash parses
    `[[ ... ]]` before it expands)."""


Term = str | re.Pattern[str]


def decide(terms: list[Term], expander: Expander, line: int, double: bool) -> Status:
    """A test's value, or None when it needs what the converter cannot know (a file, an unknown value)."""
    return _Test(terms, expander, line, double).decide()


def is_operator(term: Term | None, *operators: str) -> bool:
    """Whether the term is one of the operators as written (an Operand never is)."""
    return isinstance(term, str) and not isinstance(term, Operand) and term in operators


class _Test:
    """test(1) / bash's conditional expressions over known strings: `! ( ) -a -o` (`[`) or `! ( ) && ||` (`[[`),
    `-z -n`, `= == != < >`, `-eq -ne -lt -le -gt -ge`. File tests and the rest are undecided (None)."""

    def __init__(self, terms: list[Term], expander: Expander, line: int, double: bool) -> None:
        self.terms, self.position, self.expander, self.line, self.double = terms, 0, expander, line, double
        self.and_, self.or_ = ("&&", "||") if double else ("-a", "-o")

    def decide(self) -> Status:
        if not self.terms:
            return False
        try:
            value = self._or()
        except (IndexError, ValueError):
            return None
        return value if self.position == len(self.terms) else None

    def _at(self, ahead: int = 0) -> Term | None:
        index = self.position + ahead
        return self.terms[index] if index < len(self.terms) else None

    def _or(self) -> Status:
        value = self._and()
        while is_operator(self._at(), self.or_):
            self.position += 1
            right = self._and()
            value = True if value is True or right is True else (None if None in (value, right) else False)
        return value

    def _and(self) -> Status:
        value = self._not()
        while is_operator(self._at(), self.and_):
            self.position += 1
            right = self._not()
            value = False if value is False or right is False else (None if None in (value, right) else True)
        return value

    def _not(self) -> Status:
        if is_operator(self._at(), "!") and self._at(1) is not None:
            self.position += 1
            value = self._not()
            return None if value is None else not value
        if is_operator(self._at(), "("):
            self.position += 1
            value = self._or()
            if not is_operator(self._at(), ")"):
                raise ValueError("( without )")
            self.position += 1
            return value
        return self._primary()

    def _primary(self) -> Status:
        first, following = self.terms[self.position], self._at(1)
        if is_operator(following, "=~"):  # an extended regular expression: POSIX's, not Python's
            self.position += 3
            return None
        if is_operator(following, *_STRING, *_INTEGER):
            assert isinstance(following, str)
            left, right = first, self.terms[self.position + 2]
            self.position += 3
            if isinstance(left, re.Pattern):
                raise ValueError("a pattern on the left")
            if isinstance(right, re.Pattern):  # [[ x == pattern ]]
                if following not in ("=", "==", "!="):
                    raise ValueError("a pattern beside < or >")
                return bool(right.fullmatch(left)) == (following != "!=")
            if following in _STRING:
                return bool(_STRING[following](left, right))
            return self._compare(left, _INTEGER[following], right)
        if isinstance(first, re.Pattern) or isinstance(following, re.Pattern):
            raise ValueError("a pattern out of place")
        if is_operator(first, *_UNARY) and following is not None:
            self.position += 2
            return bool(_UNARY[first](following))
        if not isinstance(first, Operand) and first.startswith("-") and len(first) == 2 and following is not None:
            self.position += 2
            return None  # -f, -d, -e, ...: the file system is not the converter's to read
        self.position += 1
        return first != ""

    def _compare(self, left: str, operator: str, right: str) -> Status:
        values = []
        for operand in (left, right):
            if self.double:
                value = self.expander.arithmetic(operand, self.line)
                if isinstance(value, Unresolved):
                    return None
            elif re.fullmatch(r"\s*[-+]?\d+\s*", operand):
                value = int(operand)
            else:
                raise ScriptError(f"{operand}: integer expression expected", self.line)
            values.append(value)
        return bool(_COMPARISONS[operator](values[0], values[1]))
