"""A reward model: a sequence-classification model whose single logit scores prompt + completion.

The scorer concatenates prompt and completion as text, tokenizes with right padding and reads
the logit at the last non-pad token (AutoModelForSequenceClassification does that from the
config's pad_token_id). Scores do not depend on the batch size: padding sits after every
sequence's last real token, which causal attention never lets that token see.
"""

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from kuberl.runtime.models.dtypes import torch_dtype


class RewardModelScorer:
    """Scores (prompt, completion) pairs with a sequence-classification model (num_labels=1)."""

    def __init__(self, path: Path, dtype: str = "float32", batch_size: int = 16, device: str = "cpu") -> None:
        weights_dtype = torch_dtype(dtype, "reward model dtype")
        if batch_size < 1:
            raise ValueError(f"reward model batch_size {batch_size}; must be >= 1")
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=weights_dtype)
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward model {path} has num_labels={self.model.config.num_labels}; "
                "a reward model has one output (num_labels=1)"
            )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device).eval()

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One float per pair; completions[i] answers prompts[i]."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions; they must pair up")
        texts = [prompt + completion for prompt, completion in zip(prompts, completions, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size], padding=True, return_tensors="pt", add_special_tokens=True
            ).to(self.device)
            logits = self.model(**batch).logits  # (B, 1)
            scores.extend(logits[:, 0].float().tolist())
        return scores
