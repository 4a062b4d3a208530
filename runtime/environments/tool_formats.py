"""Tool calls in and observations out: how a message becomes a `ModelTurn`, and an `Observation` text.

Two formats, one per job, chosen by `tool_format_for`:

- `chat_template` — when data.chatTemplate is true and the tokenizer's chat template has a tool-call
  format (Qwen2.5, Hermes and their relatives: it writes `<tool_call>`). The model writes

      <tool_call>
      {"name": "python", "arguments": {"code": "print(37 * 48)"}}
      </tool_call><|im_end|>

  and each result comes back as a `tool` message rendered by the template itself (Qwen2.5:
  `<|im_start|>user\\n<tool_response>\\n1776\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`).
  A message ends at the model's end-of-turn token; several calls in one message are answered in order.

- `tagged` — for models without one (the tiny models): `<NAME>argument</NAME>` for each tool NAME, the
  body filling the tool's first required parameter; the message ends at the closing tag. Results are
  written `<output>...</output>`, errors `<error>...</error>`, user replies as they are.

      37 * 48 = <python>37 * 48</python><output>1776</output> 1776<|endoftext|>

Both read the text the model wrote; a call that cannot be read (an unclosed tag, JSON that does not
parse, a call without a name) becomes `ModelTurn.call_error`, which the environment answers with an
error observation. Where this follows verl: observations are tokenized on their own and appended to
the episode's token ids ("token in, token out"), never by re-tokenizing the whole conversation, and
chat-template observations are the difference between a template rendering with and without them
(verl's tool agent loop does the same with a fixed base conversation).
"""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kuberl.runtime.environments.base import Environment, Message, ModelTurn, Role, ToolCall, main_argument

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolFormatError(ValueError):
    """The tokenizer's chat template cannot render observations; the message says what to do."""


class ToolFormat(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def stop(self) -> tuple[str, ...]:
        """Strings that end a message (the tagged format stops at a call's closing tag)."""
        ...

    def read(self, text: str, cut: bool) -> ModelTurn: ...

    def render(self, messages: Sequence[Message], turn_closed: bool) -> str:
        """The text that follows the model's message: its observation, ready for the model's next turn.

        `turn_closed`: the message ended with the tokenizer's end-of-turn token (chat templates).
        """
        ...


@dataclass(frozen=True)
class TaggedFormat:
    tools: dict[str, str]  # tool name -> the parameter a call's body fills
    name: str = "tagged"

    @property
    def stop(self) -> tuple[str, ...]:
        return tuple(f"</{tool}>" for tool in self.tools)

    def read(self, text: str, cut: bool = False) -> ModelTurn:
        """The first `<tool>...</tool>` in `text`, or no call.

        >>> TaggedFormat({"python": "code"}).read("so <python>2 + 2</python>").tool_calls
        (ToolCall(name='python', arguments={'code': '2 + 2'}),)
        >>> TaggedFormat({"python": "code"}).read("<python>2 +", cut=True).call_error
        'the call <python> was not closed with </python> (the message reached its token budget)'
        """
        opened = [(text.find(f"<{tool}>"), tool) for tool in self.tools if f"<{tool}>" in text]
        if not opened:
            return ModelTurn(text, cut=cut)
        start, tool = min(opened)
        body_start = start + len(tool) + 2
        end = text.find(f"</{tool}>", body_start)
        if end < 0:
            why = " (the message reached its token budget)" if cut else ""
            return ModelTurn(text, call_error=f"the call <{tool}> was not closed with </{tool}>{why}", cut=cut)
        return ModelTurn(text, (ToolCall(tool, {self.tools[tool]: text[body_start:end]}),), cut=cut)

    def render(self, messages: Sequence[Message], turn_closed: bool = True) -> str:
        """
        >>> TaggedFormat({"python": "code"}).render([Message(Role.TOOL, "4"), Message(Role.ERROR, "bad")])
        '<output>4</output><error>bad</error>'
        """
        parts = []
        for message in messages:
            if message.role == Role.TOOL:
                parts.append(f"<output>{message.text}</output>")
            elif message.role == Role.ERROR:
                parts.append(f"<error>{message.text}</error>")
            else:
                parts.append(message.text)
        return "".join(parts)


class ChatTemplateFormat:
    """Hermes-style <tool_call> JSON in, tool messages rendered by the tokenizer's own chat template out."""

    name = "chat_template"
    stop: tuple[str, ...] = ()

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        self.end_of_turn: str = eos if isinstance(eos, str) else ""
        base = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
        self._base = base
        self._before = self._render(base, add_generation_prompt=False)
        # what the template writes after an assistant message's content (e.g. "<|im_end|>\n")
        self._closing = self._before[self._before.rindex("A") + 1 :]

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        return str(text)

    def read(self, text: str, cut: bool = False) -> ModelTurn:
        blocks = _TOOL_CALL.findall(text)
        if text.count("<tool_call>") > len(blocks):
            why = " (the message reached its token budget)" if cut else ""
            return ModelTurn(text, call_error=f"a <tool_call> was not closed with </tool_call>{why}", cut=cut)
        calls = []
        for block in blocks:
            call = _parse_json_call(block)
            if isinstance(call, str):
                return ModelTurn(text, call_error=call, cut=cut)
            calls.append(call)
        return ModelTurn(text, tuple(calls), cut=cut)

    def render(self, messages: Sequence[Message], turn_closed: bool) -> str:
        chat = [_chat_message(message) for message in messages]
        after = self._render(self._base + chat, add_generation_prompt=True)
        if not after.startswith(self._before):
            raise ToolFormatError(
                "the tokenizer's chat template rewrites earlier messages when tool results follow, so an "
                "observation cannot be appended to the episode's tokens; set data.chatTemplate: false to use "
                "the tagged tool format"
            )
        closing = self._closing
        if turn_closed and self.end_of_turn and closing.startswith(self.end_of_turn):
            closing = closing[len(self.end_of_turn) :]  # the model wrote its end-of-turn token itself
        return closing + after[len(self._before) :]


def _chat_message(message: Message) -> dict[str, str]:
    if message.role == Role.USER:
        return {"role": "user", "content": message.text}
    text = f"error: {message.text}" if message.role == Role.ERROR else message.text
    return {"role": "tool", "content": text}


def _parse_json_call(block: str) -> ToolCall | str:
    """A call from a <tool_call> block's JSON, or what is wrong with it."""
    try:
        call = json.loads(block)
    except json.JSONDecodeError as error:
        return f"the tool call is not valid JSON ({error.msg} at character {error.pos})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call is a JSON object with a "name" and "arguments"'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"the arguments of tool call {call['name']!r} are not a JSON object"
    if not isinstance(arguments, dict):
        return f"the arguments of tool call {call['name']!r} are not a JSON object"
    return ToolCall(call["name"], arguments)


def has_tool_call_template(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "<tool_call>" in template


def tool_format_for(environment: type[Environment], tokenizer: Any, chat_template: bool) -> ToolFormat:
    """The chat template's format when the job renders prompts with one that knows tool calls, else tagged."""
    if chat_template and has_tool_call_template(tokenizer):
        return ChatTemplateFormat(tokenizer)
    return TaggedFormat({schema["function"]["name"]: main_argument(schema) for schema in environment.tool_schemas})
