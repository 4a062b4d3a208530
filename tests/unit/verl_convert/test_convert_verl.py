"""`kuberl convert verl`: verl launch scripts written in the style of verl's examples, converted; each manifest
validates, trains with verl's effective values, and the lost knobs are exactly the ones expected."""

import doctest
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl import cli
from kuberl.api import parse_rljob
from kuberl.api.verl_defaults import VERL_DIFFERENCES
from kuberl.verl import command, convert, knobs, rules
from kuberl.verl.command import LaunchError, read_launch

LAUNCHES = Path(__file__).parent / "launches"
ENV = {"HOME": "/home/me"}

#: What every conversion loses unless the script says otherwise: verl's defaults kuberl cannot follow yet.
ROLLOUT_DTYPE: dict[str, bool] = {}  # verl generates in bfloat16: carried as rollout.dtype
VERL_TP: dict[str, bool] = {}  # verl's default tensor parallel 2 is carried: rollout.tensorParallelSize


def conversion_of(name: str, **env: str) -> convert.Conversion:
    return convert.convert(read_launch((LAUNCHES / name).read_text(), ENV | env))


def lost(conversion: convert.Conversion) -> dict[str, bool]:
    """{verl key: changes what is trained} of every knob the conversion lost."""
    keys = [knob.key for knob in conversion.lost]
    assert len(keys) == len(set(keys)), f"a knob is reported twice: {keys}"
    return {knob.key: knob.changes_training for knob in conversion.lost}


def test_docstring_examples_are_true() -> None:
    for module in (command, convert, knobs, rules):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_grpo_gsm8k_converts_without_losing_anything_that_trains() -> None:
    conversion = conversion_of("grpo_gsm8k.sh")
    assert lost(conversion) == {} | ROLLOUT_DTYPE
    assert conversion.changes_training == []
    job = parse_rljob(conversion.manifest)
    spec = job.spec
    assert job.metadata.name == "qwen2-7b-function-rm"
    # the shell variables resolved (one from the environment's default), the list of files kept
    assert spec.data.train == ["/home/me/data/gsm8k/train.parquet", "/data/math/train.parquet"]
    assert spec.data.validation == ["/home/me/data/gsm8k/test.parquet"]
    assert spec.models.actor.path == "hf://Qwen/Qwen2-7B-Instruct"
    # verl's values, including the defaults that differ from kuberl's, are what the job trains with
    assert (spec.algorithm.name, spec.algorithm.advantage_estimator, spec.algorithm.group_size) == ("grpo", "grpo", 5)
    assert spec.algorithm.loss_aggregation == "token_mean"  # verl's default; kuberl's grpo preset: seq_mean_token_mean
    assert spec.models.actor.optim.weight_decay == 0.01  # verl's default; kuberl's: 0
    assert spec.models.actor.gradient_checkpointing is True
    assert spec.training.padding_free is True  # use_remove_padding=True
    assert spec.models.reference is not None and spec.models.reference.offload.params  # ref param_offload=True
    assert not spec.models.actor.offload.params  # param_offload=False, optimizer_offload=False
    assert (spec.algorithm.kl.coef, spec.algorithm.kl.placement, spec.algorithm.kl.estimator) == (0.001, "loss", "k3")
    assert (spec.algorithm.clip_ratio_low, spec.algorithm.clip_ratio_high, spec.algorithm.dual_clip_c) == (0.2, 0.2, 3)
    assert (spec.data.batch_size, spec.algorithm.mini_batch_size, spec.rollout.max_new_tokens) == (1024, 256, 1024)
    assert (spec.data.overlong_prompt, spec.data.chat_template) == ("drop", True)
    assert (spec.training.epochs, spec.training.validation_every_steps, spec.checkpoint.interval_steps) == (15, 5, 20)
    assert spec.training.validate_before_training  # verl's default val_before_train: validate before the first step
    assert spec.training.micro_batch_size == 40  # actor, reference and rollout all 40: one size carries them
    assert (spec.resources.actor.replicas, spec.resources.actor.gpus, spec.rollout.gpu_memory_utilization) == (
        1,
        8,
        0.6,
    )
    assert spec.reward.function == "by_data_source"  # verl's default_compute_score
    assert spec.models.critic is None  # GRPO has no critic: critic knobs at their defaults stay out
    assert spec.tracking is not None and spec.tracking.wandb is not None and spec.tracking.mlflow is None
    assert (spec.tracking.project, spec.tracking.run_name) == ("verl_grpo_example_gsm8k", "qwen2_7b_function_rm")
    # the manifest keeps only what differs from kuberl's defaults
    assert "lam" not in conversion.manifest["spec"]["algorithm"]
    assert "kl" not in conversion.manifest["spec"]["algorithm"]  # 0.001, k3, in the loss: the grpo preset's


