"""The knobs a verl user carries over (issue #21 B): placement's new name, the rollout and reference dtypes,
vLLM engine arguments checked at the door, and per-role micro-batch sizes.

`kuberl validate` is what a user runs, so the refusals are read from its output.
"""

import copy

import pytest
import yaml

from kuberl.api import ManifestError, parse_rljob
from kuberl.api.engine_args import SET_BY_KUBERL, VLLM_ENGINE_ARGS
from kuberl.api.explain import explain
from kuberl.cli import main
from tests.unit.api.test_rules import spec_with


def problems_of(changes: dict) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        parse_rljob(spec_with(changes))
    return {problem.path: problem.message for problem in caught.value.problems}


def test_the_old_placement_key_is_refused_naming_the_new_one():
    problems = problems_of({"rollout.mode": "separate"})
    assert list(problems) == ["spec.rollout.mode"]
    assert "did you mean placement?" in problems["spec.rollout.mode"]
    assert "verl's rollout.mode" in problems["spec.rollout.mode"]
    assert parse_rljob(spec_with({})).spec.rollout.placement == "colocated"


def test_a_misspelled_engine_argument_is_refused_by_kuberl_validate_with_a_did_you_mean(tmp_path, capsys):
    manifest = spec_with({"rollout.engineArgs": {"max_num_batched_token": 8192, "enable_prefix_caching": True}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["validate", str(path)]) != 0
    out = capsys.readouterr()
    said = out.out + out.err
    assert "spec.rollout.engineArgs.max_num_batched_token" in said
    assert "did you mean max_num_batched_tokens?" in said
    assert "enable_prefix_caching" not in said  # the correct one beside it is fine


@pytest.mark.parametrize(
    ("name", "value", "phrase"),
    [
        ("dtype", "bfloat16", "set by spec.rollout.dtype"),
        ("gpu_memory_utilization", 0.9, "set by spec.rollout.gpuMemoryUtilization"),
        ("kv_cache_memory_bytes", 1 << 30, "set by spec.rollout.kvCacheBytes"),
        ("enforce_eager", True, "from the device"),
        ("tensor_parallel_size", 2, "set by spec.rollout.tensorParallelSize"),
        ("max_num_seqs", "64", "takes an integer"),
        ("max_num_seqs", True, "takes an integer"),
        ("enable_chunked_prefill", 1, "takes true or false"),
        ("max_num_batched_tokens", -1, "must not be negative"),
        ("no_such_argument_at_all", 1, "unknown vLLM engine argument"),
    ],
)
def test_engine_arguments_kuberl_sets_or_of_the_wrong_type_are_refused_naming_why(name, value, phrase):
    problems = problems_of({"rollout.engineArgs": {name: value}})
    assert list(problems) == [f"spec.rollout.engineArgs.{name}"]
    assert phrase in problems[f"spec.rollout.engineArgs.{name}"]


def test_allowed_and_kuberl_set_engine_arguments_do_not_overlap():
    assert not set(VLLM_ENGINE_ARGS) & set(SET_BY_KUBERL)


def test_fp32_training_with_bf16_rollout_is_writable_and_round_trips():
    job = parse_rljob(spec_with({"rollout.dtype": "bfloat16", "rollout.engineArgs": {"max_num_seqs": 64}}))
    assert job.spec.models.actor.dtype == "float32" and job.spec.rollout.dtype == "bfloat16"
    again = parse_rljob(copy.deepcopy(job.to_manifest()))
    assert again.spec.rollout.engine_args == {"max_num_seqs": 64}
    assert again.spec.rollout.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("field", "verl"),
    [
        ("spec.rollout.placement", "verl's rollout.mode"),
        ("spec.rollout.dtype", "rollout.dtype"),
        ("spec.rollout.engineArgs", "engine_kwargs.vllm"),
        ("spec.models.reference.dtype", "ref.fsdp_config.model_dtype"),
        ("spec.models.actor.microBatchSize", "actor.ppo_micro_batch_size_per_gpu"),
        ("spec.models.actor.forwardMicroBatchSize", "rollout.log_prob_micro_batch_size_per_gpu"),
        ("spec.models.critic.microBatchSize", "critic.ppo_micro_batch_size_per_gpu"),
        ("spec.models.critic.forwardMicroBatchSize", "critic.forward_micro_batch_size_per_gpu"),
        ("spec.models.reference.microBatchSize", "ref.log_prob_micro_batch_size_per_gpu"),
        ("spec.models.critic.gradientCheckpointing", "critic.model.enable_gradient_checkpointing"),
    ],
)
def test_kuberl_explain_names_the_verl_knob_of_each_field(field, verl):
    assert verl in explain(field)


