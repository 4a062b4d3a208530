"""The converter reads launch scripts as bash does, without running them: each form verl's examples use, held to
what real bash gives for the same script (bash runs it here with `python3` defined as a function that prints its
arguments, in an empty folder); what it cannot know is refused with its line; and it stays bounded on scripts
written to make it hang or crash."""

import doctest
import re
import shutil
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.verl.command import LaunchError, read_launch, trainer_arguments
from kuberl.verl.shell import arithmetic, conditions, expand, parse, run, words
from kuberl.verl.shell.run import UnknownWord, follow
from tests.unit.verl_convert import real_bash

ENV = {"HOME": "/home/me", "PWD": "/work"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")


def bash_arguments(script: str, tmp_path) -> list[str]:
    return real_bash.bash_arguments(script, tmp_path, ENV)


def converter_arguments(script: str, tmp_path=None) -> list[str | UnknownWord]:
    fields = list(follow(script, ENV | ({"PWD": str(tmp_path)} if tmp_path else {}), trainer_arguments).fields)
    return fields[fields.index("-m") :]


def test_docstring_examples_are_true() -> None:
    for module in (words, parse, expand, arithmetic, conditions, run):
        assert doctest.testmod(module).failed == 0, module.__name__


# ------------------------------------------------------------------------- the forms verl's examples use

FORMS = {
    # run_qwen2-7b_math_trtllm.sh and 11 more: the script's first argument, else a default
    "a default for the first argument": 'ENGINE=${1:-vllm}\npython3 -m verl.trainer.main_ppo rollout.name="$ENGINE"',
    # run_qwen2-7b_math_megatron_lora.sh and 4 more: overrides grouped in arrays, comments inside
    "arrays of overrides": (
        "DATA=(\n    data.train_files=\"['/d/a.parquet', '/d/b.parquet']\"  # two files\n    data.shuffle=False\n)\n"
        "MODEL=(\n    actor_rollout_ref.model.path=Qwen/Qwen2-7B\n)\nMODEL+=(x.y='a b')\n"
        'python3 -m verl.trainer.main_ppo \\\n    "${DATA[@]}" \\\n    "${MODEL[@]}" \\\n    "$@"'
    ),
    # run_qwen2-7b_math_trtllm.sh: the rest of the script's arguments
    "the arguments after the first": 'TP=${1:-4}\npython3 -m verl.trainer.main_ppo tp=$TP "${@:2}"',
    # run_qwen30b_sapo.sh, run_qwen30b_gspo.sh: a multi-line quoted value, split where it is used unquoted
    "a multi-line quoted value": (
        'USP=4\nACTOR="\n    a.param_offload=True \\\n    a.ulysses=$USP\n    a.loss_mode=sapo"\n'
        'CRITIC="${ACTOR//a./critic.}"\npython3 -m verl.trainer.main_ppo $ACTOR $CRITIC'
    ),
    # run_with_rollout_corr_multi_rs.sh: quotes escaped so that Hydra sees them
    "escaped quotes": 'rs="token_k1,seq_max_k2"\npython3 -m verl.trainer.main_ppo rollout_rs=\\\'${rs}\\\' b=\\"x\\"',
    "defaults, arithmetic and tests": (
        'N=${N:-2}\nexport BSZ=$((N * 128 / 3))\nif [ "$N" -ge 2 ]; then TP=2; else TP=1; fi\n'
        "[[ $TP == 2 ]] && MODE=async || MODE=sync\n"
        'PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo bsz=$BSZ tp=$TP mode=$MODE 2>&1 | tee "log-$N.txt"'
    ),
    "a launcher before the command and a function": (
        'now() { date; }\nhere="$(pwd)"\nray job submit --address "$ADDR" -- python3 -m verl.trainer.main_ppo '
        "dir=$here home=~/data"
    ),
}


@pytest.mark.parametrize("name", FORMS)
def test_each_bash_form_reads_as_bash_runs_it(name: str, tmp_path) -> None:
    script = FORMS[name]
    assert converter_arguments(script, tmp_path) == bash_arguments(script, tmp_path)


def test_each_bash_form_gives_the_overrides_hydra_reads() -> None:
    assert read_launch(FORMS["a default for the first argument"]) == {"rollout.name": "vllm"}
    assert read_launch(FORMS["arrays of overrides"]) == {
        "data.train_files": ["/d/a.parquet", "/d/b.parquet"],
        "data.shuffle": False,
        "actor_rollout_ref.model.path": "Qwen/Qwen2-7B",
        "x.y": "a b",
    }
    assert read_launch(FORMS["the arguments after the first"]) == {"tp": 4}
    assert read_launch(FORMS["a multi-line quoted value"]) == {
        "a.param_offload": True,
        "a.ulysses": 4,
        "a.loss_mode": "sapo",
        "critic.param_offload": True,
        "critic.ulysses": 4,
        "critic.loss_mode": "sapo",
    }
    assert read_launch(FORMS["escaped quotes"]) == {"rollout_rs": "token_k1,seq_max_k2", "b": "x"}
    assert read_launch(FORMS["defaults, arithmetic and tests"]) == {"bsz": 85, "tp": 2, "mode": "async"}


# ------------------------------------------------------------------------------ what it cannot know

UNKNOWN = {
    # run_qwen30b_gspo.sh: HDFS_ROOT=${HDFS_ROOT:-$PWD}, read through actor_model_path (run without $PWD)
    "a default that reads an unset variable": (
        "HDFS_ROOT=${HDFS_ROOT:-$PWD}\n\nactor_model_path=$HDFS_ROOT/model/Qwen3-30B-A3B-Base\n"
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$actor_model_path",
        "$PWD is set neither in the script nor in the environment (line 1, then HDFS_ROOT (line 1), "
        "then actor_model_path (line 3))",
    ),
    # test_gspo_qwen30b_a3b_ep.sh: TRAIN_FILE=$DATA_ROOT/...
    "an unset variable through an assignment": (
        "TRAIN_FILE=$DATA_ROOT/dataset/dapo-math-17k.parquet\n"
        'python3 -m verl.trainer.main_ppo data.train_files="$TRAIN_FILE"',
        "$DATA_ROOT is set neither in the script nor in the environment (line 1, then TRAIN_FILE (line 1))",
    ),
    # run_qwen3moe-30b_megatron_96gb.sh: a list around a path nothing sets
    "an unset variable inside a quoted list": (
        'TEST_FILE="[\'$aime24_test_path\']"\npython3 -m verl.trainer.main_ppo data.val_files="${TEST_FILE}"',
        "$aime24_test_path is set neither in the script nor in the environment (line 1, then TEST_FILE (line 1))",
    ),
    "a command's output": (
        "NOW=$(date +%Y%m%d)\npython3 -m verl.trainer.main_ppo trainer.experiment_name=run-$NOW",
        "$(date +%Y%m%d) is a command, which the converter does not run (line 1, then NOW (line 1))",
    ),
    "the script's argument with no default": (
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=$1",
        "$1 is the script's argument 1; the converter reads the script as run with none (line 1)",
    ),
    "a value set under a test it cannot decide": (
        "if [ -f /etc/cluster ]; then NODES=4; else NODES=1; fi\n"
        'python3 -m verl.trainer.main_ppo trainer.nnodes="$NODES"',
        "$NODES depends on the condition on line 1, which the converter cannot decide (line 1)",
    ),
    "a value a loop sets": (
        "for n in 1 2; do LAST=$n; done\npython3 -m verl.trainer.main_ppo x=$LAST",
        "$LAST depends on the loop on line 1, which the converter cannot decide (line 1)",
    ),
    "an overflowing product": (
        "python3 -m verl.trainer.main_ppo data.train_batch_size=$((9**9**9))",
        "$((9**9**9)) overflows bash's 64-bit integers, which bash wraps around without a word (line 1)",
    ),
}


@pytest.mark.parametrize("name", UNKNOWN)
def test_a_value_it_cannot_know_is_refused_with_its_line_and_path(name: str) -> None:
    script, why = UNKNOWN[name]
    with pytest.raises(LaunchError) as refused:
        read_launch(script, {"HOME": "/home/me"})
    message = str(refused.value)
    assert why in message, message
    assert "the verl command reads values the converter cannot know" in message
    assert "--env NAME=VALUE" in message


def test_the_environment_gives_what_the_script_does_not_set() -> None:
    script, _ = UNKNOWN["a default that reads an unset variable"]
    overrides = read_launch(script, {"PWD": "/ckpt"})
    assert overrides == {"actor_rollout_ref.model.path": "/ckpt/model/Qwen3-30B-A3B-Base"}


def test_an_unknown_value_in_an_option_or_a_launcher_is_not_read() -> None:
    script = (
        'PROJECT_DIR="$(realpath .)"\nsrun --nodes=$SLURM_NNODES python3 -m verl.trainer.main_ppo '
        '--config-path="$PROJECT_DIR/config" --config-name=ppo_trainer a=1'
    )
    assert read_launch(script) == {"--config-name": "ppo_trainer", "a": 1}


def test_the_command_under_a_test_it_cannot_decide_is_refused() -> None:
    script = 'if [ -n "$SLURM_JOB_ID" ]; then\n  python3 -m verl.trainer.main_ppo a=1\nfi\n'
    with pytest.raises(LaunchError, match=r"line 2: the command runs only if the condition on line 1"):
        read_launch(script)
    assert read_launch(script, {"SLURM_JOB_ID": "7"}) == {"a": 1}


def test_a_branch_that_exits_is_left_out_and_an_exit_before_the_command_is_reported() -> None:
    guarded = 'if [ ! -f "$CKPT" ]; then echo "no checkpoint"; exit 1; fi\nA=2\npython3 -m verl.trainer.main_ppo a=$A'
    assert read_launch(guarded) == {"a": 2}
    with pytest.raises(LaunchError, match=r"no verl trainer command found \(line 1: the script exits here\)"):
        read_launch("exit 0\npython3 -m verl.trainer.main_ppo a=1")


def test_a_script_bash_would_refuse_is_refused_with_its_line() -> None:
    for script, message in (
        ('A="never closed\npython3 -m verl.trainer.main_ppo a=1', 'line 1: a " that is never closed'),
        ("python3 -m verl.trainer.main_ppo a=${X:?set X first}", "line 1: X: set X first (bash stops the script here)"),
        ("A=$((1 / 0))\npython3 -m verl.trainer.main_ppo a=1", "line 1: 1 / 0: division by 0"),
        ("if true; then\npython3 -m verl.trainer.main_ppo a=1", "line 2: syntax error: the script ends"),
    ):
        with pytest.raises(LaunchError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_launch(script)


# ------------------------------------------------------------------------------------------- bounded

BOUNDED = {
    # issue #36 item 12: these hung and ended in a RecursionError
    "a power tower": ("A=$((9**9**9))\npython3 -m verl.trainer.main_ppo a=$A", "line 2: the verl command reads"),
    "a name that refers to itself": (
        "B=B; N=$((B + 1))\npython3 -m verl.trainer.main_ppo n=$N",
        "line 1: B: expression recursion level exceeded",
    ),
    "names that refer to each other": (
        "A=B; B=A; N=$((A))\npython3 -m verl.trainer.main_ppo n=$N",
        "line 1: A: expression recursion level exceeded",
    ),
    "an exponential chain of names": (
        "\n".join(f"V{i}='V{i + 1} + V{i + 1}'" for i in range(25)) + "\nV25=1\nN=$((V0))",
        "line 27: V0: more than 10000 operations",
    ),
    "deep parentheses": ("N=$((" + "(" * 5000 + "1" + ")" * 5000 + "))", "line 1: "),
    "a long sum": ("N=$((" + "+".join(["1"] * 20000) + "))", "an expression longer than the converter reads"),
    "nested defaults": ("A=" + "${A:-" * 3000 + "x" + "}" * 3000, "line 1: expansions nest deeper than 32"),
    "a doubling value": ("A=x\n" + "A=$A$A\n" * 40, "line 21: a value longer than 1000000 characters"),
    "a function that calls itself": ("f() { f; }\nf", "line 1: f: functions call each other more than 32 deep"),
    "nested tests": ("if true; then\n" * 500 + "A=1\n" + "fi\n" * 500, "line 64: commands nest deeper than 64"),
    "a doubling array": ("A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 30, "line 15: A: an array of more than 10000"),
    "calls of nested bodies": (
        "".join(f"f{i}() {{ {'{ ' * 60}f{i + 1}; {'} ' * 60}}}\n" for i in range(31)) + "f31() { :; }\nf0",
        "nest deeper than the converter reads",
    ),
    "a fan of calls": (
        "".join(f"f{i}() {{ f{i + 1}; f{i + 1}; f{i + 1}; f{i + 1}; }}\n" for i in range(12)) + "f12() { :; }\nf0",
        "commands before the one wanted",
    ),
}


@pytest.mark.parametrize("name", BOUNDED)
def test_scripts_made_to_exhaust_it_end_quickly_with_the_line(name: str) -> None:
    script, message = BOUNDED[name]
    started = time.monotonic()
    with pytest.raises(LaunchError) as refused:
        read_launch(script + "\npython3 -m verl.trainer.main_ppo a=1")
    assert message in str(refused.value), str(refused.value)
    assert time.monotonic() - started < 20  # seconds, on a busy machine: stopped, not hung


def test_bash_arithmetic_is_bashs_not_pythons(tmp_path) -> None:
    expression = "-7 / 2, -7 % 2, -2**2, 2**3**2, 010 + 0x10 + 2#11, 1 ? 5 : 6, 3 << 2, !0, ~5, 7 > 3 && 0 || 4"
    script = "python3 -m verl.trainer.main_ppo " + " ".join(
        f"x=$(({part}))" for part in expression.split(", ")
    )  # fmt: skip
    assert converter_arguments(script) == bash_arguments(script, tmp_path)
    assert converter_arguments(script)[2:4] == ["x=-3", "x=-1"]  # C's division: toward zero


# ------------------------------------------------------------------------------------ held to real bash

_NAMES = ["A", "B", "C"]
_PIECES = [
    "x", "1", "/p", ",", ":", "=", "-", "'a b'", "' q '", '"c  d"', '"$A"', "$B/", "${C}", "${A:-d}", "${Z:-e f}",
    '${Z:-"g  h"}', "${Z-}", '"${Z:-}"', "${A:+alt}", "${B:+'p q'}", "$((N + 2))", "$((N * 3 / 2))", "${#A}",
    "${A// /_}", "${A%% *}", "${A#* }", "${B^^}", "${C:1:2}", "'$A'", "\\$A", '\\"', "\\'", '"\\$x"', "$'t\\tu'",
    '"${ARR[@]}"', "${ARR[*]}", '"${ARR[*]}"', "${ARR[1]}", "${#ARR[@]}", '"$@"', "~/h", "${N}0",
]  # fmt: skip
_word = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4).map("".join)
_value = _word.filter(lambda text: "$@" not in text and "ARR" not in text)


def _value_reading_none_of(names: str) -> st.SearchStrategy[str]:
    """A value that reads none of `names` (each is set after it, or is the one it sets)."""
    return _value.filter(lambda text: not re.search(rf"\$\{{?#?[{names}]", text))


@settings(max_examples=150, deadline=None)
@given(
    values=st.tuples(_value_reading_none_of("ABC"), _value_reading_none_of("BC"), _value_reading_none_of("C")),
    elements=st.lists(_value, max_size=3),
    arguments=st.lists(_word, min_size=1, max_size=6),
    test=st.sampled_from(["", '[ "$A" = x ]', '[[ -n $B && $C != "1" ]]', "(( N > 2 ))", '[ "${#A}" -lt 3 ]']),
)
def test_fuzzed_scripts_read_as_bash_runs_them(values, elements, arguments, test, tmp_path_factory) -> None:
    script = "N=3\n" + "".join(f"{name}={value}\n" for name, value in zip(_NAMES, values, strict=True))
    script += f"ARR=({' '.join(elements)})\n"
    if test:
        script += f"if {test}; then B={values[0]}; else B=y; fi\n"
    script += "python3 -m verl.trainer.main_ppo " + " ".join(arguments)
    folder = tmp_path_factory.mktemp("bash")
    assert converter_arguments(script, folder) == bash_arguments(script, folder)
