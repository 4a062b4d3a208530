"""What an environment is: built from a dataset record, it reads the model's messages and answers them.

    class Guess(Environment):                      # name it in a manifest as my_envs.games:Guess
        def __init__(self, sample, settings):
            super().__init__(sample, settings)
            self.secret = int(sample["secret"])
        def step(self, turn):                      # one model message in, one observation out
            guess = int(turn.text.split()[-1])
            if guess == self.secret:
                return Observation.end()
            return Observation.user("higher" if guess < self.secret else "lower")
        def reward(self, final):                   # at the end; None lets spec.reward score `final`
            return 1.0 if final.text.split()[-1] == str(self.secret) else 0.0

One instance lives for one episode, in one environment worker (a Ray actor of the reward pool),
and is called from one thread at a time. It never sees tokens: the rollout reads tool calls out of
the model's message (`ModelTurn.tool_calls`) and renders observations for the model's tokenizer.
An exception from `step` or `reward` fails the episode (a failed sample, like a failed reward),
so an environment raises only for its own bugs: a bad tool call is an `Observation.error` the
model reads.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: which tool, with which arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelTurn:
    """One message of the model, as the environment reads it."""

    text: str  # the message, special tokens left out
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the tool-call format read out of `text`
    call_error: str | None = None  # a call that could not be read (malformed JSON, an unclosed tag): why
    cut: bool = False  # the message was cut by its token budget rather than ended by the model


class Role(StrEnum):
    """Who speaks in an observation's message; the tool-call format renders each kind its own way."""

    TOOL = "tool"  # a tool's result
    ERROR = "error"  # a call that failed or could not be read; the model reads it in place of a result
    USER = "user"  # a user's (or a simulator's) reply


@dataclass(frozen=True)
class Message:
    role: Role
    text: str


@dataclass(frozen=True)
class Observation:
    """What the environment answers to a model turn: messages for the model, or the end of the episode."""

    messages: tuple[Message, ...] = ()
    done: bool = False
    #: Counts summed over the step's episodes into metrics as env/<name> (e.g. tool_calls, tool_errors).
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def tool(cls, *results: str, metrics: dict[str, float] | None = None) -> "Observation":
        return cls(tuple(Message(Role.TOOL, text) for text in results), metrics=metrics or {})

    @classmethod
    def user(cls, text: str, metrics: dict[str, float] | None = None) -> "Observation":
        return cls((Message(Role.USER, text),), metrics=metrics or {})

    @classmethod
    def error(cls, text: str, metrics: dict[str, float] | None = None) -> "Observation":
        return cls((Message(Role.ERROR, text),), metrics=metrics or {})

    @classmethod
    def end(cls, metrics: dict[str, float] | None = None) -> "Observation":
        return cls((), done=True, metrics=metrics or {})


@dataclass(frozen=True)
class EnvironmentSettings:
    """The parts of spec.environment an environment may read."""

    max_turns: int = 4
    tool_timeout_seconds: float = 10.0
    tool_memory_mib: int = 512


class Environment:
    """One episode. Subclass it and implement `step` (and `reward` if the environment scores the episode)."""

    #: Tools the model may call, as OpenAI-style function schemas: rendered into chat-template prompts, and
    #: their names are what the tagged format reads (<name>argument</name>, the first required parameter).
    tool_schemas: ClassVar[tuple[dict[str, Any], ...]] = ()
    #: Whether the worker must prove at start that it can sandbox code (kuberl.runtime.sandbox).
    needs_sandbox: ClassVar[bool] = False

    def __init__(self, sample: dict[str, Any], settings: EnvironmentSettings) -> None:
        self.sample = sample
        self.settings = settings

    def step(self, turn: ModelTurn) -> Observation:
        """The answer to the model's message; `Observation.end()` ends the episode."""
        raise NotImplementedError

    def reward(self, final: ModelTurn) -> float | tuple[float, dict[str, float]] | None:
        """The episode's reward once it ended (`final`: the model's last message), or None: spec.reward scores it."""
        return None

    def close(self) -> None:
        """Release what the episode holds; called once, after `reward`."""


def tool_names(environment: type[Environment]) -> tuple[str, ...]:
    return tuple(schema["function"]["name"] for schema in environment.tool_schemas)


def main_argument(schema: dict[str, Any]) -> str:
    """The parameter a tagged call's body fills: the function's first required parameter."""
    parameters = schema["function"].get("parameters", {})
    required = parameters.get("required") or list(parameters.get("properties", {}))
    if not required:
        raise ValueError(f"tool {schema['function']['name']!r} has no parameter for a tagged call's body")
    return str(required[0])
