"""Operator settings from flags and environment variables."""

import pytest

from kuberl import __version__
from kuberl.operator.access import KubeRayPeer
from kuberl.operator.settings import OperatorSettings
from tests.unit.operator.conftest import REQUIRED_ENV


def test_the_default_runtime_image_carries_the_kuberl_version():
    assert OperatorSettings.from_env(REQUIRED_ENV).runtime_image == f"ghcr.io/kuberl/runtime:{__version__}"


def test_environment_variables_override_the_defaults():
    settings = OperatorSettings.from_env(
        {
            "KUBERL_RUNTIME_IMAGE": "my/runtime:2",
            "KUBERL_RESYNC_SECONDS": "2.5",
            "KUBERL_WEBHOOK_CERT": "/tls/tls.crt",
            "KUBERL_KUBERAY_NAMESPACE": "ray-system",
            "KUBERL_KUBERAY_OPERATOR_LABELS": "app=kuberay, tier=control",
        },
        namespaces=["a", "b"],
        metrics_port=9100,
    )
    assert settings.runtime_image == "my/runtime:2"
    assert settings.resync_seconds == 2.5
    assert settings.namespaces == ("a", "b")
    assert settings.metrics_port == 9100
    assert settings.webhook_cert == "/tls/tls.crt"
    assert settings.kuberay == KubeRayPeer(labels={"app": "kuberay", "tier": "control"}, namespace="ray-system")
    assert OperatorSettings.from_env(REQUIRED_ENV).kuberay == KubeRayPeer(namespace="kuberay-system")


def test_the_operator_does_not_start_without_kuberays_namespace():
    """Without it each job's NetworkPolicy admitted pods with KubeRay's labels from any namespace to the Ray
    dashboard, which anyone who may create a pod anywhere can give a pod."""
    with pytest.raises(ValueError, match="KUBERL_KUBERAY_NAMESPACE is not set: give the namespace KubeRay"):
        OperatorSettings.from_env({})


def test_a_label_list_that_is_not_key_value_pairs_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="KUBERL_KUBERAY_OPERATOR_LABELS: 'kuberay' is not key=value"):
        OperatorSettings.from_env({**REQUIRED_ENV, "KUBERL_KUBERAY_OPERATOR_LABELS": "kuberay"})
