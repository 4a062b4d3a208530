"""charts/kuberl rendered by Helm's engine: secure pods, least-privilege RBAC, wiring the operator understands.

Needs helm-python-sdk (the `dev` extra); skipped without it.
"""

import base64
import datetime
from typing import Any

import pytest
import yaml
from cryptography import x509

from kuberl.cli import build_parser
from kuberl.operator.access import KubeRayPeer
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.webhook import WEBHOOK_ID
from tests.unit.chart.rendering import (
    CHART,
    RELEASE_NAMESPACE,
    container_env,
    crd_files,
    of_kind,
    one,
    operator_container,
    rbac_rules,
    render,
)

helm_python = pytest.importorskip("helm_python")

CLUSTER: dict[str, Any] = {}
NAMESPACED: dict[str, Any] = {"rbac": {"scope": "namespace"}, "watchNamespaces": ["team-a", "team-b"]}
EVERYTHING_ON: dict[str, Any] = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "webhook": {"certManager": {"enabled": True}},
}
#: The Role and RoleBinding of the operator's Lease, in the release namespace.
LEADER_ELECTION = "kuberl-leader-election"
SCOPES = pytest.mark.parametrize("values", [CLUSTER, NAMESPACED], ids=["cluster", "namespace"])


def operator_args(objects: list[dict[str, Any]]) -> Any:
    """The container's args as `kuberl operator` (the image's ENTRYPOINT) parses them."""
    return build_parser().parse_args(["operator", *operator_container(objects)["args"]])


def test_helm_lint_finds_no_warning():
    report = helm_python.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_crd_ships_in_the_crds_folder_helm_installs_first():
    with helm_python.Chart.load(CHART) as chart:
        assert [crd["name"] for crd in chart.crds] == ["crds/kuberl.io_rljobs.yaml"]
    (crd,) = [yaml.safe_load(path.read_text()) for path in crd_files()]
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "rljobs.kuberl.io"


@SCOPES
def test_operator_pod_runs_with_secure_defaults(values: dict[str, Any]):
    objects = render(values)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(objects)
    security = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]


@SCOPES
def test_operator_has_requests_limits_and_probes(values: dict[str, Any]):
    container = operator_container(render(values))
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}  # the event loop's pulse
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}  # every replica serves the webhook


@pytest.mark.parametrize("values", [CLUSTER, NAMESPACED, EVERYTHING_ON], ids=["cluster", "namespace", "all-on"])
def test_no_rbac_rule_uses_a_wildcard(values: dict[str, Any]):
    rules = rbac_rules(render(values))
    assert rules
    for role, rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), f"{role['kind']} {role['metadata']['name']}: {rule}"


@SCOPES
def test_operator_never_touches_pods_and_may_only_create_secrets_and_rbac(values: dict[str, Any]):
    verbs: dict[str, set[str]] = {}
    for _, rule in rbac_rules(render(values)):
        for resource in rule["resources"]:
            verbs.setdefault(resource, set()).update(rule["verbs"])
    assert verbs.keys().isdisjoint({"pods", "services", "clusterroles", "clusterrolebindings"})
    # one per job, made once: a Ray token, and the job's own account, role and binding
    for resource in ("secrets", "serviceaccounts", "roles", "rolebindings"):
        assert verbs[resource] == {"create"}, resource
    assert not any({"bind", "escalate", "impersonate"} & granted for granted in verbs.values())


def test_cluster_scope_grants_one_cluster_role_and_watches_everywhere():
    objects = render(CLUSTER)
    assert [role["metadata"]["name"] for role in of_kind(objects, "Role")] == [LEADER_ELECTION]  # its Lease only
    assert [b["metadata"]["name"] for b in of_kind(objects, "RoleBinding")] == [LEADER_ELECTION]
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "kuberl-kuberl-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": RELEASE_NAMESPACE}]
    assert operator_args(objects).namespace is None  # kopf runs cluster-wide
    resources = {r for _, rule in rbac_rules(objects) for r in rule["resources"]}
    assert "namespaces" not in resources  # cluster-wide kopf never lists namespaces


