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


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("http://bob:hunter2@proxy.corp:3128", "a URL with a password"),
        ("postgresql://svc:s3cr3t@db:5432/runs", "a URL with a password"),
        ("https://api.example.com/v1?api_key=abc123", "api_key="),
        ("https://hooks.example.com/x?foo=1&token=abc", "token="),
        ("https://bucket.s3.amazonaws.com/x?X-Amz-Signature=deadbeef", "X-Amz-Signature="),
    ],
)
def test_a_credential_in_an_env_value_is_refused_like_one_in_its_name(minimal_manifest, value: str, why: str):
    bad = with_spec(minimal_manifest, env=[{"name": "CALLBACK_URL", "value": value}])
    message = problems_of(bad)["spec.env[0].value"]
    assert why in message and "Secret" in message and value not in message  # the credential is not echoed


#: Tokens in the form each provider gives them (made up, of the documented prefix and length).
TOKENS = [
    ("sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8t" * 2, "an OpenAI-style API key"),
    ("sk-ant-api03-" + "x7Y2" * 20, "an Anthropic API key"),
    ("ghp_" + "a1B2c3D4e5F6" * 3, "a GitHub token"),
    ("github_pat_11ABCDEFG0" + "q" * 60, "a GitHub token"),
    ("glpat-" + "AbCdEfGhIj1234567890", "a GitLab token"),
    ("hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz123456", "a Hugging Face token"),
    ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp", "a Slack token"),
    ("AKIA" + "IOSFODNN7EXAMPLE", "an AWS access key id"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "a JWT"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n", "a private key"),
]


@pytest.mark.parametrize(("token", "why"), TOKENS, ids=[kind for _, kind in TOKENS])
def test_a_token_known_by_its_prefix_is_refused_in_env_whatever_the_variables_name(minimal_manifest, token, why):
    bad = with_spec(minimal_manifest, env=[{"name": "CALLBACK", "value": token}])
    message = problems_of(bad)["spec.env[0].value"]
    assert why in message and "Secret" in message and token not in message  # the credential is not echoed


@pytest.mark.parametrize("name", ["OPENAI_KEY", "GH_PAT", "GOOGLE_APPLICATION_CREDENTIALS_JSON", "KEY"])
def test_a_name_ending_in_key_or_pat_is_refused_like_the_credential_words(minimal_manifest, name: str):
    assert (
        "secretRefs" in problems_of(with_spec(minimal_manifest, env=[{"name": name, "value": "x"}]))["spec.env[0].name"]
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KEYS_DIR", "/keys"),
        ("PIP_EXTRA", "scikit-learn sk-learn"),  # words, not a key
        ("TASK", "task-" + "a" * 40),  # `sk-` inside a word
        ("GIT_COMMIT", "3f2a" * 10),  # 40 hex characters: no prefix, not a known token
        ("HF_HUB_ENABLE_HF_TRANSFER", "1"),
    ],
)
def test_values_and_names_that_only_look_alike_are_fine(minimal_manifest, name: str, value: str):
    parse_rljob(with_spec(minimal_manifest, env=[{"name": name, "value": value}]))


def test_a_credential_in_a_pod_templates_env_is_refused_but_a_secret_reference_passes(minimal_manifest):
    token = TOKENS[2][0]
    container = {
        "name": "ray-worker",
        "env": [
            {"name": "GITHUB", "value": token},
            {"name": "DB_PASSWORD", "value": "hunter2"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ],
    }
    bad = with_spec(minimal_manifest, resources={"actor": {"podTemplate": {"spec": {"containers": [container]}}}})
    problems = problems_of(bad)
    at = "spec.resources.actor.podTemplate.spec.containers[0].env"
    assert sorted(problems) == [f"{at}[0].value", f"{at}[1].value"]
    assert "a GitHub token" in problems[f"{at}[0].value"] and token not in problems[f"{at}[0].value"]
    assert "DB_PASSWORD, by its name" in problems[f"{at}[1].value"]


def test_the_credential_checks_examples_hold():
    import doctest

    from kuberl.api import credentials

    assert doctest.testmod(credentials).failed == 0


@pytest.mark.parametrize(
    "value", ["https://proxy.corp:3128", "https://bob@git.example.com/repo", "https://x.com/?mode=fast&top_k=5"]
)
def test_urls_without_credentials_are_fine_in_env(minimal_manifest, value: str):
    parse_rljob(with_spec(minimal_manifest, env=[{"name": "SOME_URL", "value": value}]))


def test_a_credential_in_a_reward_endpoint_or_a_location_is_refused(minimal_manifest):
    bad = with_spec(
        minimal_manifest,
        reward={"endpoint": {"url": "https://rm.example.com/score?api_key=abc"}},
        data={"train": "s3://bucket/train.jsonl?X-Amz-Credential=AKIA123"},
    )
    bad["spec"]["models"]["actor"]["path"] = "hf://user:hf_abcdef@org/model"
    problems = problems_of(bad)
    assert set(problems) == {"spec.reward.endpoint.url", "spec.data.train", "spec.models.actor.path"}
    assert all("Secret" in message for message in problems.values())


@pytest.mark.parametrize(
    ("selector", "blamed"),
    [
        ({"gpu type": "a100"}, "'gpu type' is not a label key"),
        ({"-gpu": "a100"}, "'-gpu' is not a label key"),
        ({"Example.com/gpu": "a100"}, "is not a label key"),  # the DNS prefix is lower case
        ({"nvidia.com/" + "g" * 64: "a100"}, "is not a label key"),  # names are at most 63 characters
        ({"nvidia.com/gpu.product": "A100 SXM"}, "is not a label value"),
    ],
)
def test_node_selector_keys_and_values_are_label_syntax(minimal_manifest, selector: dict, blamed: str):
    bad = with_spec(minimal_manifest, resources={"actor": {"nodeSelector": selector}})
    assert blamed in problems_of(bad)["spec.resources.actor.nodeSelector"]
    fine = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "kubernetes.io/arch": "amd64", "pool": ""}
    parse_rljob(with_spec(minimal_manifest, resources={"actor": {"nodeSelector": fine}}))


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


def test_a_pod_grace_period_shorter_than_the_stop_window_is_refused(minimal_manifest):
    manifest = with_spec(
        minimal_manifest,
        runPolicy={"stopGracePeriodSeconds": 300},
        resources={"head": {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 30}}}},
    )
    problems = problems_of(manifest)
    path = "spec.resources.head.podTemplate.spec.terminationGracePeriodSeconds"
    assert "shorter than runPolicy.stopGracePeriodSeconds (300 s)" in problems[path]


def test_the_stop_window_is_at_least_rays_own(minimal_manifest):
    problems = problems_of(with_spec(minimal_manifest, runPolicy={"stopGracePeriodSeconds": 1}))
    assert "spec.runPolicy.stopGracePeriodSeconds" in problems
