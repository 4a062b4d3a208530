"""A reward named by file or module, in kuberl's or verl's signature; start-up checks; the reward model's device."""

import textwrap
from pathlib import Path

import pytest
import torch

from kuberl.api import RewardSpec
from kuberl.runtime.data import Prompt, PromptDataset
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.rewards import functions
from kuberl.runtime.rewards.checks import check_reward_inputs, resolved_reward_file
from kuberl.runtime.rewards.functions import RewardConfigError, load_reward_function, score_batch
from kuberl.runtime.workers import group, reward_worker

VERL_RECORD = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "2 + 5?"}],
    "reward_model": {"style": "rule", "ground_truth": "7"},
    "extra_info": {"split": "train", "index": 3},
}


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_a_verl_reward_file_is_called_as_verl_calls_it(tmp_path: Path) -> None:
    # verl's custom_reward_function.path with its default name compute_score, returning verl's dict form
    path = write(
        tmp_path,
        "my_reward.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            correct = solution_str.strip().endswith(ground_truth)
            return {"score": 2.0 if correct else -1.0, "acc": correct, "pred": solution_str[-3:],
                    "index": extra_info["index"], "source_ok": data_source == "openai/gsm8k"}
        """,
    )
    reward = load_reward_function(str(path))
    right, wrong = score_batch(reward, ["so 7", "so 8"], [VERL_RECORD, VERL_RECORD])
    # the numbers of the dict become metrics; the predicted answer string is no number and is left out
    assert (right.score, right.metrics) == (2.0, {"acc": 1.0, "index": 3.0, "source_ok": 1.0})
    assert (wrong.score, wrong.error) == (-1.0, None)


def test_a_file_reward_in_kuberls_signature_with_a_named_function(tmp_path: Path) -> None:
    path = write(tmp_path, "rewards.py", "def length(completion, sample):\n    return len(completion), {'n': 1}\n")
    assert score_batch(load_reward_function(f"{path}:length"), ["abcd"], [{}])[0].score == 4.0


def test_a_verl_function_with_kwargs_gets_all_four_arguments(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "kw.py",
        "def compute_score(solution_str, **kwargs):\n    return float(sorted(kwargs) == "
        "['data_source', 'extra_info', 'ground_truth'])\n",
    )
    assert score_batch(load_reward_function(str(path)), ["x"], [VERL_RECORD])[0].score == 1.0


@pytest.mark.parametrize(
    ("source", "ref_suffix", "message"),
    [
        (None, "", "reward file .*missing.py does not exist"),
        ("def other(c, s):\n    return 1.0\n", "", "has no attribute 'compute_score'"),
        ("raise RuntimeError('boom')\n", "", "failed to load \\(RuntimeError: boom\\)"),
    ],
)
def test_a_bad_reward_file_fails_at_load_naming_the_field(
    tmp_path: Path, source: str | None, ref_suffix: str, message: str
) -> None:
    path = tmp_path / "missing.py" if source is None else write(tmp_path, "bad.py", source)
    with pytest.raises(RewardConfigError, match=r"^spec\.reward\.function: .*" + message):
        load_reward_function(str(path) + ref_suffix)


def test_a_relative_reward_file_is_read_from_the_manifests_folder(tmp_path: Path) -> None:
    write(tmp_path, "score.py", "def compute_score(data_source, solution_str, ground_truth, extra_info):\n  return 1\n")
    resolved = resolved_reward_file(RewardSpec(function="score.py"), tmp_path)
    assert resolved.function == f"{tmp_path / 'score.py'}:compute_score"
    with pytest.raises(RewardConfigError, match="reward file .*nothere.py does not exist"):
        resolved_reward_file(RewardSpec(function="nothere.py:f"), tmp_path)
    assert resolved_reward_file(RewardSpec(function="math_exact"), tmp_path).function == "math_exact"


def test_the_schema_takes_file_references_and_refuses_unknown_builtins() -> None:
    assert RewardSpec(function="rewards/gsm8k.py").function == "rewards/gsm8k.py"
    assert RewardSpec(function="/opt/r.py:score").function == "/opt/r.py:score"
    with pytest.raises(ValueError, match="unknown built-in reward 'gsm8k'"):
        RewardSpec(function="gsm8k")


def dataset(*records: dict) -> PromptDataset:
    return PromptDataset([Prompt(i, [1], "p", record) for i, record in enumerate(records)])


def test_a_builtin_that_compares_answers_refuses_records_without_one_at_start() -> None:
    # before: every sample of such a file failed one by one and the job trained on nothing
    records = dataset({"prompt": "a", "answer": "1"}, {"prompt": "b", "solution": "2"}, {"prompt": "c"})
    with pytest.raises(RewardConfigError, match=r"2 records of data.train have none .*records 1, 2.*prompt, solution"):
        check_reward_inputs(RewardSpec(function="math_exact"), {"data.train": records})
    check_reward_inputs(RewardSpec(function="format_answer_tag"), {"data.train": records})  # needs no answer


def test_by_data_source_refuses_sources_it_has_no_scorer_for_at_start() -> None:
    records = dataset(VERL_RECORD, {**VERL_RECORD, "data_source": "codecontests"}, {**VERL_RECORD, "data_source": None})
    with pytest.raises(
        RewardConfigError, match=r"'codecontests' \(1 records\), None \(1 records\); known: openai/gsm8k"
    ):
        check_reward_inputs(RewardSpec(function="by_data_source"), {"data.validation": records})
    check_reward_inputs(RewardSpec(function="by_data_source"), {"data.train": dataset(VERL_RECORD), "x": None})


# ----------------------------------------------------------------------------- the reward model's device


def test_worker_device_is_the_gpu_ray_gave_the_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert group.worker_device() == torch.device("cuda", 0)  # Ray renumbers the visible GPU to 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert group.worker_device() == torch.device("cpu")  # an actor that asked for no GPU sees none


@pytest.mark.parametrize("device", [torch.device("cuda", 0), torch.device("cpu")])
def test_the_reward_model_loads_on_the_device_of_its_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device
) -> None:
    # before: RewardModelScorer was always built on the CPU, even in a pool with resources.reward.gpus
    built = {}

    class RecordingScorer:  # fake: records where the worker asks for the model; no model is loaded
        def __init__(self, path, dtype, batch_size, device="cpu"):
            built.update(path=path, dtype=dtype, device=device)

    monkeypatch.setattr("kuberl.runtime.rewards.model.RewardModelScorer", RecordingScorer)
    monkeypatch.setattr(group, "worker_device", lambda: device)  # imported by the worker when it loads a model
    worker = reward_worker.RewardWorker()
    (tmp_path / "config.json").write_text("{}")  # a model folder as far as resolving goes; nothing loads it
    spec = RewardSpec.model_validate({"model": {"path": str(tmp_path), "dtype": "bfloat16"}})
    worker.setup(spec.to_manifest(), ModelLocation(str(tmp_path), "spec.reward.model.path"))  # resolved in place
    assert built == {"path": tmp_path, "dtype": "bfloat16", "device": str(device)}


def test_the_loader_module_keeps_its_default_function_name() -> None:
    assert functions.DEFAULT_FILE_FUNCTION == "compute_score"  # verl's custom_reward_function.name default
