"""Each worker resolves its models on its own node, as each pod of a cluster must: only locations travel.

On Kubernetes the driver (head pod) and every worker group are pods of their own, each with its own
model cache: a folder the driver built or downloaded models into does not exist on the workers. Here
the driver gets a cache of its own ($KUBERL_CACHE, read when it plans), which is deleted as soon as
the plan is made, as if the head's disk were out of the workers' reach; the workers (the session
Ray's processes) keep the cache they were started with. A run that sent the driver's folders to the
workers fails at setup; one that sends locations runs and exports, and its report (the RLJob's
status.exportedModel) says where the model is.
"""

import json
import shutil
from pathlib import Path

import pytest
import ray
from transformers import AutoModelForCausalLM

from kuberl.api.contract import CACHE_ENV
from kuberl.api.status import REPORT_KEY
from kuberl.runtime import driver
from kuberl.runtime.driver import run_job
from kuberl.runtime.models.resolve import default_cache_dir
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher, StatusPublisher
from tests.integration.runtime.jobs import demo_base_dir, demo_job
from tests.unit.runtime.checkpoint.test_checkpoint_store import RecordingApiServer

pytestmark = pytest.mark.integration


def test_workers_load_models_from_their_own_cache_not_the_drivers(ray_session, tmp_path: Path, monkeypatch) -> None:
    driver_cache = tmp_path / "head-cache"
    monkeypatch.setenv(CACHE_ENV, str(driver_cache))
    worker_cache = ray.get(ray.remote(num_cpus=0.1)(default_cache_dir).remote())
    assert worker_cache != driver_cache  # the premise: the workers' cache is another node's
    make_plan = driver.make_plan

    def plan_then_lose_the_heads_cache(*args):
        plan = make_plan(*args)
        assert (driver_cache / "tiny").is_dir()  # the driver resolved the actor for its tokenizer...
        shutil.rmtree(driver_cache)  # ...into a folder no worker can reach
        return plan

    monkeypatch.setattr(driver, "make_plan", plan_then_lose_the_heads_cache)
    api_server = RecordingApiServer()  # what the head pod's status publisher would apply to the job's ConfigMap

    def in_the_head_pod(*, rayjob: str | None = None) -> StatusPublisher:
        return KubernetesStatusPublisher("tiny-grpo", "rl", api_server.url, None, None, min_interval=0.0)

    monkeypatch.setattr(StatusPublisher, "from_environment", staticmethod(in_the_head_pod))
    job = demo_job(
        **{
            "models.actor.path": "tiny://demo",
            "reward": {"model": {"path": "tiny://reward-demo"}},  # the reward pool's workers load a model too
            "rollout.placement": "separate",  # and so do the rollout replicas
            "resources.rollout": {"replicas": 1, "cpus": 0.25},
            "resources.reward": {"replicas": 1, "cpus": 0.25},
            "training.totalSteps": 2,
            "checkpoint": {"intervalSteps": 2, "exportHf": True},
        }
    )
    try:
        result = run_job(job, tmp_path / "run", demo_base_dir(), progress=False)
    finally:
        api_server.close()
    assert [record["step"] for record in result.history] == [1, 2]
    assert not driver_cache.exists()
    assert result.model_dir is not None
    assert AutoModelForCausalLM.from_pretrained(result.model_dir).num_parameters() > 0
    last_report = json.loads(api_server.requests[-1]["body"]["data"][REPORT_KEY])
    assert last_report["exportedModel"] == result.model_uri == str(tmp_path / "run" / "model")
