"""tiny://tool-demo's demonstrations: the episode the rollout would build, trained only where the model wrote."""

import pytest

from kuberl.runtime.models.tiny import build_tiny_tokenizer
from kuberl.runtime.models.tiny_tool import demonstration


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_a_tool_demonstration_trains_the_call_and_the_answer_never_the_prompt_or_the_output(tokenizer):
    ids, trained = demonstration(tokenizer, 37, 48, use_tool=True)
    model_text = tokenizer.decode([t for t, mine in zip(ids, trained, strict=True) if mine])
    context_text = tokenizer.decode([t for t, mine in zip(ids, trained, strict=True) if not mine])
    assert model_text == "<python>( 37 * 48)</python>1776<|endoftext|>"
    assert context_text == "multiply: 37 48<output>1776</output>"
    # each part tokenized on its own, as the episode rollout appends them
    output = tokenizer("<output>1776</output>", add_special_tokens=False)["input_ids"]
    assert ids[-1 - 4 - len(output) : -1 - 4] == output


def test_an_answer_in_its_head_is_one_message(tokenizer):
    ids, trained = demonstration(tokenizer, 37, 48, use_tool=False)
    assert tokenizer.decode(ids) == "multiply: 37 48 1776<|endoftext|>"
    assert tokenizer.decode([t for t, mine in zip(ids, trained, strict=True) if mine]) == " 1776<|endoftext|>"
