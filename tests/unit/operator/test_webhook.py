"""The admission check: the same validation as `kuberl validate`, with field paths in the message."""

import ipaddress

from cryptography import x509

from kuberl.operator.webhook import admission_message, problems_of, self_signed_certificate
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


def test_the_self_signed_certificate_names_the_ip_and_is_its_own_ca():
    pem, key = self_signed_certificate(["127.0.0.1", "0.0.0.0", "webhook.kuberl.svc"])
    certificate = x509.load_pem_x509_certificate(pem)
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["webhook.kuberl.svc"]
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert key.startswith(b"-----BEGIN PRIVATE KEY-----")