def test_namespace_scope_grants_roles_only_in_the_watched_namespaces():
    objects = render(NAMESPACED)
    roles = [role for role in of_kind(objects, "Role") if role["metadata"]["name"] != LEADER_ELECTION]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    operator_role = one(objects, "ClusterRole", "kuberl-kuberl-system")
    cluster_wide = {r for rule in operator_role["rules"] for r in rule["resources"]}
    assert cluster_wide.isdisjoint({"rljobs", "rayjobs", "configmaps", "events"})
    assert operator_args(objects).namespace == ["team-a", "team-b"]
    bindings = [b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] != LEADER_ELECTION]
    assert {(b["metadata"]["namespace"], b["subjects"][0]["namespace"]) for b in bindings} == {
        ("team-a", RELEASE_NAMESPACE),
        ("team-b", RELEASE_NAMESPACE),
    }


def test_namespace_scope_without_a_list_watches_the_release_namespace():
    objects = render({"rbac": {"scope": "namespace"}})
    roles = {(role["metadata"]["namespace"], role["metadata"]["name"]) for role in of_kind(objects, "Role")}
    assert roles == {(RELEASE_NAMESPACE, "kuberl"), (RELEASE_NAMESPACE, LEADER_ELECTION)}
    assert operator_args(objects).namespace == [RELEASE_NAMESPACE]


def test_unknown_scope_is_refused_naming_the_choices():
    with pytest.raises(helm_python.HelmRenderError, match="rbac.scope must be `cluster` or `namespace`"):
        render({"rbac": {"scope": "everything"}})


@SCOPES
def test_operator_holds_no_admissionregistration_permission(values: dict[str, Any]):
    """With any, it could register a mutating webhook over every Pod: the chart templates the configuration."""
    groups = {group for _, rule in rbac_rules(render(values)) for group in rule["apiGroups"]}
    assert "admissionregistration.k8s.io" not in groups


