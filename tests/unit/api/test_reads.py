"""local_reads: every local path a job names, and the pools whose pods open it (runtime/loop/plan.py, workers/)."""

from typing import Any

from kuberl.api import parse_rljob
from kuberl.api.reads import PathRead, local_reads


def reads(minimal_manifest: dict, **spec: Any) -> dict[str, PathRead]:
    minimal_manifest["spec"].update(spec)
    return {read.field: read for read in local_reads(parse_rljob(minimal_manifest).spec)}


def test_without_pools_the_head_reads_the_data_and_the_actors_pods_load_the_model(minimal_manifest: dict):
    found = reads(minimal_manifest)
    assert found == {
        "spec.models.actor.path": PathRead("spec.models.actor.path", "/models/actor", ("head", "actor")),
        "spec.data.train": PathRead("spec.data.train", "/data/train.jsonl", ("head",)),
    }


def test_each_pool_reads_the_model_of_the_role_it_hosts(minimal_manifest: dict):
    found = reads(
        minimal_manifest,
        algorithm={"name": "ppo", "kl": {"coef": 0.01}},
        models={
            "actor": {"path": "/models/actor", "tokenizer": "file:///models/tokenizer"},
            "critic": {"path": "/models/critic"},
            "reference": {"path": "/models/reference"},
        },
        reward={"model": {"path": "/models/rm"}},
        rollout={"placement": "separate"},
        resources={"critic": {}, "reference": {}, "rollout": {}, "reward": {}},
    )
    assert {field: read.pools for field, read in found.items()} == {
        # the actor's weights: its trainer ranks and the separate engines that start from them
        "spec.models.actor.path": ("head", "actor", "rollout"),
        # every model worker and engine tokenizes; file:// is a path like any other
        "spec.models.actor.tokenizer": ("head", "actor", "critic", "reference", "rollout"),
        "spec.models.reference.path": ("head", "reference"),
        "spec.models.critic.path": ("head", "critic"),
        "spec.reward.model.path": ("head", "reward"),
        "spec.data.train": ("head",),
    }
    assert found["spec.models.actor.tokenizer"].path == "/models/tokenizer"


def test_colocated_roles_are_read_in_the_actors_pods_and_default_to_the_actors_model(minimal_manifest: dict):
    found = reads(
        minimal_manifest,
        algorithm={"name": "ppo", "kl": {"coef": 0.01}},
        models={"actor": {"path": "/models/actor"}, "critic": {}},
    )
    assert list(found) == ["spec.models.actor.path", "spec.data.train"]  # critic and reference: the actor's
    assert found["spec.models.actor.path"].pools == ("head", "actor")


def test_a_reward_file_is_read_by_the_head_and_the_reward_workers(minimal_manifest: dict):
    on_head = reads(minimal_manifest, reward={"function": "/rewards/score.py:grade"})
    assert on_head["spec.reward.function"] == PathRead("spec.reward.function", "/rewards/score.py", ("head",))
    pooled = reads(minimal_manifest, reward={"function": "rewards/score.py"}, resources={"reward": {"replicas": 2}})
    assert pooled["spec.reward.function"] == PathRead("spec.reward.function", "rewards/score.py", ("head", "reward"))


def test_every_data_location_of_a_list_is_named_by_its_index(minimal_manifest: dict):
    found = reads(minimal_manifest, data={"train": ["/data/a.parquet", "s3://b/c.parquet"], "validation": "/v"})
    assert [(read.field, read.path) for read in found.values() if read.field.startswith("spec.data")] == [
        ("spec.data.train[0]", "/data/a.parquet"),
        ("spec.data.validation", "/v"),
    ]


def test_uris_each_pod_fetches_itself_need_no_volume(minimal_manifest: dict):
    found = reads(
        minimal_manifest,
        models={"actor": {"path": "hf://Qwen/Qwen2.5-0.5B"}},
        data={"train": "s3://bucket/train.parquet"},
        reward={"function": "my_rewards.code:run_tests"},
    )
    assert found == {}
