"""Environments whose actions are tool calls: each call is answered with the tool's result, and the
first message without a call is the model's answer, which ends the episode.

A tool is a method `tool_<name>(self, **arguments) -> ToolResult` named in `tool_schemas`. A call that
could not be read, names no tool, has the wrong arguments or whose tool raises is answered with an error
the model reads (env/tool_errors); it never ends the episode.
"""

from dataclasses import dataclass
from typing import Any

from kuberl.runtime.environments.base import Environment, Message, ModelTurn, Observation, Role, ToolCall, tool_names


@dataclass(frozen=True)
class ToolResult:
    text: str
    error: bool = False  # the call failed: the model reads the text as an error


class ToolEnvironment(Environment):
    def step(self, turn: ModelTurn) -> Observation:
        if turn.call_error is not None:
            counts = {"tool_calls": 1.0, "tool_errors": 1.0, "malformed_calls": 1.0}
            return Observation.error(turn.call_error, metrics=counts)
        if not turn.tool_calls:
            return Observation.end()
        results = [self.call(call) for call in turn.tool_calls]
        errors = sum(result.error for result in results)
        messages = tuple(Message(Role.ERROR if r.error else Role.TOOL, r.text) for r in results)
        return Observation(messages, metrics={"tool_calls": float(len(results)), "tool_errors": float(errors)})

    def call(self, call: ToolCall) -> ToolResult:
        """One call's result; a call the tool cannot take is an error result, not an exception."""
        known = tool_names(type(self))
        if call.name not in known:
            return ToolResult(f"there is no tool {call.name!r}; the tools are: {', '.join(known)}", error=True)
        method = getattr(self, f"tool_{call.name}")
        try:
            return method(**call.arguments)  # type: ignore[no-any-return]
        except TypeError as error:  # arguments the tool does not take
            return ToolResult(f"tool {call.name!r} cannot take these arguments: {error}", error=True)


def function_schema(name: str, description: str, parameters: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI-style function schema, as chat templates render tools."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": parameters, "required": required},
        },
    }
