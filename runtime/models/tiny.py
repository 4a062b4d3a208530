"""Tiny models kuberl builds locally (`tiny://NAME`): the demo, the tests and the CPU benchmarks need no download.

A tiny model is a complete Hugging Face folder — config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with a ChatML chat template), generation_config.json — that
`AutoTokenizer`, `AutoModelForCausalLM` and vLLM load like any other. The weights are random
(seeded from the name), so two builds of one name are byte-identical and every machine that
builds `tiny://demo` gets the same model (a pretrained one, below, repeats on one machine).

The tokenizer is byte-level BPE trained at build time on a corpus generated here. Byte-level,
not WordLevel, because it never meets an unknown character and decodes back to exactly the
text it encoded (spaces, newlines, the chat template's special tokens); a whitespace
WordLevel tokenizer would turn "count: 3" into "count : 3" and lose every newline. The
corpus is dominated by the numbers 0..99, each preceded by a space, so BPE spends its merges
on them first and " 0" .. " 99" are one token each: the demo task (continue "count: 3 4 5"
with " 6 7 8") is then a token-to-token mapping a 1M-parameter model learns in minutes.

The architecture is Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention: Qwen2 without the
q/k/v biases), not Qwen2, for one reason: transformers 5 loads every `model_type: qwen2`
folder with its own Qwen2Tokenizer, which replaces the saved pre-tokenizer with Qwen's regex
that splits every digit apart (" 15" -> " ", "1", "5"). A random model would then almost never
emit a whole number and the demo reward would start at ~0. With `model_type: llama` and
`tokenizer_class: PreTrainedTokenizerFast`, AutoTokenizer (and vLLM, which calls it) uses
tokenizer.json exactly as saved.

`tiny://counter` is the demo model pretrained for a few seconds on counting text
(`models/pretrain.py`): the demo's RL starts from a model that can read its task, as real RL
starts from an instruct model. Its build takes ~20 s once; `resolve_model_path` caches it.

`tiny://tool-demo` is the demo's shape fine-tuned for a few minutes, once, on the python tool's call
format (`models/tiny_tool.py`): the actor of examples/agent-python-tool.yaml. Its weights repeat on
one machine; other CPUs may differ in the last bits.

    python -c "from pathlib import Path; from kuberl.runtime.models.tiny import build_tiny_model; \
build_tiny_model('demo', Path('/tmp/tiny-demo'))"
"""

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from kuberl.runtime.models.pretrain import PretrainingSpec, pretrain
from kuberl.runtime.models.tiny_tool import TOOL_RECIPE, teach_tool_format

#: Bump when anything here or in pretrain.py changes what a build writes: cached builds are keyed by it.
BUILDER_VERSION = "2"

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Ids 0, 1, 2 in that order: the BPE trainer places special tokens first.
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)

#: ChatML, as Qwen2 uses it, without Qwen's default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: English-ish filler for the tokenizer corpus: common words plus those of the built-in rewards' formats.
_WORDS: tuple[str, ...] = tuple(
    "the a an is of to and in that it for on with as was at by be this are from or have not but what all "
    "were when we there can your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where "
    "most know count next number numbers answer question think step so total sum add plus minus times equals "
    "user assistant system hello hi yes".split()
)
_FORMATS = ("<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "}", "####", "$", "%", "=", "+", "-", "*", "/")


@dataclass(frozen=True)
class TinyModelConfig:
    """The shape of one tiny model. head_dim = hidden_size / num_heads is kept >= 32 (vLLM's CPU attention minimum)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head: Literal["causal_lm", "sequence_classification"] = "causal_lm"
    vocab_size: int = 512
    max_position_embeddings: int = 1024
    description: str = ""
    #: Trained after the random initialisation (None: random weights, built in a second).
    pretraining: PretrainingSpec | None = None


TINY_MODELS: dict[str, TinyModelConfig] = {
    # ~1.0M parameters: 4 x (attention 49k + MLP 197k) + tied embeddings 66k.
    "demo": TinyModelConfig(128, 4, 4, 2, 512, description="~1M-parameter Llama for the CPU demo and tests"),
    # ~25M parameters: 8 x (attention 0.79M + MLP 2.36M) + tied embeddings 0.26M.
    "small": TinyModelConfig(
        512, 8, 8, 4, 1536, max_position_embeddings=4096, description="~25M-parameter Llama for benchmarks"
    ),
    # The demo's shape after ~20 s of pretraining on counting text: the demo's actor (see pretrain.py).
    "counter": TinyModelConfig(
        128,
        4,
        4,
        2,
        512,
        pretraining=PretrainingSpec(corpus="counting", steps=200),
        description="~1M-parameter Llama pretrained to count: the actor of the CPU demo",
    ),
    # The demo shape fine-tuned at build time on the python tool's call format (models/tiny_tool.py); the
    # description names the recipe's version, so a change to the recipe rebuilds it (the cache key reads it).
    "tool-demo": TinyModelConfig(
        128, 4, 4, 2, 512, description=f"~1M-parameter Llama that calls the python tool (recipe {TOOL_RECIPE})"
    ),
    # The demo backbone with a scalar head (num_labels=1) and the demo tokenizer: a reward model for tests.
    "reward-demo": TinyModelConfig(
        128, 4, 4, 2, 512, head="sequence_classification", description="~1M-parameter Llama reward model"
    ),
}


def name_seed(name: str) -> int:
    """A 63-bit seed derived from a model name, the same on every machine and Python process."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1