def test_ppo_with_a_critic_pins_verls_gae_lambda_value_clip_and_weight_decay() -> None:
    conversion = conversion_of("ppo_critic.sh")
    assert (
        lost(conversion) == {} | ROLLOUT_DTYPE
    )  # val_before_train=False, the critic's micro-batch equal to the actor's: nothing lost
    spec = parse_rljob(conversion.manifest).spec
    assert spec.training.padding_free  # the critic's use_remove_padding; the actor's is not set
    assert (spec.algorithm.name, spec.algorithm.advantage_estimator, spec.algorithm.group_size) == ("ppo", "gae", 1)
    assert (spec.algorithm.lam, spec.algorithm.value_clip, spec.algorithm.gamma) == (1.0, 0.5, 1.0)
    assert spec.models.critic is not None and spec.models.critic.path == "hf://deepseek-ai/deepseek-llm-7b-chat"
    assert (spec.models.critic.optim.lr, spec.models.critic.optim.weight_decay) == (1e-5, 0.01)
    assert spec.algorithm.kl.coef == 0.0  # verl's defaults put no KL anywhere; kuberl's ppo preset has 0.001
    assert spec.algorithm.loss_aggregation == "token_mean"
    assert (spec.resources.actor.replicas, spec.resources.actor.gpus) == (2, 8)
    assert spec.tracking is not None and spec.tracking.mlflow is not None and spec.tracking.wandb is None
    assert spec.checkpoint.interval_steps is None  # save_freq=-1


def test_ppo_with_a_reward_model_reports_the_chat_template_verl_renders_again() -> None:
    conversion = conversion_of("ppo_reward_model.sh")
    assert (
        lost(conversion)
        == {
            # verl decodes the response and renders the chat again in the reward model's template
            # (experimental/reward_loop/reward_loop.py _preprocess_reward_inputs); kuberl scores the actor's text
            "reward_model.use_reward_loop": True,
            # verl runs it on the trainer's GPUs; kuberl's reward pool on resources.reward (CPU by default)
            "reward_model.enable_resource_pool": False,
            # the reward model's token budget, packing and offload: it runs unsharded with transformers, padded
            "reward_model.use_dynamic_bsz": False,
            "reward_model.forward_max_token_len_per_gpu": False,
            "reward_model.model.use_remove_padding": False,
            "reward_model.model.fsdp_config.param_offload": False,
        }
        | ROLLOUT_DTYPE
    )
    assert [knob.key for knob in conversion.changes_training] == ["reward_model.use_reward_loop"]
    assert "the reward model's own chat template" in str(conversion.changes_training[0])
    spec = parse_rljob(conversion.manifest).spec
    assert spec.reward.model is not None and spec.reward.function is None
    assert (spec.reward.model.path, spec.reward.model.batch_size) == ("hf://sfairXC/FsfairX-LLaMA3-RM-v0.1", 2)
    assert spec.reward.model.dtype == "bfloat16"  # verl's reward_model.rollout.dtype; kuberl's default is float32
    assert spec.training.micro_batch_size == 16  # ppo_micro_batch_size 128 over 8 GPUs, as verl divides it
    assert spec.algorithm.kl.coef == 0.0  # kl_ctrl.kl_coef is set, but use_kl_in_reward is verl's default False
    assert spec.data.validation == ["/home/me/data/gsm8k/test.parquet", "/home/me/data/math/test.parquet"]
    assert (spec.data.max_prompt_length, spec.rollout.max_new_tokens, spec.training.epochs) == (4096, 4096, 100)
    # token budgets: the actor's, its forwards' (verl's default follows the actor's switch and budget), the critic's
    actor, critic, reference = spec.models.actor, spec.models.critic, spec.models.reference
    assert (actor.max_tokens_per_micro_batch, actor.forward_max_tokens_per_micro_batch) == (24000, 24000)
    assert critic is not None and reference is not None
    assert (critic.max_tokens_per_micro_batch, critic.forward_max_tokens_per_micro_batch) == (98304, 98304)
    assert reference.max_tokens_per_micro_batch == 24000
    assert spec.training.padding_free and reference.offload.params and not critic.offload.params


