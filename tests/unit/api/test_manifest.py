"""The door: what parse_rljob accepts, what it refuses, and how it says so."""

import copy

import pytest

from kuberl.api import ManifestError, parse_rljob
from kuberl.api.enums import AdvantageEstimator, KLEstimator, KLPlacement, LossAggregation


def problems_of(manifest: dict) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        parse_rljob(manifest)
    return {problem.path: problem.message for problem in caught.value.problems}


def with_spec(manifest: dict, **sections) -> dict:
    out = copy.deepcopy(manifest)
    out["spec"].update(sections)
    return out


def test_minimal_manifest_is_valid_and_takes_grpo_defaults(minimal_manifest):
    job = parse_rljob(minimal_manifest)
    algo = job.spec.algorithm
    assert algo.advantage_estimator == AdvantageEstimator.GRPO
    assert algo.group_size == 8
    assert algo.kl.placement == KLPlacement.LOSS and algo.kl.estimator == KLEstimator.K3
    assert algo.loss_aggregation == LossAggregation.SEQ_MEAN_TOKEN_MEAN


def test_preset_fills_only_unset_fields(minimal_manifest):
    job = parse_rljob(with_spec(minimal_manifest, algorithm={"name": "dapo", "groupSize": 4, "kl": {"coef": 0.01}}))
    algo = job.spec.algorithm
    assert algo.group_size == 4  # user's
    assert algo.kl.coef == 0.01  # user's
    assert algo.clip_ratio_high == 0.28  # DAPO's clip-higher
    assert algo.loss_aggregation == LossAggregation.TOKEN_MEAN


def test_kl_estimator_follows_placement_when_unset(minimal_manifest):
    job = parse_rljob(with_spec(minimal_manifest, algorithm={"name": "grpo", "kl": {"placement": "reward"}}))
    assert job.spec.algorithm.kl.estimator == KLEstimator.K1
    job = parse_rljob(with_spec(minimal_manifest, algorithm={"name": "rloo", "kl": {"placement": "loss"}}))
    assert job.spec.algorithm.kl.estimator == KLEstimator.K3


def test_three_mistakes_give_three_problems_with_their_paths(minimal_manifest):
    bad = with_spec(
        minimal_manifest,
        algorithm={"grupSize": 4},
        data={"train": "/d.jsonl", "batchSize": 0},
        rollout={"temperature": "hot"},
    )
    problems = problems_of(bad)
    assert set(problems) == {"spec.algorithm.grupSize", "spec.data.batchSize", "spec.rollout.temperature"}
    assert "did you mean groupSize?" in problems["spec.algorithm.grupSize"]


def test_cross_field_problems_are_all_reported_under_their_own_paths(minimal_manifest):
    bad = with_spec(
        minimal_manifest,
        algorithm={"name": "ppo", "miniBatchSize": 3},
        rollout={"tensorParallelSize": 2},
    )
    problems = problems_of(bad)
    assert set(problems) == {
        "spec.models.critic",
        "spec.rollout.tensorParallelSize",
        "spec.algorithm.miniBatchSize",
    }
    assert "needs a critic" in problems["spec.models.critic"]


def test_list_items_are_named_by_index(minimal_manifest):
    bad = with_spec(minimal_manifest, resources={"actor": {"tolerations": [{"key": "a"}, {"effect": "Sometimes"}]}})
    assert list(problems_of(bad)) == ["spec.resources.actor.tolerations[1].effect"]


def test_missing_required_sections_are_named(minimal_manifest):
    bad = copy.deepcopy(minimal_manifest)
    del bad["spec"]["reward"], bad["spec"]["data"]
    assert problems_of(bad) == {"spec.reward": "required field is missing", "spec.data": "required field is missing"}


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("apiVersion", "kuberl.io/v1", "apiVersion"),
        ("kind", "RayJob", "kind"),
    ],
)
def test_wrong_kind_or_api_version_is_refused_before_the_spec(minimal_manifest, field, value, path):
    bad = copy.deepcopy(minimal_manifest)
    bad[field] = value
    bad["spec"] = {"nonsense": True}  # not reported: the document is not an RLJob at all
    assert list(problems_of(bad)) == [path]


@pytest.mark.parametrize("document", [None, [], "text", 42])
def test_a_document_that_is_not_a_mapping_is_refused(document):
    with pytest.raises(ManifestError, match="expected an RLJob mapping"):
        parse_rljob(document)


def test_job_name_must_fit_derived_kubernetes_names(minimal_manifest):
    bad = copy.deepcopy(minimal_manifest)
    bad["metadata"]["name"] = "x" * 41
    assert list(problems_of(bad)) == ["metadata.name"]
    bad["metadata"]["name"] = "Has_Capitals"
    assert list(problems_of(bad)) == ["metadata.name"]


def test_credentials_in_env_are_refused_with_the_way_to_do_it(minimal_manifest):
    env = [{"name": "WANDB_MODE", "value": "offline"}, {"name": "HF_TOKEN", "value": "x"}]
    bad = with_spec(minimal_manifest, env=env)
    problems = problems_of(bad)
    assert list(problems) == ["spec.env[1].name"]
    assert "secretRefs" in problems["spec.env[1].name"]


def test_unknown_uri_scheme_is_refused_listing_the_supported_ones(minimal_manifest):
    bad = copy.deepcopy(minimal_manifest)
    bad["spec"]["models"]["actor"]["path"] = "ftp://host/model"
    message = problems_of(bad)["spec.models.actor.path"]
    assert "ftp://" in message and "hf://" in message


def test_unknown_builtin_reward_lists_the_builtins(minimal_manifest):
    bad = with_spec(minimal_manifest, reward={"function": "math_exakt"})
    message = problems_of(bad)["spec.reward.function"]
    assert "math_exact" in message and "package.module:function" in message


def test_manifest_round_trips_through_its_yaml_form(minimal_manifest):
    job = parse_rljob(minimal_manifest)
    again = parse_rljob(job.to_manifest())
    assert again == job


def test_a_null_that_turns_a_default_off_survives_the_round_trip(minimal_manifest):
    # the operator hands the runtime job.to_manifest(): dropping the null would bring dual clip back
    job = parse_rljob(with_spec(minimal_manifest, algorithm={"name": "grpo", "dualClipC": None}))
    assert job.spec.algorithm.dual_clip_c is None
    manifest = job.to_manifest()
    assert manifest["spec"]["algorithm"]["dualClipC"] is None  # type: ignore[index]
    assert parse_rljob(manifest) == job
    # a null that only means "not set" stays out of the YAML
    assert "critic" not in parse_rljob(minimal_manifest).to_manifest()["spec"]["models"]  # type: ignore[index]


def test_lora_defaults_and_refusals_name_the_field(minimal_manifest):
    manifest = copy.deepcopy(minimal_manifest)
    manifest["spec"]["models"]["actor"]["lora"] = {}
    lora = parse_rljob(manifest).spec.models.actor.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (8, 16, 0.0, ["all-linear"])
    assert (lora.train_head, lora.sync, lora.export_merged) == (False, "adapter", False)
    assert parse_rljob(minimal_manifest).spec.models.actor.lora is None  # a full fine-tune by default
    manifest["spec"]["models"]["actor"]["lora"] = {"rank": 0, "targetModules": [], "sync": "tensors"}
    problems = problems_of(manifest)
    assert {
        "spec.models.actor.lora.rank",
        "spec.models.actor.lora.targetModules",
        "spec.models.actor.lora.sync",
    } <= set(problems), problems
