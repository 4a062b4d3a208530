"""Qwen2.5-0.5B and -1.5B architectures with random weights, built here from their configs (nothing downloaded).

The shapes are those of the published config.json files (hidden size, layers, heads, KV heads, MLP
width, the 151,936-token vocabulary, tied embeddings, q/k/v biases, RoPE theta 1e6). The tokenizer is
kuberl's tiny byte-level BPE (512 tokens): the benchmarks feed token ids, so only its EOS/pad ids
matter, and a real Qwen tokenizer would need a download.

Also the FLOP count an update costs, for MFU (model FLOPs utilisation, PaLM's definition, Chowdhery
et al. 2022, appendix B): 6 x (matmul parameters) per token for forward + backward, plus 12 x layers x
hidden x sequence length per token for attention; the embedding lookup is not a matmul, the (tied)
LM head is.
"""

import json
from dataclasses import dataclass
from pathlib import Path

#: Shapes of the published Qwen2.5 base models (config.json).
QWEN25: dict[str, dict[str, int]] = {
    "0.5B": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "1.5B": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
}
COMMON = {
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
}
#: Dense bf16 peak of one GPU, by a substring of torch.cuda.get_device_name() (vendors' data sheets, SXM parts).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_parameters(self) -> int:
        """One decoder block: q/k/v (with biases), o, the SwiGLU MLP, two RMSNorms."""
        kv = self.kv_heads * self.head_dim
        attention = (self.hidden * self.hidden + self.hidden) + 2 * (self.hidden * kv + kv) + self.hidden * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def parameters(self) -> int:
        """All parameters, the tied embedding counted once (0.5B: 494,032,768; 1.5B: 1,543,714,304)."""
        return self.vocab * self.hidden + self.layers * self.layer_parameters + self.hidden

    @property
    def matmul_parameters(self) -> int:
        """Parameters a token multiplies through: the blocks' linear layers and the LM head (not the lookup)."""
        return self.layers * (self.layer_parameters - 2 * self.hidden) + self.vocab * self.hidden


def shape(size: str) -> Shape:
    if size not in QWEN25:
        raise KeyError(f"unknown Qwen2.5 size {size!r}; known: {', '.join(QWEN25)}")
    c = QWEN25[size]
    return Shape(
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        COMMON["vocab_size"],
    )


def update_flops(s: Shape, sequences: int, sequence_length: int) -> float:
    """FLOPs of one forward + backward over `sequences` x `sequence_length` tokens (PaLM's MFU count)."""
    tokens = sequences * sequence_length
    return 6.0 * s.matmul_parameters * tokens + 12.0 * s.layers * s.hidden * sequence_length * tokens


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of the named GPU, or None for one not in the table."""
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in device_name), None)


def qwen25_config(size: str):
    from transformers import Qwen2Config

    return Qwen2Config(**QWEN25[size], **COMMON, architectures=["Qwen2ForCausalLM"], dtype="bfloat16")


def smoke_config():
    """A Qwen2 of the same layout with a few thousand parameters and the tiny tokenizer's 512 tokens: the suite's
    `--smoke` run on a CPU."""
    from transformers import Qwen2Config

    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    return Qwen2Config(**{**COMMON, **small, "num_key_value_heads": 2, "vocab_size": 512, "dtype": "float32"})


def build_model(config, directory: Path, device: str = "cuda") -> Path:
    """A folder with the model of `config` (random weights, seeded, in its dtype), the tiny tokenizer and a
    generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    from kuberl.runtime.models.tiny import EOS_TOKEN, build_tiny_tokenizer

    if (directory / "config.json").is_file():
        return directory
    tokenizer = build_tiny_tokenizer(512)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = None, eos, eos
    torch.manual_seed(0)
    dtype = getattr(torch, str(config.dtype).removeprefix("torch."))  # a name or a torch.dtype, by version
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # not Qwen2Tokenizer: the tiny tokenizer as saved
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    GenerationConfig(eos_token_id=eos, pad_token_id=eos).save_pretrained(directory)
    return directory