def test_dapo_with_lora_carries_the_adapters_and_loses_what_changes_training() -> None:
    conversion = conversion_of("dapo_lora.sh")
    assert (
        lost(conversion)
        == {
            "data.truncation": True,  # middle truncation
            "data.gen_batch_size": True,
            "actor_rollout_ref.model.override_config.attention_dropout": True,  # even 0: kuberl keeps the config's
            "trainer.my_extra_knob": True,  # +key=, unknown to the table: assumed to change training
        }
        | ROLLOUT_DTYPE
        | VERL_TP
    )
    spec = parse_rljob(conversion.manifest).spec  # what could be carried still makes a valid job
    assert (spec.algorithm.clip_ratio_low, spec.algorithm.clip_ratio_high, spec.algorithm.dual_clip_c) == (
        0.2,
        0.28,
        10,
    )
    lora = spec.models.actor.lora
    assert lora is not None and (lora.rank, lora.alpha, lora.target_modules) == (64, 32, ["all-linear"])
    sampling = spec.algorithm.dynamic_sampling
    assert sampling is not None and (sampling.metric, sampling.max_rounds_per_step) == ("acc", 10)
    penalty = spec.reward.overlong_penalty
    assert penalty is not None and (penalty.buffer_length, penalty.penalty_factor) == (4096, 1.0)
    assert (spec.algorithm.kl.coef, spec.algorithm.group_size) == (0.0, 16)
    assert spec.algorithm.loss_aggregation == "token_mean"  # use_token_level_loss=True
    assert spec.models.actor.path == "/home/me/verl/models/Qwen2.5-7B"  # ${MODEL_PATH:-"${RAY_DATA_HOME}/..."}
    assert (spec.models.actor.optim.warmup_steps, spec.models.actor.optim.weight_decay) == (10, 0.1)
    assert (spec.resources.actor.replicas, spec.checkpoint.interval_steps) == (4, 10)
    assert spec.tracking is None  # console and tensorboard: kuberl writes TensorBoard events anyway


def test_gspo_on_megatron_with_shell_arithmetic() -> None:
    conversion = conversion_of("gspo_megatron.sh", NNODES="2")
    assert (
        lost(conversion)
        == {
            # loss_agg_mode=token-mean loses nothing: verl's gspo aggregates per sequence whatever it says
            "data.gen_batch_size": True,
            "--config-name": False,  # Megatron: its defaults agree with ppo_trainer's where the converter reads
            # megatron.param_offload is carried (models.actor.offload); FSDP2 offloads the optimiser with it
            "actor_rollout_ref.actor.megatron.optimizer_offload": False,
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": False,  # pipeline size 1: nothing lost
            "trainer.logger": False,  # swanlab; wandb is carried
            "actor_rollout_ref.rollout.max_num_batched_tokens": False,
            "actor_rollout_ref.rollout.enforce_eager": False,  # enable_chunked_prefill=True is vLLM's own behaviour
            "actor_rollout_ref.rollout.calculate_log_probs": False,
            "actor_rollout_ref.rollout.val_kwargs.top_p": False,
            "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
            "trainer.log_val_generations": False,
        }
        | ROLLOUT_DTYPE
    )
    by_key = {knob.key: knob.value for knob in conversion.lost}
    assert by_key["data.gen_batch_size"] == 20  # $((16 * 5 / 4)), integer division
    spec = parse_rljob(conversion.manifest).spec
    assert spec.models.actor.offload.params and spec.models.actor.offload.optimizer  # megatron.param_offload=True
    # $(((4096 + 3072) * 1)) and * 3: the actor's update and its log-prob forward cut by tokens
    assert (spec.models.actor.max_tokens_per_micro_batch, spec.models.actor.forward_max_tokens_per_micro_batch) == (
        7168,
        21504,
    )
    assert (spec.algorithm.policy_loss, spec.algorithm.loss_aggregation) == ("gspo", "seq_mean_token_mean")
    assert (spec.algorithm.clip_ratio_low, spec.algorithm.clip_ratio_high) == (3e-4, 4e-4)
    assert (spec.data.max_prompt_length, spec.rollout.max_new_tokens, spec.data.overlong_prompt) == (
        4096,
        3072,
        "truncate_left",
    )
    penalty = spec.reward.overlong_penalty  # the DAPO reward manager's reward_kwargs spelling
    assert penalty is not None and (penalty.buffer_length, penalty.penalty_factor) == (2048, 1.0)
    assert (spec.resources.actor.replicas, spec.training.total_steps) == (2, 500)
    assert spec.checkpoint.uri == "/ckpts/GSPO-qwen8b/GSPO-Qwen3-8b"
    assert spec.tracking is not None and spec.tracking.run_name == "GSPO-Qwen3-8b-tp2"


