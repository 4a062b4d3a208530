"""A job that cannot run fails at start — before any Ray actor exists — naming the field or file."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from kuberl.api.contract import ExitCode, RuntimeArgs
from kuberl.runtime.main import run_from_cli
from tests.integration.runtime.jobs import DEMO


def write_job(tmp_path: Path, data_lines: list[str] | None = None, **spec_changes: object) -> Path:
    manifest = yaml.safe_load(DEMO.read_text())
    manifest["spec"]["data"]["train"] = str(DEMO.parent / manifest["spec"]["data"]["train"])
    if data_lines is not None:
        (tmp_path / "prompts.jsonl").write_text("".join(line + "\n" for line in data_lines))
        manifest["spec"]["data"]["train"] = "prompts.jsonl"
    for dotted, value in spec_changes.items():
        node = manifest["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def run_cli(path: Path, tmp_path: Path) -> int:
    return run_from_cli(RuntimeArgs(spec=str(path), output=str(tmp_path / "out")))


def test_missing_data_file_names_the_field_and_path(tmp_path, capsys):
    path = write_job(tmp_path, **{"data.train": "nowhere/prompts.jsonl"})
    assert run_cli(path, tmp_path) == ExitCode.CONFIG_ERROR
    err = capsys.readouterr().err
    assert "spec.data.train" in err and "nowhere/prompts.jsonl" in err


def test_empty_dataset_is_refused(tmp_path, capsys):
    assert run_cli(write_job(tmp_path, data_lines=[]), tmp_path) == ExitCode.CONFIG_ERROR
    assert "prompts.jsonl" in capsys.readouterr().err


def test_prompt_over_the_limit_names_the_record_and_the_limit(tmp_path, capsys):
    lines = [json.dumps({"prompt": "count: 1 2 3"})] * 10 + [json.dumps({"prompt": "count: " + " ".join(["7"] * 80)})]
    assert run_cli(write_job(tmp_path, data_lines=lines), tmp_path) == ExitCode.CONFIG_ERROR
    err = capsys.readouterr().err
    assert "maxPromptLength" in err and "10" in err  # the record's index


def test_unknown_algorithm_is_refused_listing_the_known_ones(tmp_path, capsys):
    path = write_job(tmp_path, **{"algorithm.name": "grpoo"})
    assert run_cli(path, tmp_path) == ExitCode.CONFIG_ERROR
    err = capsys.readouterr().err
    assert "spec.algorithm.name" in err and "'grpo'" in err


def test_missing_model_folder_names_the_field(tmp_path, capsys):
    path = write_job(tmp_path, **{"models.actor.path": str(tmp_path / "no-model")})
    assert run_cli(path, tmp_path) == ExitCode.CONFIG_ERROR
    assert "spec.models.actor.path" in capsys.readouterr().err


def test_batch_that_cannot_be_split_over_the_ranks_is_refused(tmp_path, capsys):
    path = write_job(tmp_path, **{"algorithm.groupSize": 3, "data.batchSize": 3})
    assert run_cli(path, tmp_path) == ExitCode.CONFIG_ERROR
    assert "spec.algorithm.miniBatchSize" in capsys.readouterr().err


def test_a_tensor_parallel_size_the_models_heads_cannot_take_is_refused_naming_the_field(tmp_path, capsys):
    path = write_job(
        tmp_path,
        **{
            "rollout.engine": "vllm",
            "rollout.placement": "separate",
            "rollout.tensorParallelSize": 3,  # tiny://counter has 4 attention heads
            "resources": {"actor": {"replicas": 2, "cpus": 0.5}, "rollout": {"cpus": 3}},
        },
    )
    assert run_cli(path, tmp_path) == ExitCode.CONFIG_ERROR
    assert "spec.rollout.tensorParallelSize 3: the model has 4 attention heads" in capsys.readouterr().err


def test_nothing_is_started_or_written_before_the_checks(tmp_path):
    # A fresh interpreter: the test session's own Ray must not hide a Ray the run started.
    path = write_job(tmp_path, **{"data.train": "nowhere.jsonl"})
    probe = (
        "import sys, ray\n"
        "from kuberl.api.contract import RuntimeArgs\n"
        "from kuberl.runtime.main import run_from_cli\n"
        f"code = run_from_cli(RuntimeArgs(spec={str(path)!r}, output={str(tmp_path / 'out')!r}))\n"
        "print(code, ray.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.split() == [str(int(ExitCode.CONFIG_ERROR)), "False"], done.stderr
    assert "spec.data.train" in done.stderr
    assert not (tmp_path / "out").exists()
