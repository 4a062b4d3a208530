"""The `hf` rollout engine: a Hugging Face causal LM and a batched, KV-cached sampling loop.

Our own loop rather than `model.generate` because a run must replay: every call draws from a
`torch.Generator` seeded by the caller (from step and rank), and the log-probability of each
sampled token comes back with it.
"""

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from kuberl.runtime.engines.base import Generation, SamplingParams, SleepState
from kuberl.runtime.engines.sampling import sample_tokens, seeded_generator


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Prompts as one left-padded tensor and its mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, P)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
    return ids, mask


def cut_at_stop_string(token_ids: list[int], stop: tuple[str, ...], decode) -> int | None:
    """Tokens to keep so the text ends before the first stop string, or None if none occurs."""
    if not stop or not any(s in decode(token_ids) for s in stop):
        return None
    for keep in range(1, len(token_ids) + 1):
        text = decode(token_ids[:keep])
        if any(s in text for s in stop):
            return keep
    return None


class HFRolloutEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device | str = "cpu") -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_id = tokenizer.eos_token_id
        self.sleep_state = SleepState()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        self.sleep_state.require_awake("generate")
        rows = [prompt for prompt in prompts for _ in range(params.n)]
        if not rows:
            return []
        generator: torch.Generator | list[torch.Generator] = seeded_generator(params.seed, self.device)
        if params.row_seeds:
            if params.n != 1 or len(params.row_seeds) != len(prompts):
                raise ValueError("row_seeds needs n = 1 and one seed per prompt")
            generator = [seeded_generator(seed, self.device) for seed in params.row_seeds]
        tokens, logprobs, lengths = self._sample(rows, params, generator)
        stop_ids = {self.eos_id, *params.stop_token_ids} - {None}
        out: list[Generation] = []
        for row in range(len(rows)):
            ids = tokens[row, : lengths[row]].tolist()
            lps = logprobs[row, : lengths[row]].tolist()
            reason = "stop" if ids and ids[-1] in stop_ids else "length"
            keep = cut_at_stop_string(ids, params.stop, self.tokenizer.decode)
            if keep is not None:
                ids, lps, reason = ids[:keep], lps[:keep], "stop"
            out.append(Generation(ids, lps, reason))
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _sample(
        self, rows: list[list[int]], params: SamplingParams, generator: torch.Generator | list[torch.Generator]
    ) -> tuple[Tensor, Tensor, list[int]]:
        ids, mask = left_pad(rows, self.pad_id)  # (B, P)
        ids, mask = ids.to(self.device), mask.to(self.device)
        batch = ids.shape[0]
        stop_ids = torch.tensor(sorted({self.eos_id, *params.stop_token_ids} - {None}), device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]  # (B, V)
        tokens = torch.full((batch, params.max_new_tokens), self.pad_id, dtype=torch.long)  # (B, R)
        logprobs = torch.zeros((batch, params.max_new_tokens))  # (B, R)
        done = torch.zeros(batch, dtype=torch.bool)  # (B,)
        lengths = torch.zeros(batch, dtype=torch.long)  # (B,)
        limits = torch.tensor(params.row_max_new_tokens or [params.max_new_tokens] * batch)  # (B,)
        next_position = positions[:, -1:] + 1  # (B, 1)
        for step in range(params.max_new_tokens):
            chosen, chosen_lp = sample_tokens(
                logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, generator=generator
            )  # (B,), (B,)
            chosen, chosen_lp = chosen.cpu(), chosen_lp.cpu()
            live = ~done  # (B,)
            tokens[live, step] = chosen[live]
            logprobs[live, step] = chosen_lp[live]
            lengths += live.long()
            done |= live & (torch.isin(chosen, stop_ids.cpu()) | (lengths >= limits))
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            feed = torch.where(done, torch.full_like(chosen, self.pad_id), chosen).to(self.device)  # (B,)
            mask = torch.cat([mask, (~done).long()[:, None].to(self.device)], dim=1)  # (B, P+step+1)
            out = self.model(
                input_ids=feed[:, None],
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1]  # (B, V)
            next_position = next_position + 1
        return tokens, logprobs, lengths.tolist()

    @torch.no_grad()
    def response_logprobs(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        self.sleep_state.require_awake("response_logprobs")
        ids = torch.tensor([prompt + response], device=self.device)  # (1, P+R)
        logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (R, V)
        if temperature > 0:
            logits = logits / temperature
        target = torch.tensor(response, device=self.device)  # (R,)
        return logits.log_softmax(-1).gather(-1, target[:, None]).squeeze(-1).tolist()

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        self.sleep_state.require_awake("load_weights", ("weights",))
        return copy_into(dict(self.model.named_parameters()), weights, "parameter")

    def load_adapter(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """Copy LoRA adapter tensors (saved-adapter names, `models.lora.adapter_name`) into this engine's
        PEFT model in place; returns the bytes loaded. The model must be wrapped with the same LoRA config."""
        from kuberl.runtime.models.lora import adapter_name, is_trainable_name

        self.sleep_state.require_awake("load_adapter", ("weights",))
        targets = {adapter_name(name): p for name, p in self.model.named_parameters() if is_trainable_name(name)}
        if not targets:
            raise RuntimeError("load_adapter: the hf engine's model has no LoRA adapter (spec.models.actor.lora)")
        return copy_into(targets, weights, "adapter tensor")

    def sleep(self, level: int) -> int:
        """On a GPU the weights go to host memory until `wake_up` (at either level: this engine's KV cache lives
        only inside `generate`, and its weights are kept to be written in place); returns the device bytes that
        freed. Off the GPU nothing moves, and the engine only records that it sleeps."""
        if not self.sleep_state.fall_asleep() or self.device.type != "cuda":
            return 0
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self.model.to("cpu")
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(self.device)[0] - free_before)

    def wake_up(self, tags: Sequence[str] = SleepState.PARTS) -> None:
        """The parts of `tags` that sleep, awake: the weights back on the device."""
        if "weights" in self.sleep_state.wake(tags) and self.device.type == "cuda":
            self.model.to(self.device)


@torch.no_grad()
def copy_into(targets: Mapping[str, Tensor], weights: Iterable[tuple[str, Tensor]], what: str) -> int:
    """Copy each named tensor into the target of that name in place; returns the bytes copied."""
    loaded = 0
    for name, tensor in weights:
        target = targets.get(name)
        if target is None:
            raise KeyError(f"the rollout model has no {what} {name!r}")
        target.copy_(tensor)
        loaded += tensor.numel() * tensor.element_size()
    return loaded