def test_role_micro_batch_sizes_must_be_positive():
    problems = problems_of({"models.actor": {"path": "/m", "microBatchSize": 0}})
    assert list(problems) == ["spec.models.actor.microBatchSize"]


def test_optimizer_offload_goes_with_parameter_offload():
    for half in ({"params": True}, {"optimizer": True}):
        problems = problems_of({"models.actor": {"path": "/m", "offload": half}})
        assert list(problems) == ["spec.models.actor.offload.optimizer"]
        assert "FSDP2" in problems["spec.models.actor.offload.optimizer"]
    both = parse_rljob(spec_with({"models.critic": {"offload": {"params": True, "optimizer": True}}}))
    assert both.spec.models.critic is not None and both.spec.models.critic.offload.params


def test_offloading_per_layer_needs_offloaded_parameters():
    for either in (True, False):
        problems = problems_of({"models.actor": {"path": "/m", "offload": {"perLayer": either}}})
        assert list(problems) == ["spec.models.actor.offload.perLayer"]
        assert "params: true" in problems["spec.models.actor.offload.perLayer"]
    offload = {"params": True, "optimizer": True, "perLayer": False}
    parsed = parse_rljob(spec_with({"models.actor": {"path": "/m", "offload": offload}}))
    assert parsed.spec.models.actor.offload.per_layer is False


def test_gradients_on_device_needs_offloaded_parameters_and_a_model_moved_layer_by_layer_to_be_false():
    for either in (True, False):
        problems = problems_of({"models.critic": {"offload": {"gradientsOnDevice": either}}})
        assert list(problems) == ["spec.models.critic.offload.gradientsOnDevice"]
        assert "params: true" in problems["spec.models.critic.offload.gradientsOnDevice"]
    offloaded = {"params": True, "optimizer": True}
    problems = problems_of(
        {"models.actor": {"path": "/m", "offload": offloaded | {"perLayer": False, "gradientsOnDevice": False}}}
    )
    assert list(problems) == ["spec.models.actor.offload.gradientsOnDevice"]
    assert "set perLayer: true" in problems["spec.models.actor.offload.gradientsOnDevice"]
    for per_layer, gradients in ((True, True), (True, False), (False, True), (None, False), (None, True)):
        fields = offloaded | {"gradientsOnDevice": gradients} | ({} if per_layer is None else {"perLayer": per_layer})
        parsed = parse_rljob(spec_with({"models.actor": {"path": "/m", "offload": fields}}))
        assert parsed.spec.models.actor.offload.gradients_on_device is gradients


def test_a_lora_actors_own_reference_cannot_be_offloaded_apart():
    lora = {"path": "/m", "lora": {"rank": 4}}
    problems = problems_of({"models.actor": lora, "models.reference": {"offload": {"params": True}}})
    assert list(problems) == ["spec.models.reference.offload.params"]
    assert "models.actor.offload" in problems["spec.models.reference.offload.params"]
    separate = {"models.actor": lora, "models.reference": {"path": "/ref", "offload": {"params": True}}}
    assert parse_rljob(spec_with(separate)).spec.models.reference.offload.params  # a model of its own: fine


def test_a_token_budget_must_hold_the_longest_sequence():
    base = {"data.maxPromptLength": 100, "rollout.maxNewTokens": 50}
    problems = problems_of({**base, "models.actor": {"path": "/m", "forwardMaxTokensPerMicroBatch": 149}})
    assert list(problems) == ["spec.models.actor.forwardMaxTokensPerMicroBatch"]
    assert "at least 150" in problems["spec.models.actor.forwardMaxTokensPerMicroBatch"]
    fits = parse_rljob(spec_with({**base, "models.reference": {"maxTokensPerMicroBatch": 150}}))
    assert fits.spec.models.reference is not None and fits.spec.models.reference.max_tokens_per_micro_batch == 150


def test_padding_free_and_offload_are_explained_with_verls_names():
    assert "use_remove_padding" in explain("spec.training.paddingFree")
    assert "param_offload" in explain("spec.models.actor.offload.params")
    assert "ppo_max_token_len_per_gpu" in explain("spec.models.critic.maxTokensPerMicroBatch")
