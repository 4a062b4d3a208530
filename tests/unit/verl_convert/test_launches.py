"""The launch scripts in launches/, each written in the shape of verl's examples (the bash they use, FSDP and Megatron
launches, multi-turn configs), convert to exactly the manifest in their .expected.yaml and report exactly the knobs
listed there (with their values), or are refused with the lines listed there; and real bash passes the verl command
the words the converter read."""

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.verl.command import LaunchError, read_launch, trainer_arguments
from kuberl.verl.convert import convert
from kuberl.verl.shell.run import follow
from tests.unit.verl_convert import real_bash

LAUNCHES = Path(__file__).parent / "launches"
EXPECTED = sorted(LAUNCHES.glob("*.expected.yaml"))


def launch_of(expected: Path) -> Path:
    name = expected.name.removesuffix(".expected.yaml")
    return next(path for path in LAUNCHES.iterdir() if path.stem == name and path.suffix in (".sh", ".txt"))


def expectation(expected: Path) -> dict[str, Any]:
    return yaml.safe_load(expected.read_text(encoding="utf-8"))


def test_every_launch_has_its_expectation() -> None:
    launches = {path.name for path in LAUNCHES.iterdir() if path.suffix in (".sh", ".txt")}
    assert launches == {launch_of(expected).name for expected in EXPECTED}


@pytest.mark.parametrize("expected", EXPECTED, ids=lambda path: path.name.removesuffix(".expected.yaml"))
def test_a_launch_converts_to_its_manifest_and_reports_its_lost_knobs(expected: Path) -> None:
    wanted = expectation(expected)
    text = launch_of(expected).read_text(encoding="utf-8")
    if "refused" in wanted:
        with pytest.raises(LaunchError) as refused:
            convert(read_launch(text, wanted["env"]))
        for line in wanted["refused"]:
            assert line in str(refused.value)
        return
    conversion = convert(read_launch(text, wanted["env"]))
    lost = {knob.key: {"value": knob.value, "changesTraining": knob.changes_training} for knob in conversion.lost}
    assert lost == wanted["lost"]
    assert conversion.manifest == wanted["manifest"]
    parse_rljob(conversion.manifest)  # and kuberl takes it


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
@pytest.mark.parametrize("expected", EXPECTED, ids=lambda path: path.name.removesuffix(".expected.yaml"))
def test_real_bash_passes_the_verl_command_the_words_the_converter_read(expected: Path, tmp_path: Path) -> None:
    wanted = expectation(expected)
    text = launch_of(expected).read_text(encoding="utf-8")
    environment = wanted["env"] | {"PWD": str(tmp_path)}
    by_bash = real_bash.bash_arguments(text, tmp_path, environment)
    if "refused" in wanted:  # what the converter cannot know, bash (set -u) does not know either
        assert by_bash == []
        return
    fields = list(follow(text, environment, trainer_arguments).fields)
    assert fields[fields.index("-m") :] == by_bash
