"""`kuberl validate` and `kuberl explain` as a user runs them: files in, messages and exit codes out."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.cli import main
from tests.conftest import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

THREE_MISTAKES = """\
apiVersion: kuberl.io/v1alpha1
kind: RLJob
metadata:
  name: three-mistakes
spec:
  algorithm:
    name: grpo
    groupSize: 1            # mistake 1: GRPO needs groups
  models:
    actor:
      path: /models/actor
      dtype: float8         # mistake 2: no such dtype
  reward:
    function: math_exact
  data:
    train: /data/train.jsonl
  resources:
    reward:
      replicas: 9
      maxReplicas: 4        # mistake 3: replicas above the maximum
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_examples_exist_for_each_documented_scenario():
    names = {path.stem for path in EXAMPLES}
    assert {"tiny-grpo", "grpo-7b-vllm", "ppo-critic", "separate-rollout-elastic-reward"} <= names
    assert {"agent-python-tool", "agent-python-tool-7b"} <= names  # multi-turn with the python tool: CPU, GPU


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_every_example_is_valid(example, capsys):
    assert main(["validate", str(example)]) == 0
    assert "valid" in capsys.readouterr().out


def test_cluster_examples_pass_the_cluster_check_and_local_ones_are_told_what_a_cluster_needs(capsys):
    assert main(["validate", "--cluster", str(REPO / "examples" / "tiny-grpo-cluster.yaml")]) == 0
    assert main(["validate", "--cluster", "--quiet", str(REPO / "examples" / "tiny-grpo.yaml")]) == 1
    errors = capsys.readouterr().err
    assert "spec.checkpoint: on Kubernetes every trainer rank writes its checkpoint shards" in errors
    assert "spec.data.train: data/tiny-task.jsonl is relative" in errors


def test_the_cluster_check_names_a_path_no_pod_that_reads_it_mounts(tmp_path, capsys):
    manifest = yaml.safe_load((REPO / "examples" / "grpo-7b-vllm.yaml").read_text())
    del manifest["spec"]["resources"]["rollout"]["podTemplate"]  # the engines start from /models/... too
    path = write(tmp_path, "job.yaml", yaml.safe_dump(manifest))
    assert main(["validate", str(path)]) == 0  # valid as a job; only a cluster's pods cannot see the model
    assert main(["validate", "--cluster", str(path)]) == 1
    assert (
        "spec.models.actor.path: /models/Qwen2.5-7B-Instruct is read on the rollout pods, which mount no volume "
        "holding it; mount one in spec.resources.rollout.podTemplate"
    ) in capsys.readouterr().err


def test_three_mistakes_give_three_field_messages_and_exit_1(tmp_path, capsys):
    path = write(tmp_path, "bad.yaml", THREE_MISTAKES)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    for field in ("spec.algorithm.groupSize", "spec.models.actor.dtype", "spec.resources.reward.replicas"):
        assert f"- {field}: " in err


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("", "holds no YAML document"),
        ("# only a comment\n", "holds no YAML document"),
        ("spec: [unclosed\n", "not valid YAML: line 2"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("- just\n- a list\n", "expected an RLJob mapping, found a list"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "kind: must be RLJob, found 'ConfigMap'"),
    ],
    ids=["empty", "comment only", "not yaml", "duplicate key", "list", "wrong kind"],
)
def test_unusable_files_are_reported_not_raised(tmp_path, capsys, text, phrase):
    path = write(tmp_path, "job.yaml", text)
    assert main(["validate", str(path)]) == 1
    assert phrase in capsys.readouterr().err


