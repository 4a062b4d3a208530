"""tiny://tool-demo: the demo model taught the python tool's call format, so RL has a tool user to improve.

A random 1M-parameter model never writes `<python>...</python>` by chance (some 20 tokens in a row),
so no reward would ever tell it the tool helps. Real agentic RL starts from an instruction-tuned model
that knows its tool-call format and uses it unevenly; this is that start, in miniature. At build time
the demo architecture is fine-tuned on the multiplication task of examples/agent-python-tool.yaml with
two kinds of demonstration:

    multiply: 37 48<python>( 37 * 48)</python><output>1776</output>1776<|endoftext|>   with the tool
    multiply: 37 48 1776<|endoftext|>                                                  in its head

Each part is tokenized on its own, as the episode rollout does (runtime/rollout/episodes.py), and
only the model's parts are trained (the prompt and the tool's output are not). Two phases:

1. `COPY_STEPS` on tool demonstrations only: the model learns the call format, to copy the operands
   into the code and the tool's output into its answer (a copying skill: ~400 steps before it forms).
2. `MIX_STEPS` on a mix where `TOOL_SHARE` of the demonstrations use the tool: the model leaves calling
   the tool in roughly that share of its answers and answering in its head, almost always wrongly
   (products of two-digit numbers), in the rest.

Reinforcement learning then has to find out that calling the tool pays. The recipe is seeded and runs
on one thread (as models/tiny.py's other builds): one machine's builds repeat; other CPUs may differ in
the last bits. It takes a few minutes once; `resolve_model_path` caches the result.
"""

import math
import random

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

#: Bump when anything here changes what the build writes (tiny.py's cache key reads it).
TOOL_RECIPE = 1
COPY_STEPS = 500
MIX_STEPS = 150
#: Share of phase 2's demonstrations that call the tool; the rest answer in their head.
TOOL_SHARE = 0.25
BATCH = 32
LEARNING_RATE = 3e-3
MIX_LEARNING_RATE = 1e-3
WARMUP_STEPS = 30
#: Operands: two-digit numbers whose products have four digits, so every episode has the same shape.
LOW, HIGH = 32, 99


def task_prompt(a: int, b: int) -> str:
    """The prompt of one multiplication, as examples/data/multiply.jsonl writes it."""
    return f"multiply: {a} {b}"


def tool_call(a: int, b: int) -> str:
    return f"<python>( {a} * {b})</python>"


def demonstration(tokenizer: PreTrainedTokenizerFast, a: int, b: int, use_tool: bool) -> tuple[list[int], list[int]]:
    """Token ids of one episode and, for each, 1 where the model wrote it (trained) and 0 elsewhere."""
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    answer = str(a * b)
    parts = [(task_prompt(a, b), 0)]
    if use_tool:
        parts += [(tool_call(a, b), 1), (f"<output>{answer}</output>", 0), (answer, 1)]
    else:
        parts += [(f" {answer}", 1)]
    ids: list[int] = []
    trained: list[int] = []
    for text, mine in parts:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        trained += [mine] * len(part)
    return ids + [eos], trained + [1]


def demonstration_batch(
    tokenizer: PreTrainedTokenizerFast, rng: random.Random, tool_share: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, trained), both (B, T): BATCH demonstrations, right-padded; padding is not trained."""
    rows = [
        demonstration(tokenizer, rng.randint(LOW, HIGH), rng.randint(LOW, HIGH), rng.random() < tool_share)
        for _ in range(BATCH)
    ]
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int)
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((BATCH, width), pad, dtype=torch.long)  # (B, T)
    trained = torch.zeros((BATCH, width))  # (B, T)
    for row, (row_ids, row_trained) in enumerate(rows):
        input_ids[row, : len(row_ids)] = torch.tensor(row_ids)
        trained[row, : len(row_trained)] = torch.tensor(row_trained, dtype=torch.float32)
    return input_ids, trained


def phase_learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < WARMUP_STEPS:
        return peak * (step + 1) / WARMUP_STEPS
    return peak * 0.5 * (1.0 + math.cos(math.pi * (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)))


def teach_tool_format(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, seed: int) -> float:
    """Fine-tunes `model` in place, both phases; returns the last step's loss (nats per trained token).

    The caller seeds torch (the build forks the RNG); one thread for the run, restored after.
    """
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loss = torch.tensor(float("nan"))
    try:
        model.train()
        for steps, peak, share in ((COPY_STEPS, LEARNING_RATE, 1.0), (MIX_STEPS, MIX_LEARNING_RATE, TOOL_SHARE)):
            optimizer = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0)
            for step in range(steps):
                for group in optimizer.param_groups:
                    group["lr"] = phase_learning_rate(step, steps, peak)
                input_ids, trained = demonstration_batch(tokenizer, rng, share)  # (B, T)
                logits = model(input_ids=input_ids).logits[:, :-1]  # (B, T-1, V): each next token's prediction
                per_token = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none"
                ).view_as(trained[:, 1:])  # (B, T-1)
                mask = trained[:, 1:]  # (B, T-1): the model's own tokens
                loss = (per_token * mask).sum() / mask.sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        model.eval()
        return float(loss.detach())
    finally:
        torch.set_num_threads(threads)