def tokenizer_corpus() -> list[str]:
    """The text the tokenizer is trained on: the demo task's numbers and words, chat markup, English-ish filler."""
    rng = random.Random(0)
    numbers = ["numbers: " + " ".join(str(n) for n in range(start, 100)) for start in range(0, 100, 10)]
    counting = [f"count: {a} {a + 1} {a + 2}" for a in range(98)]
    # The chat template's roles; its special tokens are added tokens and need no merges.
    chat = [f"{role}\n" for role in ("system", "user", "assistant")]
    filler = [
        " ".join(rng.choice(_WORDS + _FORMATS) for _ in range(12)).capitalize() + rng.choice(".?!:\n")
        for _ in range(400)
    ]
    # Numbers are repeated so their merges (" 1" + "2" -> " 12") outrank every English pair.
    return numbers * 40 + counting * 4 + chat * 20 + filler


def build_tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Trains the byte-level BPE tokenizer (deterministic: a fixed corpus and a sorted alphabet) and wraps it."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(tokenizer_corpus(), trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def llama_config(config: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert isinstance(eos_id, int)
    classifier = config.head == "sequence_classification"
    llama = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        # A classifier has no LM head to tie; a tied LM head saves vocab x hidden parameters.
        tie_word_embeddings=not classifier,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
        architectures=["LlamaForSequenceClassification" if classifier else "LlamaForCausalLM"],
    )
    llama.num_labels = 1  # the reward model's single score; unused by the causal LM
    return llama


def build_tiny_model(name: str, directory: Path) -> Path:
    """Writes the tiny model `name` as a Hugging Face folder into `directory` and returns `directory`.

    Deterministic: the same name gives byte-identical weights (a pretrained model: on the same machine).
    The global torch RNG is left as it was.
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(sorted(TINY_MODELS))}")
    config = TINY_MODELS[name]
    tokenizer = build_tiny_tokenizer(config.vocab_size)
    hf_config = llama_config(config, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(name_seed(name))
        model_class = LlamaForSequenceClassification if config.head == "sequence_classification" else LlamaForCausalLM
        model: PreTrainedModel = model_class(hf_config)
        if config.pretraining is not None:
            pretrain(model, tokenizer, config.pretraining, seed=name_seed(name))
        elif name == "tool-demo":
            teach_tool_format(model, tokenizer, seed=name_seed(name))
    directory.mkdir(parents=True, exist_ok=True)
    # transformers saves nothing but the tokenizer on a rank other than 0 of an initialised process group. A
    # trainer rank on a pod of its own builds a copy of its own in its own cache, so whoever builds it saves it.
    model.should_save_on_this_rank = lambda is_main_process: True  # type: ignore[method-assign]
    model.save_pretrained(directory)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where older readers look.
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    _name_tokenizer_class(directory / "tokenizer_config.json")
    if config.head == "causal_lm":
        im_end = tokenizer.convert_tokens_to_ids(IM_END)
        generation = GenerationConfig(  # type: ignore[no-untyped-call]
            eos_token_id=[hf_config.eos_token_id, im_end], pad_token_id=hf_config.pad_token_id, do_sample=True
        )
        generation.save_pretrained(directory)
    return directory


def _name_tokenizer_class(tokenizer_config: Path) -> None:
    """Names the generic fast tokenizer, so every transformers version loads tokenizer.json as saved.

    transformers 5 writes its own class name, TokenizersBackend, which transformers 4 does not know.
    """
    settings = json.loads(tokenizer_config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
