"""The baselines of the trainer rows: what a careful engineer writes in plain PyTorch (and PEFT) for the same step.

- `PlainUpdate`: the model in fp32 (or PEFT's adapters over a bf16 frozen base) under bf16 autocast, fused
  AdamW, gradient clipping at 1.0, and the loss kuberl's on-policy GRPO update computes on the same batch: the
  token-mean policy gradient -A * pi / sg(pi) over the response tokens (PPO's clipped surrogate at ratio 1).
  Micro-batches of the same size; everything moved to the device once; no read of a value in the loop.
- `plain_logprobs`: a no-grad forward and the response tokens' log-probs, as the reference pass.
"""

from typing import Any

import torch
from torch import Tensor


def _autocast(device: torch.device) -> Any:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _response_logprobs(model: torch.nn.Module, ids: Tensor, mask: Tensor, labels: Tensor, width: int) -> Tensor:
    """(m, R) log pi of `labels` (m, R) after a prompt of `width` columns; fp32 from bf16 logits."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (m, P+R)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    logits = logits[:, width - 1 : -1].float()  # (m, R, V)
    return logits.gather(-1, labels[..., None]).squeeze(-1) - logits.logsumexp(-1)  # (m, R)


class PlainUpdate:
    """One optimiser step of the token-mean policy gradient over a batch, in plain PyTorch."""

    def __init__(self, model: torch.nn.Module, device: torch.device, micro: int, lr: float = 1e-6) -> None:
        self.model = model.to(device).train()
        self.device = device
        self.micro = micro
        self.parameters = [param for param in self.model.parameters() if param.requires_grad]
        fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
        self.optimizer = torch.optim.AdamW(self.parameters, lr=lr, **fused)

    def __call__(self, batch: Any) -> None:
        device, width = self.device, batch.prompt_ids.shape[1]
        ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)  # (n, P+R)
        labels, response_mask = batch.response_ids.to(device), batch.response_mask.to(device)  # (n, R)
        advantages = batch.advantages.to(device)  # (n, R)
        tokens = response_mask.sum().clamp(min=1)  # ()
        for start in range(0, len(batch), self.micro):
            rows = slice(start, start + self.micro)
            with _autocast(device):
                logprobs = _response_logprobs(self.model, ids[rows], mask[rows], labels[rows], width)  # (m, R)
            ratio = torch.exp(logprobs - logprobs.detach())  # (m, R) 1, with pi's gradient
            loss = -(advantages[rows] * ratio * response_mask[rows]).sum() / tokens  # ()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def plain_logprobs(model: torch.nn.Module, batch: Any, device: torch.device, micro: int) -> Tensor:
    """(n, R) the response tokens' log-probs, micro-batch by micro-batch, on the device."""
    model.eval()
    width = batch.prompt_ids.shape[1]
    ids, mask, labels = batch.input_ids.to(device), batch.attention_mask.to(device), batch.response_ids.to(device)
    parts = []
    for start in range(0, len(batch), micro):
        rows = slice(start, start + micro)
        with _autocast(device):
            parts.append(_response_logprobs(model, ids[rows], mask[rows], labels[rows], width))
    return torch.cat(parts)  # (n, R)


def peft_model(model_dir: Any, device: torch.device, rank: int, alpha: int) -> torch.nn.Module:
    """Plain PEFT: LoRA on every linear layer but the head, over a frozen base in bf16 on a GPU (fp32 off it);
    PEFT keeps the adapters in fp32 (autocast_adapter_dtype)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(base, config).to(device)
