"""A short supervised pretraining for tiny models, so RL starts from a model that can read the task.

Real RL post-training starts from a model that already writes the language of the task (an
instruct model); only the reward's preferences are new to it. `tiny://counter` is built that way:
the demo's architecture and tokenizer, then `PretrainingSpec.steps` steps of next-token training
on counting text, run once when the model is first resolved and cached with it.

The corpus (`counting_document`) is runs of consecutive numbers from anywhere in 0..99, of random
length, each ending with the end-of-text token:

    count: 41 42 43 44 45 46 47<|endoftext|>

So the pretrained model continues a count and knows that a text ends, but not where the demo task
wants it to end: the task (`rewards.builtin.tiny_task`) pays only for exactly the next three
numbers, and the corpus's runs go on for 1 to `max_continuation` numbers past the three a prompt
shows. Measured on the demo's prompts (its first step, sampling at temperature 1): a mean reward
of 0.49 and responses of ~7 tokens, 14% of them cut at the 12-token limit. What RL teaches is the
task's own rule, stop after three, and the counting it still gets wrong.

Departs from how instruct models are made in one way: no chat template and no instructions, only
the raw text format the demo's prompts use (`data.chatTemplate: false`).

Deterministic for one machine and thread count: documents from `random.Random(seed)`, weights from
`torch.manual_seed(seed)`, one thread. Other CPUs may differ in the last bits of the float
arithmetic, so two machines' builds of `tiny://counter` are close, not byte-identical.
"""

import math
import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

#: Threads the pretraining uses, fixed so one machine's builds repeat exactly. One: on a busy 2-core machine
#: two OpenMP threads took ~10 min where one took 26 s (at a load of ~10; the threads wait on each other).
PRETRAINING_THREADS = 1


@dataclass(frozen=True)
class PretrainingSpec:
    """How a tiny model is pretrained: its corpus and the optimiser's schedule."""

    corpus: str  # a key of CORPORA
    steps: int
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    #: The longest run past the three numbers a prompt shows.
    max_continuation: int = 12


def counting_document(rng: random.Random, max_continuation: int) -> str:
    """A run of consecutive numbers below 100: three, then 1..max_continuation more (fewer near 99).

    >>> counting_document(random.Random(0), 12)
    'count: 49 50 51 52 53 54 55 56 57 58'
    """
    start = rng.randrange(0, 97)
    length = 3 + rng.randint(1, max_continuation)
    return "count: " + " ".join(str(number) for number in range(start, min(start + length, 100)))


CORPORA = {"counting": counting_document}


def corpus_batches(spec: PretrainingSpec, seed: int) -> list[list[str]]:
    """`spec.steps` batches of `spec.batch_size` documents, the same for the same seed."""
    rng = random.Random(seed)
    document = CORPORA[spec.corpus]
    return [[document(rng, spec.max_continuation) for _ in range(spec.batch_size)] for _ in range(spec.steps)]


def token_batch(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels), both (B, L): each text's tokens and the end-of-text token; padding is labelled -100."""
    eos = tokenizer.eos_token_id
    rows = [tokenizer(text)["input_ids"] + [eos] for text in texts]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), eos, dtype=torch.long)  # (B, L)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, L)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row)
        labels[index, : len(row)] = torch.tensor(row)
    return input_ids, labels


def learning_rate(spec: PretrainingSpec, step: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def pretrain(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, spec: PretrainingSpec, seed: int) -> float:
    """Trains `model` in place on the spec's corpus; returns the last step's loss (nats per token).

    The caller seeds torch (the build forks the RNG); the threads are set for the run and restored.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(PRETRAINING_THREADS)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
        model.train()
        loss = torch.tensor(float("nan"))
        for step, texts in enumerate(corpus_batches(spec, seed)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(spec, step)
            input_ids, labels = token_batch(texts, tokenizer)  # (B, L)
            # No attention mask: padding comes after each text's last token, so causal attention never reads it.
            loss = model(input_ids=input_ids, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        return float(loss.detach())
    finally:
        torch.set_num_threads(threads)
