"""Roles on pools of their own: a PPO job whose critic and reference have `spec.resources` entries runs
them as worker groups of their own, on their pools' Ray resources, not inside the actor's workers.

The same run carries each role's own knobs (issue #21): the reference's dtype, the critic's gradient
checkpointing, every role's micro-batch sizes, the actor's and the critic's CPU offload (offload.perLayer and
.gradientsOnDevice), the reference's token budget, padding-free forwards, and log-probs scored at the LM head
(training.fusedLogProbs, for the roles with a head), each seen where it takes effect. (training.compile reaches
every role's trainer the same way: test_compiled_layers.py builds them, as compiling here would add half a
minute of inductor's C++ builds to the run.)"""

from typing import Any

import pytest

from kuberl.runtime import driver
from kuberl.runtime.driver import run_job
from kuberl.runtime.pools.launch import Groups
from kuberl.runtime.workers.group import WorkerGroup
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = pytest.mark.integration


def test_ppo_with_critic_and_reference_pools_runs_them_as_groups_of_their_own(ray_session, tmp_path, monkeypatch):
    job = demo_job(
        **{
            "algorithm": {"name": "ppo", "groupSize": 1, "kl": {"coef": 0.05}},
            "models.critic": {
                "optim": {"lr": 0.003},
                "gradientCheckpointing": True,
                "microBatchSize": 3,
                "forwardMicroBatchSize": 5,
                "offload": {"params": True, "optimizer": True, "perLayer": True, "gradientsOnDevice": True},
            },
            "models.reference": {"dtype": "bfloat16", "microBatchSize": 6, "maxTokensPerMicroBatch": 100},
            "models.actor.microBatchSize": 2,
            "models.actor.offload": {"params": True, "optimizer": True, "perLayer": False},
            "training.paddingFree": True,
            "training.fusedLogProbs": True,
            "models.actor.forwardMicroBatchSize": 7,
            "training.totalSteps": 2,
            "checkpoint.exportHf": False,
            "resources": {
                "actor": {"replicas": 2, "cpus": 0.5},
                "critic": {"replicas": 2, "cpus": 0.5},
                "reference": {"replicas": 1, "cpus": 0.5},  # another rank count than the actor's
            },
        }
    )
    hosted: dict[str, list[dict[str, Any]]] = {}
    start_groups = driver.start_groups

    def start_and_look(plan) -> Groups:  # the real groups; the test only asks each rank what it holds
        groups = start_groups(plan)
        for name in ("actor", "critic", "reference"):
            hosted[name] = getattr(groups, name).call("hosted")
        return groups

    monkeypatch.setattr(driver, "start_groups", start_and_look)
    forwards: set[tuple[str, str, int, int | None]] = set()  # (method, role, rows, tokens) of each forward pass
    call_sharded = WorkerGroup.call_sharded

    def call_and_note(group, method, batch, **kwargs):
        if "micro_batch_size" in kwargs:
            forwards.add((method, kwargs.get("role", "critic"), kwargs["micro_batch_size"], kwargs["max_tokens"]))
        return call_sharded(group, method, batch, **kwargs)

    monkeypatch.setattr(WorkerGroup, "call_sharded", call_and_note)
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)

    assert [record["step"] for record in run.history] == [1, 2]
    assert all("critic/loss" in record and "kl/mean" in record for record in run.history)
    assert [rank["models"] for rank in hosted["actor"]] == [["actor", "rollout"]] * 2
    assert [rank["models"] for rank in hosted["critic"]] == [["critic"]] * 2
    assert [rank["models"] for rank in hosted["reference"]] == [["reference"]]
    pids = {name: {rank["pid"] for rank in ranks} for name, ranks in hosted.items()}
    assert len(pids["actor"] | pids["critic"] | pids["reference"]) == 5  # five processes: nothing shared
    for name, ranks in hosted.items():  # each on a unit of its own pool's resource
        assert all(rank["resources"].get(f"kuberl_{name}") == 1 for rank in ranks), ranks
    # the reference in its own dtype beside the float32 actor; only the critic recomputes activations; the actor's
    # and the critic's FSDP2 shards are in host memory (offload): the actor's gathered for each optimiser step,
    # the critic's layer by layer with its gradients kept for the step; every trainer's forwards are packed
    # (paddingFree); the actor and the reference score at their heads (fusedLogProbs), the critic has none
    assert hosted["reference"][0]["trainers"]["reference"]["dtype"] == "bfloat16"
    assert hosted["reference"][0]["trainers"]["reference"]["fused_log_probs"] is True
    assert hosted["actor"][0]["trainers"]["actor"] == {
        "dtype": "float32",
        "gradient_checkpointing": False,
        "offloaded_to_cpu": True,
        "offload_gathers_per_step": True,  # perLayer: false, on 2 ranks too: the update keeps the gathered model
        "offload_reduces_per_step": True,  # and its gradients, reduced at a step's last pass
        "padding_free": True,
        "fused_log_probs": True,
        "compiled_layers": 0,
    }
    assert hosted["critic"][0]["trainers"]["critic"] == {
        "dtype": "float32",
        "gradient_checkpointing": True,
        "offloaded_to_cpu": True,
        "offload_gathers_per_step": False,  # perLayer: true
        "offload_reduces_per_step": True,  # gradientsOnDevice: true
        "padding_free": True,
        "fused_log_probs": False,
        "compiled_layers": 0,
    }
    # 8 rows a step: the actor's 2 ranks update 4 rows each in micro-batches of 2, the critic's in 3s (3 and 1)
    assert {record["actor/micro_batches"] for record in run.history} == {2.0}
    assert {record["critic/micro_batches"] for record in run.history} == {2.0}
    # the forward-only passes: values, reference log-probs, and the actor's old log-probs (the KL is in the reward)
    assert forwards == {
        ("compute_values", "critic", 5, None),
        ("compute_logprobs", "reference", 6, 100),  # cut by tokens: its rows are not used
        ("compute_logprobs", "actor", 7, None),
    }
    # the critic's own ranks saved their model into the final checkpoint beside the actor's
    assert (tmp_path / "checkpoints" / "step-000002" / "critic" / ".metadata").is_file()
