"""The admission check: the same validation as `kuberl validate`, with field paths in the message, and what a
cluster needs besides (operator/cluster_checks.py): refused without shared checkpoint storage, warned about
paths the pods that read them do not mount."""

import copy
from typing import Any

import pytest

from kuberl.operator.settings import OperatorSettings
from kuberl.operator.webhook import admission_message, review, server
from tests.unit.operator.conftest import KUBERAY, base_spec, make_rljob


def on_a_claim(**changes: Any) -> dict[str, Any]:
    """base_spec (an hf:// actor, prompts at /data/train.jsonl) with its checkpoints on a claim."""
    return base_spec() | {"checkpoint": {"pvcClaimName": "ckpt"}} | changes


def test_a_valid_rljob_checkpointing_to_a_claim_is_admitted():
    answer = review(make_rljob(on_a_claim(data={"train": "s3://bucket/train.jsonl"})))
    assert (answer.problems, answer.warnings) == ([], [])


def test_a_cross_field_rule_the_crd_cannot_express_is_reported_with_its_path():
    job = make_rljob(on_a_claim(algorithm={"name": "ppo"}))
    (problem,) = review(job).problems
    assert problem.path == "spec.models.critic"


def test_every_problem_is_in_the_message_with_its_path():
    job = make_rljob(
        on_a_claim(
            resources={"reward": {"replicas": 1, "minReplicas": 3, "maxReplicas": 2}},
            env=[{"name": "HF_TOKEN", "value": "x"}],
        )
    )
    message = admission_message(review(job).problems)
    assert "spec.resources.reward.minReplicas:" in message
    assert "spec.env[0].name:" in message
    assert message.startswith("invalid RLJob (2 problem(s))")


def test_a_field_beside_the_spec_is_refused_not_ignored():
    """The CRD keeps unknown fields (api/crd.py); a section indented one level too little lands beside the spec."""
    job = make_rljob(on_a_claim()) | {"runPolicy": {"suspend": True}}
    (problem,) = review(job).problems
    assert (problem.path, problem.message.split(";")[0]) == ("runPolicy", "unknown field")


def test_a_job_whose_checkpoints_would_stay_on_the_heads_disk_is_refused():
    (problem,) = review(make_rljob(base_spec())).problems  # no pvcClaimName, no object-store uri
    assert problem.path == "spec.checkpoint"
    assert "head's ephemeral disk" in problem.message


def test_an_update_of_a_job_admitted_before_the_storage_rule_is_admitted_with_a_warning():
    """Ratcheting: a stored job without storage can still be suspended; a new problem is still refused."""
    old = make_rljob(base_spec())  # no storage: stored before the webhook required it
    suspended = copy.deepcopy(old)
    suspended["spec"]["runPolicy"] = {"suspend": True}
    answer = review(suspended, old)
    assert answer.problems == []
    assert any("spec.checkpoint" in warning and "admitted before" in warning for warning in answer.warnings)
    broken = copy.deepcopy(suspended)
    broken["spec"]["checkpoint"] = {"pvcClaimName": "ckpt", "uri": "/somewhere/else"}  # outside the claim: new
    assert [problem.path for problem in review(broken, old).problems] == ["spec.checkpoint.uri"]
    assert review(suspended).problems  # as a new job it is still refused


def test_a_path_no_pod_that_reads_it_mounts_is_admitted_with_a_warning_naming_it():
    answer = review(make_rljob(on_a_claim()))  # /data/train.jsonl: the head mounts no /data
    assert answer.problems == []
    (warning,) = answer.warnings
    assert warning.startswith("spec.data.train: /data/train.jsonl is read on the head pods")


def test_the_status_is_not_the_webhooks_business():
    job = make_rljob(on_a_claim(), status={"phase": "Exploded"})
    assert review(job).problems == []


def test_the_webhook_is_served_only_with_a_certificate_from_files():
    with pytest.raises(ValueError, match="KUBERL_WEBHOOK_CERT and KUBERL_WEBHOOK_KEY"):
        server(OperatorSettings(webhook_port=9443, kuberay=KUBERAY))
    served = server(
        OperatorSettings(webhook_port=9443, webhook_cert="/tls/tls.crt", webhook_key="/tls/tls.key", kuberay=KUBERAY)
    )
    assert (served.certfile, served.pkeyfile, served.port) == ("/tls/tls.crt", "/tls/tls.key", 9443)
