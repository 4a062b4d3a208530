"""Padded against padding-free (training.paddingFree) forwards and updates on a batch of mixed lengths.

    .venv/bin/python bench/padding_free.py              # 16 rows, responses up to 256 tokens, 3 rounds
    .venv/bin/python bench/padding_free.py --quick      # 8 rows, up to 128 tokens, 2 rounds: a smoke test

A random Qwen2 (hidden 256, 4 layers, vocabulary 8192: ~5M parameters; fp32, CPU, one FSDPTrainer rank,
`--threads` torch threads), and one batch as RL rollouts make them: prompts of 16-64 tokens left-padded to 64,
responses drawn from an exponential distribution (mean a quarter of the budget) right-padded to the longest,
one of them as long as the budget.
Two works, each timed padded and packed, alternating in every round: the old-log-prob forward
(`FSDPTrainer.logprobs`) and one policy update (`update_policy`: forward, backward, AdamW step), both in
micro-batches of `--micro` rows. Prints the padding share of the batch, the best and the median seconds of each
work over the rounds (on a shared machine the best is the steadier figure), the ratios padded / packed, and the
largest log-prob difference between the two (a check that both compute the same).
"""

import argparse
import os
import statistics
import time

import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.algorithms.losses import PolicyLossConfig
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy

PROMPT_WIDTH, VOCAB = 64, 8192


def model(hidden: int, layers: int = 4) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    return Qwen2ForCausalLM(config).float()


def mixed_batch(rows: int, budget: int) -> RolloutBatch:
    generator = torch.Generator().manual_seed(1)
    prompt_lengths = torch.randint(16, PROMPT_WIDTH + 1, (rows,), generator=generator)
    draws = torch.empty(rows).exponential_(4.0 / budget, generator=generator)
    response_lengths = draws.long().clamp(8, budget)
    response_lengths[0] = budget  # one response runs to the budget, as a batch of rollouts usually has
    width = int(response_lengths.max())
    prompt_mask = (torch.arange(PROMPT_WIDTH)[None, :] >= (PROMPT_WIDTH - prompt_lengths)[:, None]).long()
    response_mask = (torch.arange(width)[None, :] < response_lengths[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.randint(1, VOCAB, (rows, PROMPT_WIDTH), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(1, VOCAB, (rows, width), generator=generator) * response_mask.long(),
        response_mask=response_mask,
        group_index=torch.arange(rows) // 4,
        old_logprobs=-torch.rand(rows, width, generator=generator) * 3 * response_mask,
        advantages=torch.randn(rows, width, generator=generator) * response_mask,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--budget", type=int, default=256, help="response tokens at most")
    parser.add_argument("--hidden", type=int, default=256, help="the model's hidden size")
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.budget, args.rounds = 8, 128, 2
    torch.set_num_threads(args.threads)
    batch = mixed_batch(args.rows, args.budget)
    real, total = int(batch.attention_mask.sum()), batch.attention_mask.numel()
    print(
        f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, {args.rows} rows x {batch.input_ids.shape[1]} "
        f"positions: {real} real tokens, padding {1 - real / total:.0%} of the batch"
    )
    config = update_config(batch, args.micro)
    trainers = {
        mode: FSDPTrainer(
            model(args.hidden),
            world_size=1,
            device=torch.device("cpu"),
            optim=OptimizerSpec(lr=1e-5),
            total_steps=args.rounds + 1,
            padding_free=mode == "packed",
        )
        for mode in ("padded", "packed")
    }
    compare(trainers, batch, config, args.rounds, args.micro)


def update_config(batch: RolloutBatch, micro: int) -> UpdateConfig:
    """One on-policy-shaped PPO update of the whole batch in micro-batches of `micro` rows, token mean."""
    return UpdateConfig(
        ppo_epochs=1,
        mini_batches=1,
        micro_batch_size=micro,
        world_size=1,
        temperature=1.0,
        aggregation="token_mean",
        max_response_length=batch.response_ids.shape[1],
        policy_loss="ppo_clip",
        loss_config=PolicyLossConfig(),
    )


def compare(
    trainers: dict[str, FSDPTrainer], batch: RolloutBatch, config: UpdateConfig, rounds: int, micro: int
) -> None:
    """Times each trainer's old-log-prob forward and update, alternating in every round, and prints the best and
    the median seconds of each, the first trainer's over the second's, and how far their log-probs are apart."""
    first, second = trainers
    seconds: dict[tuple[str, str], list[float]] = {}
    logprobs: dict[str, torch.Tensor] = {}
    for _ in range(rounds):
        for mode, trainer in trainers.items():
            started = time.perf_counter()
            logprobs[mode] = trainer.logprobs(forward_input(batch), 1.0, micro)
            forwarded = time.perf_counter()
            update_policy(trainer, batch, config)
            seconds.setdefault(("forward", mode), []).append(forwarded - started)
            seconds.setdefault(("update", mode), []).append(time.perf_counter() - forwarded)
    difference = float(((logprobs[first] - logprobs[second]) * batch.response_mask).abs().max())
    ratio = f"{first}/{second}"
    print(f"{'work':<8} {'figure':<7} {first + ' s':>11} {second + ' s':>11} {ratio:>17}")
    for work in ("forward", "update"):
        for figure, reduce in (("best", min), ("median", statistics.median)):
            mine, theirs = (reduce(seconds[(work, mode)]) for mode in (first, second))
            print(f"{work:<8} {figure:<7} {mine:>11.3f} {theirs:>11.3f} {mine / theirs:>16.2f}x")
    print(f"largest log-prob difference, {first} vs {second}, in the last round: {difference:.1e}")


if __name__ == "__main__":
    main()
