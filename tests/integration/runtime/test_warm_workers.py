"""Warm workers (runtime/workers/group.py WarmWorkers): a run on the processes of earlier runs is the run on new ones.

Every runtime test module runs its jobs on the model workers its earlier jobs left warm
(tests/integration/conftest.py), which saves each job seconds of imports; this file shows the saving changes
no result, even for a process that comes back at another rank, and that workers of another shape give their
resources back before a run starts.
"""

import re
import sys
import time

import pytest
import ray
from safetensors.torch import load_file

from kuberl.runtime.driver import run_job
from kuberl.runtime.workers.group import WarmWorkers, warm_workers
from tests.integration.kuberay_standin import alive
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Metrics that measure the machine (durations, rates, memory), not what the run computed.
MACHINE = re.compile(r"^time/|seconds|per_second|throughput|memory|mfu")


def idle_pids(warm: WarmWorkers) -> list[int]:
    """The kept workers' processes, in the order the next run takes them as ranks 0, 1, ..."""
    return [ray.get(worker.hosted.remote())["pid"] for worker in warm.idle()]


def computed(history: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if not MACHINE.search(key)} for record in history]


def weights(run) -> dict:
    return load_file(str(run.model_dir / "model.safetensors"))


def test_a_run_on_reused_workers_is_bit_identical_to_one_on_new_workers(ray_session, tmp_path):
    warm = warm_workers()
    assert warm is not None, "the session's Ray keeps workers warm (tests/integration/conftest.py)"
    warm.stop_all()  # new processes for the first run
    job = demo_job(**{"training.totalSteps": 3})
    fresh = run_job(job, tmp_path / "fresh", demo_base_dir(), progress=False)
    first = idle_pids(warm)
    assert len(first) == 2, "the demo's two actor ranks are kept after a run that ended well"

    # another job of the same shape runs on them in between: PPO with a critic, another seed
    ppo = demo_job(
        **{
            "algorithm": {"name": "ppo", "groupSize": 1},
            "models.critic": {"optim": {"lr": 0.003}},
            "training.totalSteps": 2,
            "training.seed": 7,
        }
    )
    run_job(ppo, tmp_path / "ppo", demo_base_dir(), progress=False)
    assert idle_pids(warm) == first, "the PPO run ran on the same two processes, at the same ranks"

    # a one-rank run of the same shape takes the first and gives it back last: the next run swaps the ranks
    run_job(
        demo_job(**{"resources.actor.replicas": 1, "training.totalSteps": 1}),
        tmp_path / "one",
        demo_base_dir(),
        progress=False,
    )
    assert idle_pids(warm) == first[::-1]

    # the process that was rank 1 is rank 0 now: its checkpoints must place the shards at rank 0's offsets (the
    # exported model is read from the last checkpoint), which DTensor's caches of the old group's meshes broke
    again = run_job(job, tmp_path / "again", demo_base_dir(), progress=False)
    assert idle_pids(warm) == first[::-1]
    assert computed(again.history) == computed(fresh.history)
    trained, retrained = weights(fresh), weights(again)
    assert trained.keys() == retrained.keys()
    assert all(trained[name].equal(retrained[name]) for name in trained)

    # a run whose actor ranks ask for more CPUs cannot use them: they are stopped before it starts; and its own
    # ranks, which ran vLLM (it leaves state of its own in a process), are not kept
    wider = demo_job(**{"training.totalSteps": 1, "resources.actor.cpus": 1, "rollout.engine": "vllm"})
    run_job(wider, tmp_path / "wider", demo_base_dir(), progress=False)
    assert warm.idle() == []
    deadline = time.monotonic() + 60  # ray.kill returns before the process has exited
    while alive(set(first)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(set(first))


def test_a_worker_whose_torch_cannot_forget_its_meshes_is_not_kept(monkeypatch):
    """Where torch lacks the clear functions (they are private), a model worker says it cannot host another run,
    and WarmWorkers stops it instead of reusing it (the run above shows this torch has them: its workers are kept)."""
    from kuberl.runtime.engines.fsdp import forget_sharding_caches
    from kuberl.runtime.workers.model_worker import ModelWorker

    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # an earlier test may have run vLLM in this process
    assert forget_sharding_caches() and ModelWorker(0, 1).shutdown()
    monkeypatch.delattr("torch.distributed.tensor.debug._clear_sharding_prop_cache")
    assert not forget_sharding_caches()
    assert not ModelWorker(0, 1).shutdown()
