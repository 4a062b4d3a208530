"""bench/gpu: the GPU suite's parts that need no GPU — the model shapes, the FLOP count, the table, the plan —
and the script itself, which on a machine without CUDA prints every row skipped with the reason."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench" / "gpu"))

import qwen  # noqa: E402
import suite  # noqa: E402
from table import FAILED, MISSED, OK, SKIPPED, Row, format_table, judge  # noqa: E402


@pytest.mark.parametrize(("size", "published"), [("0.5B", 494_032_768), ("1.5B", 1_543_714_304)])
def test_qwen25_shapes_have_the_published_parameter_counts(size: str, published: int) -> None:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen.qwen25_config(size))
    assert qwen.shape(size).parameters == published == sum(p.numel() for p in model.parameters())


def test_update_flops_follow_palms_count() -> None:
    s = qwen.shape("0.5B")
    # per token: 6 x matmul parameters + 12 x layers x hidden x sequence (2 sequences of 1024 tokens)
    expected = 6 * s.matmul_parameters * 2048 + 12 * 24 * 896 * 1024 * 2048
    assert qwen.update_flops(s, 2, 1024) == expected
    # the embedding lookup is no matmul, the tied head is: 0.494B - 24 x 2 norms x 896 - the final norm
    assert s.matmul_parameters == s.parameters - 24 * 2 * 896 - 896


def test_peak_flops_by_device_name() -> None:
    assert qwen.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert qwen.peak_flops("NVIDIA GeForce GTX 1080") is None


def test_rows_are_judged_against_their_aim() -> None:
    assert judge(Row("sync", "0.5B", 1.2, "s", 1.0, "d2d copy", "<= 1.5x")).status == OK
    assert judge(Row("sync", "0.5B", 1.6, "s", 1.0, "d2d copy", "<= 1.5x")).status == MISSED
    assert judge(Row("rollout", "0.5B", 94.0, "%", aim=">= 95%")).status == MISSED
    assert judge(Row("mfu", "1.5B", 41.0, "%", aim=">= 35%")).status == OK
    table = format_table([Row("sync", "0.5B", 1.2, "s", 1.0, "d2d copy", "<= 1.5x")]).splitlines()
    assert table[2] == "| sync | 0.5B | 1.2 s | 1 (d2d copy) | 1.20x | <= 1.5x | ok |  |"


def test_multi_gpu_items_are_skipped_with_the_reason_on_one_gpu() -> None:
    rows = suite.two_rank_rows(REPO, "1.5B", gpus=1)
    assert [r.item for r in rows] == ["fsdp2 nccl, 2 ranks", "colocated vLLM, TP 2", "separate rollout pool"]
    assert all(r.status == SKIPPED and "needs 2 GPUs, 1 visible" in r.note for r in rows)


def test_step_seconds_is_the_median_interval_after_the_first_step() -> None:
    assert suite.step_seconds([{"end": 10.0}, {"end": 12.0}, {"end": 15.0}, {"end": 16.0}]) == 2.0


def test_the_packing_rows_run_again_on_the_larger_model_only_when_there_is_one() -> None:
    def planned(sizes: list[str]) -> list[str]:
        return [size for item, size in suite.planned_items(sizes, 0) if item == "padding-free update"]

    assert planned(["0.5B", "1.5B"]) == ["0.5B", "1.5B"]
    assert planned(["0.5B"]) == ["0.5B"]  # once, not twice on the same model
    assert planned([suite.SMOKE_MODEL]) == [suite.SMOKE_MODEL] * 2  # --smoke runs every function


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the script measures instead")
def test_the_script_without_cuda_prints_the_plan_with_every_row_skipped_and_why() -> None:
    run = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / "run.sh"), "--models", "0.5B,1.5B"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    items = [(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in rows]
    assert items == suite.planned_items(["0.5B", "1.5B"], 0)
    assert all("| skipped | no CUDA device on this machine" in r for r in rows)


NO_VLLM_NOR_RAY = """
import importlib.abc
import sys


class NotInstalled(importlib.abc.MetaPathFinder):
    \"\"\"vLLM and Ray as on the GPU machines this project borrows: not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "ray"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def test_every_trainer_row_runs_without_vllm_or_ray(tmp_path) -> None:
    """`--smoke` runs the suite on a tiny model on the CPU: every trainer row must measure (not fail, not skip)
    with vLLM and Ray missing, as they are on the GPU machines, and every vLLM row is skipped with its reason."""
    (tmp_path / "sitecustomize.py").write_text(NO_VLLM_NOR_RAY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / "run.sh"), "--smoke", "--json", str(tmp_path / "rows.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = {row["item"]: row for row in json.loads((tmp_path / "rows.json").read_text())}
    trainer_items = [item for item, *_ in suite.trainer_items([suite.SMOKE_MODEL])]
    for item, row in rows.items():
        if item in trainer_items or item.startswith(tuple(trainer_items)):
            assert row["status"] not in (FAILED, SKIPPED) or item == "update MFU", (item, row)
    measured = {item for item, row in rows.items() if row["status"] not in (FAILED, SKIPPED)}
    assert {
        "update",
        "update, own mask",
        "LoRA update",
        "padding-free update",
        "critic update",
        "hf engine sync",
    } <= measured
    assert all(rows[item]["status"] == SKIPPED for item in ("sleep/wake", "sync", "rollout"))


def test_only_the_trainer_items_asked_for_are_measured(tmp_path) -> None:
    """--item: a lent GPU's minutes go to the rows in question; every other row is skipped, saying why."""
    asked = "KL in the loss (k3)"
    run = subprocess.run(
        [
            "bash",
            str(REPO / "bench" / "gpu" / "run.sh"),
            "--smoke",
            "--item",
            asked,
            "--json",
            str(tmp_path / "rows.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [row["item"] for row in rows if row["status"] != SKIPPED] == [asked]
    assert all(row["note"] == suite.NOT_ASKED for row in rows if row["item"] != asked)
    unknown = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / "run.sh"), "--dry-run", "--item", "update,compiled"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2 and "--item: unknown ['update,compiled']" in unknown.stderr


def test_a_suite_cut_short_by_its_time_limit_prints_and_saves_the_rows_it_measured(
    tmp_path, monkeypatch, capsys
) -> None:
    """run.sh interrupts the suite at its limit (SIGINT): a lent GPU's call has a limit too, and the rows measured
    before it must come back, marked as cut short, with a failing exit status."""

    def measured_one_then_interrupted(sizes, workdir, repeats, smoke, rows, made, items) -> None:
        rows.append(Row("update", "smoke", 1.0, "s", 1.0, "plain s", "<= 1.0x"))
        made()
        assert json.loads((tmp_path / "rows.json").read_text())[0]["item"] == "update"  # saved as it was made
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "run", measured_one_then_interrupted)
    assert suite.main(["--smoke", "--json", str(tmp_path / "rows.json")]) == 1
    out = capsys.readouterr().out
    assert "| update | smoke | 1 s |" in out and "cut short (interrupted) after 1 rows" in out
    assert [row["item"] for row in json.loads((tmp_path / "rows.json").read_text())] == ["update"]
