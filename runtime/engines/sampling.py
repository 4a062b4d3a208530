"""Token sampling shared by the engines: temperature, top-k, top-p, from a seeded generator."""

import torch
from torch import Tensor


def generator_device(device: torch.device) -> torch.device:
    """Where the random stream of sampling on `device` must live: torch draws on a GPU only from a generator on
    that GPU, and on the CPU from a CPU one.

    >>> generator_device(torch.device("cuda", 1)), generator_device(torch.device("cpu"))
    (device(type='cuda', index=1), device(type='cpu'))
    """
    return device if device.type == "cuda" else torch.device("cpu")


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator for sampling on `device`, seeded: the same seed replays the same draws on the same device."""
    return torch.Generator(device=generator_device(device)).manual_seed(seed)


def filter_logits(logits: Tensor, *, top_k: int | None, top_p: float) -> Tensor:
    """Logits with everything outside the top-k / nucleus set to -inf."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (B, V)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)  # (B, V)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)  # (B, V)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p  # (B, V)
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # (B, V)
    return logits


def sample_tokens(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float,
    generator: torch.Generator | list[torch.Generator],
) -> tuple[Tensor, Tensor]:
    """Next tokens and their log-probabilities under the temperature-scaled (unfiltered) distribution.

    The log-probability is the one the trainer computes (log_softmax(logits / T)), so the engine's
    and the trainer's numbers are comparable; top-k/top-p only restrict what may be drawn. A list of
    generators gives row i a random stream of its own (generator[i]).
    """
    logits = logits.float()  # (B, V)
    if temperature == 0:
        tokens = logits.argmax(-1)  # (B,)
        logprobs = logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
        return tokens, logprobs
    scaled = logits / temperature  # (B, V)
    probs = filter_logits(scaled, top_k=top_k, top_p=top_p).softmax(-1)  # (B, V)
    if isinstance(generator, list):
        rows = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generator)]  # B x (1,)
        tokens = torch.cat(rows)  # (B,)
    else:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    logprobs = scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
    return tokens, logprobs