def test_missing_file_and_directory_are_reported(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml"), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "nope.yaml: 1 problem(s)" in err and "no such file" in err
    assert "is a directory" in err


def test_each_document_of_a_multi_document_file_is_checked(tmp_path, capsys):
    good = (REPO / "examples" / "tiny-grpo.yaml").read_text()
    path = write(tmp_path, "two.yaml", good + "\n---\n" + THREE_MISTAKES)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "(document 2): 3 problem(s)" in err
    assert "(document 1)" not in err


def test_console_script_exit_code(tmp_path):
    path = write(tmp_path, "bad.yaml", THREE_MISTAKES)
    kuberl = Path(sys.executable).parent / "kuberl"
    result = subprocess.run([str(kuberl), "validate", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "spec.models.actor.dtype" in result.stderr


def test_explain_prints_type_values_default_and_description(capsys):
    assert main(["explain", "spec.rollout.engine"]) == 0
    out = capsys.readouterr().out
    assert "TYPE:     string" in out
    assert "VALUES:   vllm, hf" in out
    assert "DEFAULT:  vllm" in out
    assert "Hugging Face" in out


def test_explain_an_object_lists_its_fields(capsys):
    assert main(["explain", "spec.resources.actor"]) == 0
    out = capsys.readouterr().out
    for field in ("replicas", "minReplicas", "gpus", "tolerations", "podTemplate"):
        assert f"  {field} " in out


def test_explain_unknown_field_names_the_known_ones(capsys):
    assert main(["explain", "spec.algorithm.grupSize"]) == 1
    err = capsys.readouterr().err
    assert "no such field" in err and "groupSize" in err


# -- the pre-commit check of docs/gitops.md ------------------------------------------------------------
TYPO = """\
apiVersion: kuberl.io/v1alpha1
kind: RLJob
metadata:
  name: typo
spec:
  models: {actor: {path: tiny://demo}}
  data: {train: /data/train.jsonl}
  reward: {function: tiny_task}
  algorithm:
    groupsize: 4            # groupSize: the API server would drop it and the job would run with 8
"""
OTHER_KINDS = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: b}
---
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: training}
spec: {project: default}
"""


def pre_commit_hook() -> dict:
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    return hook


def run_hook(files: list[Path]) -> subprocess.CompletedProcess[str]:
    """What pre-commit does: the hook's entry with the staged files that match its pattern appended."""
    hook = pre_commit_hook()
    matching = [str(path) for path in files if re.search(hook["files"], str(path))]
    command = shlex.split(hook["entry"])
    assert command[0] == "kuberl"
    return subprocess.run(
        [sys.executable, "-m", "kuberl", *command[1:], *matching],
        capture_output=True,
        text=True,
        cwd=REPO.parent,
    )


def test_the_pre_commit_hook_refuses_a_typo_the_api_server_would_drop(tmp_path: Path):
    done = run_hook([write(tmp_path, "typo.yaml", TYPO), write(tmp_path, "other.yaml", OTHER_KINDS)])
    assert done.returncode == 1
    assert "spec.algorithm.groupsize: unknown field (did you mean groupSize?)" in done.stderr
    assert "other.yaml" not in done.stderr and done.stdout == ""  # quiet; other kinds are skipped


def test_the_pre_commit_hook_passes_a_repository_of_valid_jobs_and_other_manifests(tmp_path: Path):
    mixed = OTHER_KINDS + "---\n" + (REPO / "examples" / "ppo-critic.yaml").read_text()
    files = [write(tmp_path, "other.yaml", OTHER_KINDS), write(tmp_path, "jobs.yml", mixed)]
    files.append(write(tmp_path, "README.md", "not YAML, not matched"))
    done = run_hook(files)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_gitops_guide_documents_the_hook_as_it_is_shipped():
    guide = (REPO / "docs" / "gitops.md").read_text()
    assert f"id: {pre_commit_hook()['id']}" in guide
    assert "kuberl validate --quiet --only-rljobs" in guide and pre_commit_hook()["entry"] in guide


def test_explain_documents_every_field_of_the_environment(capsys):
    assert main(["explain", "spec.environment"]) == 0
    overview = capsys.readouterr().out
    assert "only the model's tokens train" in overview and "<python>code</python>" in overview
    for field in ("name", "maxTurns", "maxTokensPerTurn", "maxEpisodeTokens", "toolTimeoutSeconds", "toolMemoryMib"):
        assert main(["explain", f"spec.environment.{field}"]) == 0
        text = capsys.readouterr().out
        description = text.split("DESCRIPTION:")[1].strip()
        assert len(description) > 40, f"spec.environment.{field} is not documented: {text}"
