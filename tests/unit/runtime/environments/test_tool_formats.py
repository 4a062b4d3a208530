"""Tool calls read out of messages and observations written back, in both documented formats.

A malformed call never raises: it becomes `call_error`, which a ToolEnvironment answers with an
error observation the model reads, and the episode goes on.
"""

import copy

import pytest

from kuberl.runtime.environments import Message, ModelTurn, Observation, Role, ToolCall
from kuberl.runtime.environments.base import EnvironmentSettings
from kuberl.runtime.environments.python import PythonEnvironment
from kuberl.runtime.environments.tool_formats import (
    ChatTemplateFormat,
    TaggedFormat,
    ToolFormatError,
    tool_format_for,
)
from kuberl.runtime.models.tiny import build_tiny_tokenizer

TAGGED = TaggedFormat({"python": "code", "search": "query"})

#: Qwen2.5's chat template, the parts that matter here: tools in the system prompt, tool results as
#: <tool_response> blocks in one user turn.
QWEN_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\nTools: ' + tools|map(attribute='function.name')|join(',') + "
    '\'. Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\\n\' }}{%- endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def plain():
    """The tiny models' tokenizer: ChatML, no tools."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def qwen_like(plain):
    tokenizer = copy.deepcopy(plain)
    tokenizer.chat_template = QWEN_LIKE
    tokenizer.eos_token = "<|im_end|>"  # as in Qwen2.5-Instruct: a message ends with it
    return tokenizer


# -- tagged ---------------------------------------------------------------------------------------------
def test_a_tagged_call_is_read_with_its_body_as_the_tools_first_argument() -> None:
    turn = TAGGED.read("let me check <python>print(37 * 48)</python>")
    assert turn.tool_calls == (ToolCall("python", {"code": "print(37 * 48)"}),) and turn.call_error is None


def test_the_first_tagged_call_wins_and_a_message_without_one_is_an_answer() -> None:
    assert TAGGED.read("<search>x</search> <python>1</python>").tool_calls[0].name == "search"
    assert TAGGED.read("the answer is 1776").tool_calls == ()


def test_an_unclosed_tag_is_a_call_error_that_says_why() -> None:
    turn = TAGGED.read("<python>while True:", cut=True)
    assert turn.tool_calls == ()
    assert turn.call_error == "the call <python> was not closed with </python> (the message reached its token budget)"


def test_the_tagged_format_stops_each_message_at_a_closing_tag() -> None:
    assert TAGGED.stop == ("</python>", "</search>")


def test_tagged_observations_wrap_results_and_errors_and_leave_user_replies_alone() -> None:
    messages = [Message(Role.TOOL, "1776"), Message(Role.ERROR, "ZeroDivisionError"), Message(Role.USER, " ok")]
    assert TAGGED.render(messages, turn_closed=True) == "<output>1776</output><error>ZeroDivisionError</error> ok"


# -- chat template --------------------------------------------------------------------------------------
def test_the_chat_template_format_is_chosen_only_with_a_tool_call_template(qwen_like, plain) -> None:
    assert isinstance(tool_format_for(PythonEnvironment, qwen_like, chat_template=True), ChatTemplateFormat)
    assert isinstance(tool_format_for(PythonEnvironment, qwen_like, chat_template=False), TaggedFormat)
    assert isinstance(tool_format_for(PythonEnvironment, plain, chat_template=True), TaggedFormat)


def test_json_tool_calls_are_read_in_order(qwen_like) -> None:
    text = (
        '<tool_call>\n{"name": "python", "arguments": {"code": "1 + 1"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}</tool_call>'
    )
    turn = ChatTemplateFormat(qwen_like).read(text)
    assert turn.tool_calls == (ToolCall("python", {"code": "1 + 1"}), ToolCall("python", {"code": "2"}))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "python", "arguments": {"code": 1</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'a JSON object with a "name"'),
        ('<tool_call>["python"]</tool_call>', 'a JSON object with a "name"'),
        ('<tool_call>{"name": "python", "arguments": "[1]"}</tool_call>', "are not a JSON object"),
        ('<tool_call>{"name": "python", "arguments": {"co', "was not closed with </tool_call>"),
    ],
)
def test_a_malformed_json_call_is_a_call_error(qwen_like, text, error) -> None:
    turn = ChatTemplateFormat(qwen_like).read(text)
    assert turn.tool_calls == () and error in (turn.call_error or "")


def test_chat_observations_are_what_the_template_writes_after_a_closed_message(qwen_like) -> None:
    results = [Message(Role.TOOL, "4"), Message(Role.ERROR, "NameError")]
    text = ChatTemplateFormat(qwen_like).render(results, turn_closed=True)
    # the model wrote <|im_end|> itself; the template's newline after it and the tool turn follow
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\nerror: NameError\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_message_cut_by_its_budget_is_closed_by_the_observation(qwen_like) -> None:
    text = ChatTemplateFormat(qwen_like).render([Message(Role.USER, "go on")], turn_closed=False)
    assert text == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_history_is_refused_with_what_to_do(plain) -> None:
    tokenizer = copy.deepcopy(plain)
    tokenizer.chat_template = (  # drops every message but the last: an observation cannot be appended
        "<tool_call>{{ messages[-1].content }}{% if add_generation_prompt %}>{% endif %}"
    )
    with pytest.raises(ToolFormatError, match="data.chatTemplate: false"):
        ChatTemplateFormat(tokenizer).render([Message(Role.TOOL, "4")], turn_closed=True)


# -- answering calls ------------------------------------------------------------------------------------
def test_a_malformed_call_is_answered_with_an_error_observation_not_an_exception() -> None:
    environment = PythonEnvironment({}, EnvironmentSettings())
    observation = environment.step(ModelTurn("<python>1 +", call_error="the call <python> was not closed"))
    assert not observation.done
    assert observation.messages == (Message(Role.ERROR, "the call <python> was not closed"),)
    assert observation.metrics == {"tool_calls": 1.0, "tool_errors": 1.0, "malformed_calls": 1.0}


def test_calls_to_unknown_tools_or_with_wrong_arguments_are_errors_the_model_reads() -> None:
    environment = PythonEnvironment({}, EnvironmentSettings())
    unknown = environment.step(ModelTurn("", (ToolCall("bash", {"cmd": "ls"}),)))
    assert unknown.messages[0].role == Role.ERROR and "there is no tool 'bash'" in unknown.messages[0].text
    wrong = environment.step(ModelTurn("", (ToolCall("python", {"source": "1"}),)))
    assert wrong.messages[0].role == Role.ERROR and "cannot take these arguments" in wrong.messages[0].text
    assert wrong.metrics == {"tool_calls": 1.0, "tool_errors": 1.0}


def test_a_message_without_a_call_ends_a_tool_episode() -> None:
    assert PythonEnvironment({}, EnvironmentSettings()).step(ModelTurn(" 1776")) == Observation.end()