def test_the_webhook_configuration_sends_rljob_writes_to_the_operators_handler():
    objects = render(CLUSTER)
    configuration = one(objects, "ValidatingWebhookConfiguration")
    assert configuration["metadata"]["name"] == "kuberl.kuberl-system.kuberl.io"
    (webhook,) = configuration["webhooks"]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["rules"] == [
        {
            "apiGroups": ["kuberl.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],  # never DELETE: a delete works while the operator is down
            "resources": ["rljobs"],
            "scope": "Namespaced",
        }
    ]
    service = one(objects, "Service", "kuberl-webhook")
    assert webhook["clientConfig"]["service"] == {
        "namespace": RELEASE_NAMESPACE,
        "name": service["metadata"]["name"],
        "port": service["spec"]["ports"][0]["port"],
        "path": f"/{WEBHOOK_ID}",  # kopf serves a handler at /<its id>
    }


def test_helm_makes_a_ca_and_a_serving_certificate_that_outlives_a_year_of_uptime():
    objects = render(CLUSTER)
    secret = one(objects, "Secret", "kuberl-webhook-tls")
    (webhook,) = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    authority = x509.load_pem_x509_certificate(base64.b64decode(webhook["clientConfig"]["caBundle"]))
    served.verify_directly_issued_by(authority)  # the caBundle the API server trusts signed what is served
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kuberl-webhook.kuberl-system.svc" in names.get_values_for_type(x509.DNSName)
    lifetime = served.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert lifetime > datetime.timedelta(days=9 * 365)  # webhook.certValidityDays: 3650
    short = one(render({"webhook": {"certValidityDays": 30}}), "Secret", "kuberl-webhook-tls")
    lifetime = x509.load_pem_x509_certificate(base64.b64decode(short["data"]["tls.crt"])).not_valid_after_utc
    assert lifetime - datetime.datetime.now(datetime.UTC) < datetime.timedelta(days=31)


def test_cert_manager_issues_the_certificate_and_injects_its_ca():
    objects = render(EVERYTHING_ON)
    configuration = one(objects, "ValidatingWebhookConfiguration")
    certificate = one(objects, "Certificate")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{RELEASE_NAMESPACE}/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    assert certificate["spec"]["secretName"] == "kuberl-webhook-tls"
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": one(objects, "Issuer")["metadata"]["name"]}
    assert of_kind(objects, "Secret") == []  # cert-manager writes it
    issuer = {"kind": "ClusterIssuer", "name": "corporate-ca"}
    objects = render({"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}})
    assert one(objects, "Certificate")["spec"]["issuerRef"] == issuer
    assert of_kind(objects, "Issuer") == []


def test_an_install_without_kuberays_namespace_is_refused_saying_what_to_set():
    """The NetworkPolicy admits KubeRay's labels from its namespace only; an empty one admitted them from any."""
    with pytest.raises(helm_python.HelmRenderError, match="kuberay.namespace: set it to the namespace KubeRay"):
        render({"kuberay": {"namespace": ""}})


def test_an_install_with_a_ray_without_token_authentication_is_refused():
    with pytest.raises(helm_python.HelmRenderError, match="runtime.rayVersion must be 2.52.0 or later"):
        render({"runtime": {"rayVersion": "2.51.1"}})


def test_kuberays_operator_pods_are_told_to_the_operator_for_the_network_policies():
    env = container_env(operator_container(render(CLUSTER)))  # kuberay.namespace: kuberay-system (rendering.py)
    assert OperatorSettings.from_env(env).kuberay == KubeRayPeer("kuberay-system")  # the labels of KubeRay's chart
    labels = {"app.kubernetes.io/name": "my-kuberay", "team": "ml"}
    env = container_env(operator_container(render({"kuberay": {"namespace": "ray-system", "operatorLabels": labels}})))
    assert OperatorSettings.from_env(env).kuberay == KubeRayPeer("ray-system", labels)
    assert OperatorSettings.from_env(env).ray_version == "2.60.0"


def test_namespace_editors_may_write_rljobs_but_not_their_status():
    objects = render(CLUSTER)
    editor = one(objects, "ClusterRole", "kuberl-kuberl-system-rljob-editor")
    viewer = one(objects, "ClusterRole", "kuberl-kuberl-system-rljob-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    status_rule = next(rule for rule in editor["rules"] if rule["resources"] == ["rljobs/status"])
    assert status_rule["verbs"] == ["get"]
    assert {verb for rule in viewer["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}


def test_default_roles_are_left_alone_when_asked():
    objects = render({"rbac": {"aggregateToDefaultRoles": False}})
    assert not any("rljob-" in role["metadata"]["name"] for role in of_kind(objects, "ClusterRole"))


def test_image_tags_default_to_the_app_version():
    objects = render(CLUSTER)
    container = operator_container(objects)
    assert container["image"] == "ghcr.io/kuberl/operator:0.1.0"
    assert container_env(container)["KUBERL_RUNTIME_IMAGE"] == "ghcr.io/kuberl/runtime:0.1.0"


def test_two_replicas_elect_a_leader_and_roll_without_a_gap_in_the_webhook():
    objects = render(CLUSTER)
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    election = OperatorSettings.from_env(container_env(operator_container(objects))).leader_election
    assert election is not None
    assert (election.namespace, election.name) == (RELEASE_NAMESPACE, "kuberl")
    assert (election.lease_duration_seconds, election.renew_deadline_seconds, election.retry_period_seconds) == (
        15,
        10.0,
        2.0,
    )


def test_without_leader_election_one_replica_is_replaced_with_recreate():
    objects = render({"operator": {"replicas": 1, "leaderElection": {"enabled": False}}})
    spec = one(objects, "Deployment")["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert OperatorSettings.from_env(container_env(operator_container(objects))).leader_election is None
    assert not any(r["resources"] == ["leases"] for _, r in rbac_rules(objects))
    assert of_kind(objects, "PodDisruptionBudget") == []


def test_two_replicas_without_leader_election_are_refused():
    with pytest.raises(helm_python.HelmRenderError, match="operator.leaderElection.enabled is false"):
        render({"operator": {"leaderElection": {"enabled": False}}})


def test_a_renew_deadline_not_below_the_lease_duration_is_refused():
    election = {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}
    with pytest.raises(helm_python.HelmRenderError, match="renewDeadlineSeconds must be below leaseDurationSeconds"):
        render({"operator": {"leaderElection": election}})


@SCOPES
def test_the_operator_may_read_and_renew_only_its_own_lease_in_the_release_namespace(values: dict[str, Any]):
    objects = render(values)
    role = one(objects, "Role", LEADER_ELECTION)
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["kuberl"],  # the Lease the operator is told to use
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    binding = one(objects, "RoleBinding", LEADER_ELECTION)
    assert binding["roleRef"]["name"] == LEADER_ELECTION
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl", "namespace": RELEASE_NAMESPACE}]
    lease_rules = [(r, rule) for r, rule in rbac_rules(objects) if "leases" in rule["resources"]]
    assert [r["metadata"]["name"] for r, _ in lease_rules] == [LEADER_ELECTION] * 2  # nowhere else


def test_a_disruption_budget_keeps_one_operator_pod_through_a_drain():
    objects = render(CLUSTER)
    budget = one(objects, "PodDisruptionBudget")
    pod = one(objects, "Deployment")["spec"]["template"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert of_kind(render({"operator": {"podDisruptionBudget": {"enabled": False}}}), "PodDisruptionBudget") == []


def test_container_args_and_env_are_settings_the_operator_reads():
    objects = render(CLUSTER)
    container = operator_container(objects)
    args = operator_args(objects)
    settings = OperatorSettings.from_env(
        container_env(container), metrics_port=args.metrics_port, webhook_port=args.webhook_port
    )
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (settings.metrics_port, settings.webhook_port) == (ports["metrics"], ports["webhook"])
    assert (settings.webhook_cert, settings.webhook_key) == (
        "/etc/kuberl/webhook-tls/tls.crt",
        "/etc/kuberl/webhook-tls/tls.key",
    )


def test_webhook_service_reaches_the_webhook_port():
    objects = render(CLUSTER)
    service = one(objects, "Service", "kuberl-webhook")
    pod = one(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize("values", [CLUSTER, EVERYTHING_ON], ids=["helm", "cert-manager"])
def test_webhook_certificate_secret_is_mounted_where_the_operator_reads_it(values: dict[str, Any]):
    objects = render(values)
    container = operator_container(objects)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    env = container_env(container)
    assert {"name": "webhook-tls", "secret": {"secretName": "kuberl-webhook-tls"}} in pod["volumes"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert env["KUBERL_WEBHOOK_CERT"] == f"{mount['mountPath']}/tls.crt"
    assert env["KUBERL_WEBHOOK_KEY"] == f"{mount['mountPath']}/tls.key"


def test_webhook_disabled_removes_its_port_service_and_rbac():
    objects = render({"webhook": {"enabled": False}})
    container = operator_container(objects)
    assert operator_args(objects).webhook_port is None
    assert "KUBERL_WEBHOOK_CERT" not in container_env(container)
    assert [s["metadata"]["name"] for s in of_kind(objects, "Service")] == ["kuberl-metrics"]
    assert of_kind(objects, "ValidatingWebhookConfiguration") == of_kind(objects, "Secret") == []
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_service_monitor_only_when_asked():
    assert of_kind(render(CLUSTER), "ServiceMonitor") == []
    objects = render(EVERYTHING_ON)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", "kuberl-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