def test_a_one_line_command_with_a_reward_file_and_an_adaptive_kl() -> None:
    conversion = conversion_of("custom_reward_kl.txt")
    assert (
        lost(conversion)
        == {
            "algorithm.kl_ctrl.type": True,
            "actor_rollout_ref.rollout.name": False,  # sglang: generated with vLLM instead
            "actor_rollout_ref.rollout.tensor_model_parallel_size": False,  # verl's default 2 on a 1-GPU node
        }
        | ROLLOUT_DTYPE
    )
    spec = parse_rljob(conversion.manifest).spec
    assert spec.rollout.engine == "vllm"
    assert spec.reward.function == "/opt/rewards/my_reward.py:score_it"
    assert (spec.algorithm.kl.coef, spec.algorithm.kl.placement, spec.algorithm.kl.estimator) == (0.005, "reward", "k1")
    assert spec.models.actor.optim.warmup_steps == 20  # 10% of total_training_steps 200
    assert spec.training.total_steps == 200


MINIMAL = "python3 -m verl.trainer.main_ppo data.train_files=/d/train.parquet actor_rollout_ref.model.path=/m"

#: For each default that differs (api/verl_defaults.py): the overrides that make it matter, and where to read it.
PINNED: dict[str, tuple[str, Any]] = {
    "rollout.dtype": ("", "bfloat16"),
    "models.critic.gradientCheckpointing": ("algorithm.adv_estimator=gae", True),
    "algorithm.name": ("", "ppo"),  # verl's gae
    "algorithm.groupSize": ("", 1),
    "algorithm.lossAggregation": ("", "token_mean"),
    "algorithm.kl.coef": ("", 0.0),
    "algorithm.lam": ("", 1.0),
    "algorithm.valueClip": ("", 0.5),
    "algorithm.miniBatchSize": ("", 256),
    "algorithm.klCov.coef": (
        "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov algorithm.adv_estimator=grpo "
        "actor_rollout_ref.rollout.n=4",
        0.1,
    ),  # fmt: skip
    "models.actor.optim.weightDecay": ("", 0.01),
    "models.critic.optim.weightDecay": ("", 0.01),
    "models.actor.gradientCheckpointing": ("", True),
    "data.chatTemplate": ("", True),
    "data.batchSize": ("", 1024),
    "rollout.maxNewTokens": ("", 512),
    "rollout.syncBucketMb": ("", 512),
    "training.epochs": ("", 30),
    "checkpoint.intervalSteps": ("", None),  # verl saves only when asked: kuberl then saves after the last step
    "checkpoint.keepLast": ("", 1000),  # verl keeps all; kuberl's most
    "tracking": ("", {"project": "verl_examples", "runName": "gsm8k", "wandb": {"entity": None, "mode": "online"}}),
    "resources.actor.gpus": ("", 8),
    "rollout.tensorParallelSize": ("", 2),  # verl's colocated engine split over two of the actor's GPUs
}
#: Differences kuberl cannot follow yet: the converter lists them as lost instead of pinning them.
LOST_INSTEAD: dict[str, str] = {}


