"""Token-budget micro-batches (models.<role>.maxTokensPerMicroBatch): the passes follow the budget, the update
and the log-probs do not change, and both ranks run the same number of passes.

Two real gloo ranks (CPU, fp32, plain SGD as in test_fsdp_equivalence, which shows a mis-weighted gradient)
hold 2 rows per mini-batch. Real tokens (prompt + response) per row, as `layout` gives them out:
rank 0: mini-batch 0 [11, 5], mini-batch 1 [8, 8]; rank 1: [8, 6] and [9, 9]. A budget of 16 fits rank 0's
mini-batches in one pass each, but rank 1's second needs two (9 + 9 > 16): the ranks agree on two, and rank 0
splits [8, 8] into [8] and [8]. Without that agreement the ranks' FSDP all-gathers would not pair up (the
process group's 60 s timeout turns such a hang into a failure).
"""

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.micro_batches import cut_by_tokens
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.rank_pool import RankPool
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, OPTIM, layout, make_batch, sgd, tiny_model
from tests.integration.runtime.test_micro_batches import counted

pytestmark = pytest.mark.integration

WORLD, BUDGET = 2, 16


def train_rank(rank: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    torch.set_num_threads(1)
    shard = layout(make_batch(), WORLD, CONFIG["mini_batches"]).shard(WORLD)[rank]
    results = {}
    for budget in (None, BUDGET):
        trainer = FSDPTrainer(tiny_model(), world_size=WORLD, device=torch.device("cpu"), optim=OPTIM, total_steps=5)
        trainer.optimizer = sgd(trainer.model.parameters())
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
        passes = counted(trainer)  # forward calls into the first decoder layer
        logprobs = trainer.logprobs(forward_input(shard), 1.0, micro_batch_size=4, max_tokens=budget)
        forward_passes = passes[0]
        config = UpdateConfig(world_size=WORLD, **CONFIG, max_tokens_per_micro_batch=budget)
        metrics = update_policy(trainer, shard, config)
        results[budget] = {
            "logprobs": logprobs * shard.response_mask,
            "forward_passes": forward_passes,
            "update_passes": passes[0] - forward_passes,
            "metrics": metrics,
            "weights": {name: tensor.clone() for name, tensor in trainer.full_tensors()},
        }
    torch.save(results, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def test_token_budget_micro_batches_agree_across_ranks_and_change_nothing_but_the_passes(
    tmp_path: Path, rank_pool: RankPool
):
    out = tmp_path / "budget.pt"
    rank_pool.run(train_rank, WORLD, str(tmp_path / "rendezvous"), str(out))
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(WORLD)]
    # what each rank alone would cut its second mini-batch into: one pass on rank 0, two on rank 1
    assert [len(cut_by_tokens(lengths, BUDGET)) for lengths in ([8, 8], [9, 9])] == [1, 2]
    for rank in ranks:
        fixed, budgeted = rank[None], rank[BUDGET]
        assert fixed["update_passes"] == 2  # 2 rows per mini-batch, micro-batches of 2 rows
        assert budgeted["update_passes"] == 3  # one pass, then the agreed two, on both ranks
        assert budgeted["metrics"]["actor/micro_batches"] == 1.5  # per optimiser step, averaged over both
        assert (fixed["forward_passes"], budgeted["forward_passes"]) == (1, 3)  # [11,5][8,8] | [8,6][9][9]
        torch.testing.assert_close(budgeted["logprobs"], fixed["logprobs"], rtol=0, atol=1e-5)
        assert budgeted["metrics"]["actor/loss"] == pytest.approx(fixed["metrics"]["actor/loss"], abs=1e-6)
    fixed_weights, budget_weights = ranks[0][None]["weights"], ranks[0][BUDGET]["weights"]
    initial = {name: param.detach() for name, param in tiny_model().named_parameters()}
    assert max(float((fixed_weights[n] - initial[n]).abs().max()) for n in initial) > 1e-3  # it trained
    for name, tensor in fixed_weights.items():
        torch.testing.assert_close(budget_weights[name], tensor, rtol=0, atol=1e-6, msg=name)
