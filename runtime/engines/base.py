"""The rollout engine interface: what the controller needs from anything that generates.

Two engines implement it: `hf` (Hugging Face model, our own sampling loop) and `vllm`. In
colocated mode an engine lives in each actor worker process and receives the trainer's
weights in place after every update (`load_weights`, tensor by tensor).

A colocated engine sleeps while the trainer's passes run and wakes in the sync: its weights before they
are written, its KV cache before it generates. Every engine keeps that order with a `SleepState`, on every
device: on a GPU breaking it would write into freed memory or generate without a cache, and on the CPU,
where sleeping frees nothing, it fails the same way, so the tests here hold the colocated step to it.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

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

    def sleep(self, level: int) -> int:
        """Release the engine's device memory while the trainer runs; returns the bytes freed (0 off the GPU).

        Level 1 offloads the weights to host memory and drops the KV cache; level 2 drops the weights too, for an
        engine whose every weight the next sync reloads (vLLM's sleep levels).
        """
        ...

    def wake_up(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        """Take back what `sleep` released: the `weights` (before a sync writes them) and the `kv_cache`."""
        ...


class EngineAsleepError(RuntimeError):
    """An engine was asked to generate, score or take weights while the part of it that needs is asleep."""


class SleepState:
    """Which parts of an engine sleep: its `weights` and its `kv_cache` (vLLM's wake-up tags)."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "kv_cache")

    def __init__(self) -> None:
        self.asleep: set[str] = set()

    def fall_asleep(self) -> bool:
        """Every part asleep; False when it was asleep already (nothing more to release)."""
        was_awake = not self.asleep
        self.asleep = set(self.PARTS)
        return was_awake

    def wake(self, tags: Sequence[str]) -> list[str]:
        """The parts of `tags` that were asleep, awake now (in the order asked)."""
        unknown = sorted(set(tags) - set(self.PARTS))
        if unknown:
            raise ValueError(f"wake_up: unknown tags {unknown}; an engine wakes {', '.join(self.PARTS)}")
        woken = [tag for tag in tags if tag in self.asleep]
        self.asleep -= set(woken)
        return woken

    def require_awake(self, what: str, parts: Sequence[str] = PARTS) -> None:
        asleep = [part for part in parts if part in self.asleep]
        if asleep:
            raise EngineAsleepError(
                f"{what}: the engine's {' and '.join(asleep)} {'is' if len(asleep) == 1 else 'are'} asleep; "
                f"wake_up({tuple(asleep)!r}) first"
            )
