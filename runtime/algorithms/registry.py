"""Name -> function registries for the algorithm library.

The controller never branches on an algorithm's name: it looks the advantage estimator, policy
loss, KL estimator and loss aggregation up here by the string the user wrote in the RLJob
(`spec.algorithm.*`). The names are the values of the enums in `kuberl.api.enums`, and a unit
test keeps the two in step.

As in verl's `core_algos.py`, functions join a registry with a decorator, registering a name twice
is an error, and looking up an unknown name fails with the list of known ones.
"""

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from kuberl.runtime.algorithms.advantages import AdvantageFn
    from kuberl.runtime.algorithms.kl import KLFn
    from kuberl.runtime.algorithms.losses import AggregationFn, PolicyLossFn

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError):
    """A registry lookup of a name nobody registered; the message lists the names that exist."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.kind = kind
        self.name = name
        self.known = known

    def __str__(self) -> str:
        # KeyError's own __str__ would print repr(name) only; say what kind of name and what exists.
        return f"unknown {self.kind} {self.name!r}; known: {', '.join(self.known)}"


def _key(name: str) -> str:
    """The registry key of a name: a StrEnum member counts as its value."""
    return name.value if isinstance(name, Enum) else name


class Registry(Generic[F]):
    """Functions of one kind (e.g. "advantage estimator"), keyed by the name users write in YAML."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that files the function under `name`; a name can be registered once only."""
        key = _key(name)

        def decorate(function: F) -> F:
            if key in self._functions:
                existing = self._functions[key]
                raise ValueError(
                    f"{self.kind} {key!r} is already registered (by {existing.__module__}.{existing.__qualname__}); "
                    "pick another name"
                )
            self._functions[key] = function
            return function

        return decorate

    def get(self, name: str) -> F:
        key = _key(name)
        try:
            return self._functions[key]
        except KeyError:
            raise UnknownNameError(self.kind, key, self.names()) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._functions)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _key(name) in self._functions

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


ADVANTAGE_ESTIMATORS: "Registry[AdvantageFn]" = Registry("advantage estimator")
POLICY_LOSSES: "Registry[PolicyLossFn]" = Registry("policy loss")
KL_ESTIMATORS: "Registry[KLFn]" = Registry("KL estimator")
LOSS_AGGREGATIONS: "Registry[AggregationFn]" = Registry("loss aggregation")
