"""Stand-ins for the worker groups a Controller drives, for tests of one step's order without Ray.

`RecordingGroup` and `RecordingPool` are doubles (no model runs): they record the method each call asks of the
workers, in order, and answer with what a real rank would (shapes and keys). Everything else is real: the demo
job's spec, its StepSettings, the Controller and its stages.
"""

from types import SimpleNamespace
from typing import Any

import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.loop.controller import Controller, Generated
from kuberl.runtime.loop.settings import step_settings
from tests.integration.runtime.jobs import demo_job


class RecordingGroup:
    """A worker-group double: records each call's method in `log`, and answers as a rank of the real worker would
    (shapes and keys, no model)."""

    def __init__(self, name: str, log: list[str], world_size: int = 1) -> None:
        self.group = SimpleNamespace(name=name)
        self.world_size, self.log = world_size, log

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.log.append(method)
        answers = {
            "sleep_engine": {"engine/sleep_freed_bytes": 0.0},
            "sync_weights": {"sync/bytes": 1.0, "sync/seconds": 0.0},
            "publish_weights": [],
            "probe_logprobs": {"trainer": [0.0], "engine": [0.0]},
        }
        return [answers[method]] * self.world_size

    def call_sharded(self, method: str, batch: RolloutBatch, **kwargs: Any) -> list[Any]:
        shards = batch.shard(self.world_size)
        if kwargs.get("sum_pi_squared"):  # the old-log-prob pass of a token-baseline estimator: pi 1/2, sum 1/2
            self.log.append(f"{method} with sum_pi_squared")
            return [(torch.full_like(s.response_mask, -0.6931), torch.full_like(s.response_mask, 0.5)) for s in shards]
        self.log.append(method)
        if method == "update_actor":
            return [({"actor/loss": 0.0}, torch.zeros_like(shard.response_mask)) for shard in shards]
        return [torch.zeros_like(shard.response_mask) for shard in shards]


class RecordingPool:
    """A separate rollout pool double: records weight loads."""

    chunks, version = 1, 0

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def load(self, buckets: Any, version: int) -> list[dict[str, float]]:
        self.log.append("pool load")
        return [{"sync/bytes": 1.0, "sync/seconds": 0.0}]

    def metrics(self) -> dict[str, float]:
        return {}


def train_one_step(
    batch: RolloutBatch, *, separate_pool: bool = False, **changes: Any
) -> tuple[list[str], dict[str, float]]:
    """Controller.train of one step of the demo job (with `changes`) on `batch`, through recording groups: the
    methods called on the workers in order, and the step's metrics."""
    changes = {"training.totalSteps": 2, **changes}
    if separate_pool:
        changes.update({"rollout.placement": "separate", "resources.rollout": {"replicas": 1, "cpus": 1}})
    job = demo_job(**changes)
    log: list[str] = []
    actor = RecordingGroup("actor", log)
    groups = SimpleNamespace(
        actor=actor,
        rollout=RecordingPool(log) if separate_pool else None,
        environment=None,
        reward=SimpleNamespace(metrics=dict),
        host=lambda role: actor,
    )
    plan = SimpleNamespace(
        job=job,
        tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1),
        mini_batches=1,
        actor_world_size=1,
        total_steps=2,
        validation=None,
        settings=step_settings(job.spec, mini_batches=1, actor_world_size=1),
    )
    batch.old_logprobs = batch.ref_logprobs = None
    batch.scores = torch.ones(len(batch))
    controller = Controller(plan, groups)  # type: ignore[arg-type]
    result = controller.train(Generated(0, 0, batch, batch, {}, {}))
    return log, result.metrics
