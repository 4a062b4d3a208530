"""The rollout engine interface: what the controller needs from anything that generates.

Two engines implement it: `hf` (Hugging Face model, our own sampling loop) and `vllm`. In
colocated mode an engine lives in each actor worker process and receives the trainer's
weights in place after every update (`load_weights`, tensor by tensor).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 256
    n: int = 1  # responses per prompt
    stop_token_ids: tuple[int, ...] = ()  # ends a response (the token is kept, as eos is)
    stop: tuple[str, ...] = ()  # ends a response at the first occurrence (the string is cut off)
    seed: int = 0  # the whole call's randomness derives from it: same seed, same prompts -> same responses
    #: One seed per prompt (n must be 1): prompt i draws from a stream of its own, so its response does not
    #: depend on which other prompts share the call (multi-turn episodes are batched as they become ready).
    row_seeds: tuple[int, ...] = ()
    #: One token budget per prompt (at most max_new_tokens each); empty: max_new_tokens for every prompt.
    row_max_new_tokens: tuple[int, ...] = ()


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log π_engine of each sampled token under the sampling temperature
    finish_reason: str = "length"  # "stop" (eos / stop token / stop string) or "length"
    meta: dict[str, float] = field(default_factory=dict)
    cached_tokens: int = 0  # prompt tokens the engine served from its prefix cache (vllm)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """`params.n` generations for each prompt, in prompt order."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """Copy named full tensors into the engine's model in place; returns the bytes loaded."""
        ...

    def load_adapter(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """LoRA runs: copy the adapter's tensors (saved-adapter names) into the engine; generation uses them."""
        ...

    def response_logprobs(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        """log π_engine(response | prompt), token by token: the probe for `rollout.verifySync`."""
        ...

    def sleep(self) -> None:
        """Release generation memory while the trainer runs (vLLM on GPU); a no-op elsewhere."""
        ...

    def wake_up(self) -> None: ...