def test_a_mini_batch_that_does_not_divide_the_batch_is_lost_and_the_nearest_divisor_written() -> None:
    overrides = (
        "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=3 actor_rollout_ref.actor.ppo_mini_batch_size=80"
    )
    conversion = convert.convert(read_launch(f"{MINIMAL} {overrides} actor_rollout_ref.actor.use_gpg_loss=True"))
    assert lost(conversion) == {"actor_rollout_ref.actor.ppo_mini_batch_size": True} | ROLLOUT_DTYPE | VERL_TP
    spec = parse_rljob(conversion.manifest).spec
    assert spec.algorithm.mini_batch_size == 64  # verl runs 80 with a short last mini-batch; 64 divides 1024
    assert spec.algorithm.policy_loss == "gpg"  # verl's older use_gpg_loss switch
    hf = convert.convert(read_launch(f"{MINIMAL} actor_rollout_ref.rollout.name=hf"))
    assert parse_rljob(hf.manifest).spec.rollout.engine == "hf"  # verl's HF rollout is kuberl's hf engine
    assert lost(hf) == {"actor_rollout_ref.rollout.tensor_model_parallel_size": False} | ROLLOUT_DTYPE  # not split


def _at(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_default_that_differs_from_verls_is_pinned_or_reported_lost() -> None:
    assert set(PINNED) | set(LOST_INSTEAD) == set(VERL_DIFFERENCES)  # a new difference needs its line here
    for path, (extra, verl_value) in PINNED.items():
        conversion = convert.convert(read_launch(f"{MINIMAL} {extra}"))
        spec = parse_rljob(conversion.manifest).spec.model_dump(by_alias=True, mode="json")
        value = _at(spec, path)
        if isinstance(verl_value, dict):
            value = {key: item for key, item in value.items() if key in verl_value}
        assert value == verl_value, path
    lost_keys = {knob.key for knob in convert.convert(read_launch(MINIMAL)).lost}
    assert set(LOST_INSTEAD.values()) <= lost_keys
    for path, key in LOST_INSTEAD.items():
        assert VERL_DIFFERENCES[path].verl_key == key


def test_the_difference_table_agrees_with_the_converters_verl_defaults() -> None:
    for path, difference in VERL_DIFFERENCES.items():
        if difference.verl_key in knobs.VERL_DEFAULTS:
            assert knobs.VERL_DEFAULTS[difference.verl_key] == difference.verl_value, path


def test_explain_states_verls_default_and_the_reason(capsys) -> None:
    assert cli.main(["explain", "spec.algorithm.lam"]) == 0
    out = capsys.readouterr().out
    assert "DEFAULT:  0.95" in out and "VERL:     algorithm.lam=1.0 (kuberl differs: 0.95 is the GAE paper" in out
    assert cli.main(["explain", "--verl"]) == 0
    out = capsys.readouterr().out
    for path, difference in VERL_DIFFERENCES.items():
        assert f"spec.{path}: kuberl " in out and difference.why in out


def test_the_cli_prints_a_manifest_that_validates_and_lists_lost_knobs(tmp_path, capsys) -> None:
    assert cli.main(["convert", "verl", str(LAUNCHES / "grpo_gsm8k.sh"), "--env", "HOME=/home/me"]) == 0
    out, err = capsys.readouterr()
    (tmp_path / "job.yaml").write_text(out)
    assert cli.main(["validate", str(tmp_path / "job.yaml")]) == 0
    assert yaml.safe_load(out)["spec"]["data"]["train"][0] == "/home/me/data/gsm8k/train.parquet"
    assert err == ""  # every knob carried: val_before_train and the engine split over two GPUs
    assert yaml.safe_load(out)["spec"]["rollout"]["tensorParallelSize"] == 2


def test_the_cli_refuses_a_lossy_conversion_unless_the_loss_is_accepted(tmp_path, capsys) -> None:
    script = str(LAUNCHES / "dapo_lora.sh")
    assert cli.main(["convert", "verl", script]) == cli.EXIT_LOSSY_CONVERSION
    out, err = capsys.readouterr()
    assert out == "" and "4 lost knobs change what is trained" in err and "--accept-loss" in err
    assert "(data.truncation, data.gen_batch_size, actor_rollout_ref.model.override_config.attention_dropout, " in err
    assert cli.main(["convert", "verl", script, "--accept-loss", "--name", "dapo"]) == 0
    out, _ = capsys.readouterr()
    assert parse_rljob(yaml.safe_load(out)).metadata.name == "dapo"


def test_the_cli_reads_a_command_line_after_double_dash(capsys) -> None:
    command_line = f"{MINIMAL} algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4".split()
    argv = ["convert", "verl", "--", *command_line]
    assert cli.main(argv) == 0
    out, _ = capsys.readouterr()
    spec = parse_rljob(yaml.safe_load(out)).spec
    assert (spec.algorithm.group_size, spec.data.train) == (4, "/d/train.parquet")


def test_the_cli_reads_a_script_from_stdin(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((LAUNCHES / "ppo_critic.sh").read_text()))
    assert cli.main(["convert", "verl", "-", "--env", "HOME=/h"]) == 0
    out, _ = capsys.readouterr()
    assert parse_rljob(yaml.safe_load(out)).spec.data.train == "/h/data/gsm8k/train.parquet"


def test_a_job_kuberl_refuses_names_the_field(capsys) -> None:
    argv = [
        "convert",
        "verl",
        "--",
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        "data.train_files=/d/train.parquet",
        "actor_rollout_ref.model.path=/m",
    ]  # fmt: skip  (n=1: no group)
    assert cli.main(argv) == 1
    assert "spec.algorithm.groupSize" in capsys.readouterr().err


def test_an_unquoted_list_cut_by_the_shell_is_refused() -> None:
    with pytest.raises(LaunchError, match="the list is cut at a space"):
        read_launch("python3 -m verl.trainer.main_ppo data.val_files=[$HOME/a.parquet, $HOME/b.parquet]", ENV)
    quoted = read_launch('python3 -m verl.trainer.main_ppo data.val_files="[$HOME/a.parquet, $HOME/b.parquet]"', ENV)
    assert quoted == {"data.val_files": ["/home/me/a.parquet", "/home/me/b.parquet"]}


def test_a_script_without_a_verl_command_is_refused() -> None:
    with pytest.raises(LaunchError, match="no verl trainer command found"):
        read_launch("echo hello\npython3 train.py lr=1\n")


def test_a_command_line_without_a_model_or_data_is_refused_naming_the_key(tmp_path, capsys) -> None:
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo data.train_files=/d/train.parquet trainer.total_epochs=2\n")
    assert cli.main(["convert", "verl", str(script)]) == 1
    err = capsys.readouterr().err
    assert "sets no actor_rollout_ref.model.path" in err and str(script) in err
    assert cli.main(["convert", "verl", str(tmp_path / "missing.sh")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_a_variable_the_script_does_not_set_is_refused_naming_it_and_env_sets_it(tmp_path, capsys) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "ray job submit --working-dir $WORKDIR -- \\\n"  # the launcher's own options may read anything
        "  python3 -m verl.trainer.main_ppo data.train_files=$DATA/train.parquet actor_rollout_ref.model.path=/m\n"
    )
    with pytest.raises(LaunchError, match=r"\$DATA is set neither in the script nor in the environment \(line 2\)"):
        read_launch(script.read_text(), {})
    assert cli.main(["convert", "verl", str(script), "--env", "DATA=/d"]) == 0
    assert parse_rljob(yaml.safe_load(capsys.readouterr().out)).spec.data.train == "/d/train.parquet"


def test_validation_knobs_without_validation_files_lose_nothing() -> None:
    launch = f"{MINIMAL} trainer.test_freq=5 trainer.val_before_train=True actor_rollout_ref.rollout.val_kwargs.n=4"
    conversion = convert.convert(read_launch(launch))
    assert lost(conversion) == ROLLOUT_DTYPE | VERL_TP
    training = parse_rljob(conversion.manifest).spec.training
    assert training.validation_every_steps is None and not training.validate_before_training


@pytest.mark.parametrize(
    "override",
    ["data.train_batch_size=many", "trainer.nnodes=null", "actor_rollout_ref.rollout.top_k=abc", "trainer.save_freq=x"],
)
def test_a_value_verl_would_refuse_is_refused_naming_the_key(override: str) -> None:
    with pytest.raises(LaunchError, match=f"{override.split('=')[0]}=.*not a value verl takes here"):
        convert.convert(read_launch(f"{MINIMAL} {override}"))


def test_omegaconf_interpolations_resolve_to_the_value_they_name() -> None:
    launch = f"{MINIMAL} critic.model.path='${{actor_rollout_ref.model.path}}' trainer.experiment_name=ppo"
    spec = parse_rljob(convert.convert(read_launch(launch)).manifest).spec
    assert spec.models.critic is not None and spec.models.critic.path == "/m"
    with pytest.raises(LaunchError, match="trainer.project_name=\\$\\{oc.env:PROJECT\\}: an interpolation"):
        convert.convert(read_launch(f"{MINIMAL} trainer.project_name='${{oc.env:PROJECT}}'"))


def test_hydra_values_and_shell_quoting_read_as_verl_reads_them() -> None:
    overrides = read_launch(
        "X=a.parquet\nY=\"['$X', 'b.parquet']\"\nN=$((3 * (2 + 1)))\n"
        "python3 -m verl.trainer.main_ppo data.train_files=\"$Y\" a.b=True c=null d=1e-6 e='$X' ++f=[1,2] "
        "--config-path=config --config-name x g=$N h=$((N / 2)) 2>&1 | tee log.txt"
    )
    assert overrides == {"data.train_files": ["a.parquet", "b.parquet"], "a.b": True, "c": None, "d": 1e-6, "e": "$X",
                         "f": [1, 2], "--config-name": "x", "g": 9, "h": 4}  # fmt: skip


def test_every_carried_field_is_a_field_of_the_rljob() -> None:
    from kuberl.api.explain import explain

    for knob in knobs.KNOBS.values():
        if isinstance(knob, knobs.Carry):
            explain("spec." + knob.field)  # raises UnknownFieldPath for a field the schema does not have
    joint = {key for keys in rules.JOINT_KEYS.values() for key in keys}
    assert set(knobs.VERL_DEFAULTS) <= set(knobs.KNOBS) | joint


def test_the_docs_table_names_every_knob_the_converter_knows() -> None:
    text = (Path(__file__).parents[3] / "docs" / "verl.md").read_text(encoding="utf-8")
    keys = set(knobs.KNOBS) | {key for keys in rules.JOINT_KEYS.values() for key in keys}
    # a row may list a family's later keys by their last part (`lora_rank`, `lora_alpha`, ...)
    missing = [key for key in sorted(keys) if f"`{key}" not in text and f"`{key.rsplit('.', 1)[-1]}`" not in text]
    assert missing == []
    for path in VERL_DIFFERENCES:
        assert f"| `{path}` |" in text, path  # a row of the table of defaults that differ


def test_each_roles_micro_batch_size_and_the_critics_checkpointing_are_carried() -> None:
    sizes = (
        "algorithm.adv_estimator=gae actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 "
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 critic.ppo_micro_batch_size_per_gpu=4 "
        "critic.forward_micro_batch_size_per_gpu=8 critic.model.enable_gradient_checkpointing=True "
        "actor_rollout_ref.rollout.dtype=float16"
    )
    conversion = convert.convert(read_launch(f"{MINIMAL} {sizes}"))
    assert not any("micro_batch" in key or "gradient" in key or key.endswith(".dtype") for key in lost(conversion))
    spec = parse_rljob(conversion.manifest).spec
    assert spec.training.micro_batch_size == 8
    assert (spec.models.actor.forward_micro_batch_size, spec.models.reference.micro_batch_size) == (16, 32)
    assert (spec.models.critic.micro_batch_size, spec.models.critic.forward_micro_batch_size) == (4, None)
    assert spec.models.critic.gradient_checkpointing and spec.rollout.dtype == "float16"


def test_offload_switches_become_fsdp2_offload_and_a_half_is_reported() -> None:
    line = (
        f"{MINIMAL} actor_rollout_ref.actor.fsdp_config.param_offload=True "
        "critic.model.fsdp_config.offload_policy=True algorithm.adv_estimator=gae"
    )
    conversion = convert.convert(read_launch(line))
    assert lost(conversion) == {"actor_rollout_ref.actor.fsdp_config.optimizer_offload": False} | VERL_TP
    spec = parse_rljob(conversion.manifest).spec
    assert spec.models.critic is not None
    actor, critic = spec.models.actor.offload, spec.models.critic.offload
    assert (actor.params, actor.optimizer, actor.per_layer) == (True, True, None)  # by the ranks: 1 gathers
    assert (critic.params, critic.optimizer, critic.per_layer) == (True, True, True)  # offload_policy: during too


def test_a_lora_actors_reference_offload_is_reported_not_carried() -> None:
    line = f"{MINIMAL} actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.ref.fsdp_config.param_offload=True"
    conversion = convert.convert(read_launch(line))
    assert lost(conversion) == {"actor_rollout_ref.ref.fsdp_config.param_offload": False} | VERL_TP
    assert "offload" not in conversion.manifest["spec"]["models"].get("reference", {})


def test_a_token_budget_below_the_longest_sequence_is_raised_and_reported() -> None:
    line = (
        f"{MINIMAL} data.max_prompt_length=512 data.max_response_length=1024 "
        "actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000 "
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False"
    )
    conversion = convert.convert(read_launch(line))
    # the reference's budget follows the actor's (verl's default): raised too, reported once
    assert lost(conversion) == {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": False} | VERL_TP
    assert "sequence (maxPromptLength + maxNewTokens): 1536" in str(conversion.lost)
    spec = parse_rljob(conversion.manifest).spec
    assert spec.models.actor.max_tokens_per_micro_batch == 1536
    assert spec.models.actor.forward_max_tokens_per_micro_batch is None  # its own switch is off
    assert spec.models.reference is not None and spec.models.reference.max_tokens_per_micro_batch == 1536


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_verls_optimal_token_baselines_convert_to_the_same_estimator(estimator: str) -> None:
    launch = f"{MINIMAL} algorithm.adv_estimator={estimator} actor_rollout_ref.rollout.n=4"
    conversion = convert.convert(read_launch(launch))
    assert "algorithm.adv_estimator" not in lost(conversion)
    algorithm = parse_rljob(conversion.manifest).spec.algorithm
    assert (algorithm.advantage_estimator, algorithm.group_size) == (estimator, 4)


def test_the_entropy_switches_kuberl_always_has_on_are_not_lost_and_a_kernel_it_lacks_is() -> None:
    """kuberl computes log-probs and the entropy a slice at a time, the softmax recomputed in backward
    (runtime/algorithms/token_scores.py): verl's two switches for that lose nothing, on or off; Liger does."""
    actor = "actor_rollout_ref.actor"
    for value in ("True", "False"):
        switches = f"{actor}.entropy_from_logits_with_chunking={value} {actor}.entropy_checkpointing={value}"
        conversion = convert.convert(read_launch(f"{MINIMAL} {switches} actor_rollout_ref.model.use_liger=True"))
        assert lost(conversion) == {"actor_rollout_ref.model.use_liger": False}


@pytest.mark.parametrize("value", [True, False])
def test_verls_fused_kernels_convert_to_scoring_at_the_head(value: bool) -> None:
    """use_fused_kernels computes the log-probs and entropy from the hidden states a chunk at a time, as
    training.fusedLogProbs does; its backend option (torch or triton) changes nothing kuberl does."""
    model = "actor_rollout_ref.model"
    launch = f"{MINIMAL} {model}.use_fused_kernels={value} {model}.fused_kernel_options.impl_backend=triton"
    conversion = convert.convert(read_launch(launch))
    assert lost(conversion) == {}
    assert parse_rljob(conversion.manifest).spec.training.fused_log_probs is value
