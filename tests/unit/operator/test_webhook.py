"""The admission check: the same validation as `kuberl validate`, with field paths in the message."""

import pytest

from kuberl.operator.settings import OperatorSettings
from kuberl.operator.webhook import admission_message, problems_of, server
from tests.unit.operator.conftest import make_rljob


def test_a_valid_rljob_has_no_problems():
    assert problems_of(make_rljob()) == []


def test_a_cross_field_rule_the_crd_cannot_express_is_reported_with_its_path():
    job = make_rljob()
    job["spec"]["algorithm"] = {"name": "ppo"}
    (problem,) = problems_of(job)
    assert problem.path == "spec.models.critic"


def test_every_problem_is_in_the_message_with_its_path():
    job = make_rljob()
    job["spec"]["resources"] = {"reward": {"replicas": 1, "minReplicas": 3, "maxReplicas": 2}}
    job["spec"]["env"] = [{"name": "HF_TOKEN", "value": "x"}]
    message = admission_message(problems_of(job))
    assert "spec.resources.reward.minReplicas:" in message
    assert "spec.env[0].name:" in message
    assert message.startswith("invalid RLJob (2 problem(s))")


def test_the_status_is_not_the_webhooks_business():
    job = make_rljob(status={"phase": "Exploded"})
    assert problems_of(job) == []


def test_the_webhook_is_served_only_with_a_certificate_from_files():
    with pytest.raises(ValueError, match="KUBERL_WEBHOOK_CERT and KUBERL_WEBHOOK_KEY"):
        server(OperatorSettings(webhook_port=9443))
    served = server(OperatorSettings(webhook_port=9443, webhook_cert="/tls/tls.crt", webhook_key="/tls/tls.key"))
    assert (served.certfile, served.pkeyfile, served.port) == ("/tls/tls.crt", "/tls/tls.key", 9443)
