"""Deterministic names: what a crash-safe operator derives from what it stored."""

import pytest

from kuberl.operator.names import configmap_name, next_rayjob_name, rayjob_index, rayjob_name


def test_rayjob_names_count_from_zero():
    assert rayjob_name("tiny-grpo", 0) == "tiny-grpo-0"
    assert next_rayjob_name("tiny-grpo", None) == "tiny-grpo-0"
    assert next_rayjob_name("tiny-grpo", "tiny-grpo-0") == "tiny-grpo-1"
    assert next_rayjob_name("tiny-grpo", "tiny-grpo-9") == "tiny-grpo-10"


@pytest.mark.parametrize(
    ("rayjob", "index"),
    [("tiny-grpo-3", 3), ("tiny-grpo-x", None), ("other-3", None), (None, None), ("tiny-grpo-", None)],
)
def test_the_index_is_read_back_only_from_this_jobs_names(rayjob: str | None, index: int | None):
    assert rayjob_index("tiny-grpo", rayjob) == index


def test_a_job_whose_name_ends_in_a_number_still_counts_its_own_rayjobs():
    assert rayjob_index("run-7", "run-7-2") == 2


def test_the_configmap_is_named_after_the_job():
    assert configmap_name("tiny-grpo") == "tiny-grpo-spec"
