"""Each role's micro-batch sizes: its own where it sets them, training.microBatchSize where it does not."""

from kuberl.api import parse_rljob
from kuberl.runtime.loop.settings import MicroBatchSizes, micro_batch_sizes
from kuberl.runtime.models.dtypes import reference_dtype, rollout_dtype
from tests.unit.api.test_rules import spec_with


def test_every_pass_takes_the_global_micro_batch_size_by_default():
    spec = parse_rljob(spec_with({"training.microBatchSize": 4, "algorithm.name": "ppo", "models.critic": {}})).spec
    assert micro_batch_sizes(spec) == MicroBatchSizes(4, 4, 4, 4, 4)


def test_a_roles_own_size_wins_for_its_passes_only():
    spec = parse_rljob(
        spec_with(
            {
                "training.microBatchSize": 4,
                "algorithm.name": "ppo",
                "models.actor": {"path": "/m", "microBatchSize": 1, "forwardMicroBatchSize": 16},
                "models.critic": {"microBatchSize": 2},
                "models.reference": {"microBatchSize": 32},
            }
        )
    ).spec
    sizes = micro_batch_sizes(spec)
    assert sizes == MicroBatchSizes(
        actor_update=1, actor_forward=16, critic_update=2, critic_forward=4, reference_forward=32
    )
    assert [sizes.forward(role).rows for role in ("actor", "critic", "reference")] == [16, 4, 32]
    assert [sizes.forward(role).max_tokens for role in ("actor", "critic", "reference")] == [None, None, None]


def test_token_budgets_are_read_per_role_and_pass():
    spec = parse_rljob(
        spec_with(
            {
                "algorithm.name": "ppo",
                "models.actor": {"path": "/m", "maxTokensPerMicroBatch": 2048, "forwardMaxTokensPerMicroBatch": 4096},
                "models.critic": {"maxTokensPerMicroBatch": 3072},
                "models.reference": {"maxTokensPerMicroBatch": 8192},
            }
        )
    ).spec
    sizes = micro_batch_sizes(spec)
    assert (sizes.actor_update_tokens, sizes.critic_update_tokens) == (2048, 3072)
    budgets = [sizes.forward(role).max_tokens for role in ("actor", "critic", "reference")]
    assert budgets == [4096, None, 8192]  # the critic's forward keeps its row count


def test_rollout_and_reference_dtypes_follow_the_actor_unless_set():
    spec = parse_rljob(spec_with({"models.actor": {"path": "/m", "dtype": "bfloat16"}})).spec
    assert (rollout_dtype(spec), reference_dtype(spec)) == ("bfloat16", "bfloat16")
    spec = parse_rljob(spec_with({"rollout.dtype": "bfloat16", "models.reference": {"dtype": "float16"}})).spec
    assert (spec.models.actor.dtype, rollout_dtype(spec), reference_dtype(spec)) == ("float32", "bfloat16", "float16")
