"""The chart's RBAC on a real API server: enough for the operator and the runtime to work, and no more.

Each test runs once per `rbac.scope` (the `installation` fixture): the operator authenticates with the
chart's ServiceAccount token only. A missing verb shows up as a job that never progresses and as a
403 in the API server's audit log; an excess one as a granted verb the audit log never shows the
operator using, or as an access review that says yes where it must say no.
"""

import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher
from tests.integration.chart.conftest import Installation, create_namespace, service_account_token, webhook_answers
from tests.integration.envtest import ControlPlane, wait_until

pytestmark = pytest.mark.integration

ADMISSION = "admissionregistration.k8s.io"
WEBHOOKS = f"/apis/{ADMISSION}/v1/validatingwebhookconfigurations"
MERGE_PATCH = "application/merge-patch+json"
#: The finalizer kopf put on every RLJob while the operator had a timer handler (kuberl before #13).
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def granted_verbs(installation: Installation) -> set[tuple[str, str, str]]:
    """(verb, apiGroup, resource[/subresource]) of every rule the chart gives the operator."""
    roles = [
        obj
        for obj in installation.objects
        if obj["kind"] in ("Role", "ClusterRole")
        and any(binding_grants(b, obj, installation) for b in installation.objects)
    ]
    return {
        (verb, group, resource)
        for role in roles
        for rule in role["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def binding_grants(binding: dict[str, Any], role: dict[str, Any], installation: Installation) -> bool:
    """Whether `binding` gives `role` to the operator's ServiceAccount."""
    if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
        return False
    ref = binding["roleRef"]
    if (ref["kind"], ref["name"]) != (role["kind"], role["metadata"]["name"]):
        return False
    if role["kind"] == "Role" and binding["metadata"]["namespace"] != role["metadata"]["namespace"]:
        return False
    return {
        "kind": "ServiceAccount",
        "name": installation.service_account,
        "namespace": installation.release_namespace,
    } in binding["subjects"]


def operator_requests(cp: ControlPlane, user: str) -> dict[tuple[str, str, str], set[int]]:
    """(verb, apiGroup, resource[/subresource]) -> HTTP codes of `user`'s requests, from the audit log.

    Requests sent with urllib are these tests' probes and left out. A watch being served has no code
    yet (0: received, not refused; a refused one completes at once with 403). A server-side apply
    (PATCH) answered 201 created the object, which the API server authorized as `create` too.
    """
    answers: dict[tuple[str, str, str], set[int]] = {}
    for line in cp.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef")
        if event["user"]["username"] != user or ref is None or event.get("userAgent", "").startswith("Python-urllib"):
            continue
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        code = int(event.get("responseStatus", {}).get("code", 0))
        answers.setdefault((event["verb"], ref.get("apiGroup", ""), resource), set()).add(code)
        if event["verb"] == "patch" and code == 201:
            answers.setdefault(("create", ref.get("apiGroup", ""), resource), set()).add(code)
    return answers


def call(cp: ControlPlane, token: str, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
    """One request with `token` (not the admin's); HTTPError on a refusal."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type or "application/json"}
    request = urllib.request.Request(cp.server + path, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=str(cp.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def refused_status(
    cp: ControlPlane, token: str, method: str, path: str, body: Any = None, content_type: str = ""
) -> int:
    with pytest.raises(urllib.error.HTTPError) as refusal:
        call(cp, token, method, path, body, content_type)
    return refusal.value.code


def allowed(cp: ControlPlane, token: str, namespace: str | None, verb: str, resource: str, group: str = "") -> bool:
    """SelfSubjectAccessReview: may the token's owner do this?"""
    attributes = {"verb": verb, "resource": resource, "group": group}
    if namespace is not None:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = call(cp, token, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    return bool(answer["status"]["allowed"])


def configmap_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps" + (f"/{name}" if name else "")


def rljob_path(namespace: str, name: str = "") -> str:
    return f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs" + (f"/{name}" if name else "")


def create_rljob(cp: ControlPlane, namespace: str, name: str, **spec_changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "models": {"actor": {"path": "tiny://demo"}},
        "data": {"train": "/data/train.jsonl"},
        "reward": {"function": "tiny_task"},
        "checkpoint": {"pvcClaimName": "ckpt"},  # the webhook requires storage every pod of the job shares
    }
    spec.update(spec_changes)
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}
    return dict(cp.request("POST", rljob_path(namespace), manifest))


def get_or_none(cp: ControlPlane, path: str) -> dict[str, Any] | None:
    try:
        return dict(cp.request("GET", path))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def rljob(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    return get_or_none(cp, rljob_path(namespace, name))


def rayjob(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    return get_or_none(cp, f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}")


def status_of(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(cp.request("GET", rljob_path(namespace, name)).get("status") or {})


def play_kuberay(cp: ControlPlane, namespace: str, rayjob: str, deployment: str, job_status: str) -> None:
    """Move a RayJob's status as KubeRay would (as the admin: KubeRay is not under test)."""
    cp.request(
        "PATCH",
        f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{rayjob}/status",
        {"status": {"jobDeploymentStatus": deployment, "jobStatus": job_status}},
        content_type="application/merge-patch+json",
    )


def live_a_whole_life(cp: ControlPlane, ns: str, name: str) -> None:
    """Every verb of the reconcile pass: RayJob + ConfigMap applied, status written, a failed RayJob
    replaced and deleted, Events posted, and the finished RLJob deleted by its TTL."""
    create_rljob(cp, ns, name, runPolicy={"maxRestarts": 1, "backoffSeconds": 0, "ttlSecondsAfterFinished": 0})
    first = wait_until(lambda: rayjob(cp, ns, f"{name}-0"), timeout=30, what=f"the RayJob {name}-0")
    assert first["metadata"]["ownerReferences"][0]["name"] == name
    cluster = first["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    assert {pod.get("serviceAccountName") for pod in pods} == {f"{name}-runtime"}  # the job's own account
    policy = cp.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}-ray")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"kuberl.io/job": name}}  # accepted by the API server
    configmap = cp.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}-spec")
    assert "tiny://demo" in configmap["data"]["rljob.yaml"]
    assert status_of(cp, ns, name)["rayJobName"] == f"{name}-0"
    play_kuberay(cp, ns, f"{name}-0", "Failed", "FAILED")
    wait_until(lambda: rayjob(cp, ns, f"{name}-1"), timeout=30, what=f"the RayJob {name}-1 (a restart)")
    wait_until(lambda: rayjob(cp, ns, f"{name}-0") is None, timeout=30, what=f"{name}-0 deleted")
    play_kuberay(cp, ns, f"{name}-1", "Complete", "SUCCEEDED")
    # Usually within a second; when the resync timer is mid-run as the deletion arrives, kopf releases its
    # finalizer at its next cancellation poll (settings.background.cancellation_polling: 1 s in handlers.py).
    wait_until(lambda: rljob(cp, ns, name) is None, timeout=30, what="the RLJob deleted by its TTL")


def upgrade_an_old_job(cp: ControlPlane, ns: str, name: str) -> None:
    """An RLJob as earlier kuberl versions left it, with kopf's finalizer: the operator removes it."""
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "finalizers": [KOPF_FINALIZER]},
        "spec": {
            "models": {"actor": {"path": "tiny://demo"}},
            "data": {"train": "/data/train.jsonl"},
            "reward": {"function": "tiny_task"},
            "checkpoint": {"pvcClaimName": "ckpt"},
        },
    }
    cp.request("POST", rljob_path(ns), manifest)
    wait_until(
        lambda: not (rljob(cp, ns, name) or {}).get("metadata", {}).get("finalizers"),
        timeout=30,
        what="the finalizer of an earlier version removed",
    )


def test_operator_runs_a_job_through_a_restart_to_success_and_ttl_with_the_charts_rbac(
    control_plane: ControlPlane, installation: Installation
):
    live_a_whole_life(control_plane, installation.jobs_namespace, "life")
    events = control_plane.request("GET", f"/api/v1/namespaces/{installation.jobs_namespace}/events")["items"]
    reasons = {event["reason"] for event in events if event["involvedObject"]["name"] == "life"}
    assert {"RayJobCreated", "RayJobSucceeded"} <= reasons


def test_operator_uses_every_verb_it_is_granted_and_is_refused_none(
    control_plane: ControlPlane, installation: Installation
):
    """The API server's audit log of the operator's own requests (not these tests' probes) against the chart's rules."""
    live_a_whole_life(control_plane, installation.jobs_namespace, "audited")
    upgrade_an_old_job(control_plane, installation.jobs_namespace, "upgraded")
    granted = granted_verbs(installation)
    user = f"system:serviceaccount:{installation.release_namespace}:{installation.service_account}"

    deadline = time.monotonic() + 10  # the audit log is written just after the answers
    answers = operator_requests(control_plane, user)
    while not granted <= answers.keys() and time.monotonic() < deadline:
        time.sleep(0.2)
        answers = operator_requests(control_plane, user)
    assert {key: codes for key, codes in answers.items() if 403 in codes} == {}
    assert answers.keys() - granted == set()  # (would be refused anyway; a new call needs a new rule)
    assert granted - answers.keys() == set()


def test_the_charts_webhook_reaches_the_operator_and_refuses_a_bad_rljob(
    control_plane: ControlPlane, installation: Installation
):
    path = f"{WEBHOOKS}/{installation.webhook_configuration}"
    (webhook,) = control_plane.request("GET", path)["webhooks"]
    assert webhook["clientConfig"]["service"]["name"] == "kuberl-webhook"  # through the Service, as in a cluster
    with pytest.raises(urllib.error.HTTPError) as refusal:
        create_rljob(
            control_plane, installation.jobs_namespace, "needs-critic", algorithm={"advantageEstimator": "gae"}
        )
    assert "spec.models.critic" in refusal.value.read().decode()


def test_operator_may_not_register_a_mutating_webhook(control_plane: ControlPlane, installation: Installation):
    """One that rewrote every Pod in the cluster would make the operator's token cluster-admin."""
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "pods.evil.example.com"},
        "webhooks": [
            {
                "name": "pods.evil.example.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "clientConfig": {"url": "https://evil.example.com/mutate"},
            }
        ],
    }
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    assert refused_status(control_plane, installation.operator_token, "POST", path, mutating) == 403


def test_operator_may_not_widen_its_own_webhook_to_secrets(control_plane: ControlPlane, installation: Installation):
    path = f"{WEBHOOKS}/{installation.webhook_configuration}"
    (webhook,) = control_plane.request("GET", path)["webhooks"]
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["secrets"]}
    widened = {"webhooks": [{**webhook, "rules": [*webhook["rules"], rule]}]}
    status = refused_status(control_plane, installation.operator_token, "PATCH", path, widened, MERGE_PATCH)
    assert status == 403
    assert not allowed(
        control_plane, installation.operator_token, None, "create", "validatingwebhookconfigurations", ADMISSION
    )


def test_operator_logs_no_permission_problem(control_plane: ControlPlane, installation: Installation):
    create_rljob(control_plane, installation.jobs_namespace, "quiet")
    wait_until(
        lambda: status_of(control_plane, installation.jobs_namespace, "quiet").get("rayJobName"),
        timeout=30,
        what="the operator's first pass",
    )
    problems = [
        record.getMessage()
        for record in installation.logs
        if any(word in record.getMessage() for word in ("403", "Forbidden", "forbidden", "permission"))
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/namespaces/{ns}/secrets", None),
        ("GET", "/api/v1/secrets", None),
        ("POST", "/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}),
        ("GET", "/api/v1/namespaces/{ns}/pods", None),
        ("DELETE", "/api/v1/namespaces/{ns}", None),
    ],
    ids=["get-secrets", "list-all-secrets", "create-pod", "list-pods", "delete-namespace"],
)
def test_operator_is_refused_what_it_does_not_need(
    control_plane: ControlPlane, installation: Installation, method: str, path: str, body: Any
):
    target = path.format(ns=installation.jobs_namespace)
    assert refused_status(control_plane, installation.operator_token, method, target, body) == 403


def test_operator_may_not_write_rbac_or_webhooks_of_others(control_plane: ControlPlane, installation: Installation):
    token, ns = installation.operator_token, installation.jobs_namespace
    for verb in ("patch", "update", "delete", "bind", "escalate"):  # it may only create, within what it holds
        assert not allowed(control_plane, token, ns, verb, "rolebindings", "rbac.authorization.k8s.io")
        assert not allowed(control_plane, token, ns, verb, "roles", "rbac.authorization.k8s.io")
    assert not allowed(control_plane, token, None, "create", "clusterrolebindings", "rbac.authorization.k8s.io")
    other = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration"}
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/someone-else.example.com"
    assert refused_status(control_plane, token, "PATCH", path, other) == 403


def test_namespace_scope_operator_sees_no_other_namespace(control_plane: ControlPlane, installation: Installation):
    if installation.scope != "namespace":
        pytest.skip("only rbac.scope=namespace limits the operator to its namespaces")
    token = installation.operator_token
    assert not allowed(control_plane, token, installation.release_namespace, "list", "rljobs", "kuberl.io")
    assert not allowed(control_plane, token, "default", "patch", "configmaps")
    assert allowed(control_plane, token, installation.jobs_namespace, "patch", "configmaps")


@pytest.fixture
def cleanups(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Paths of cluster-scoped objects a test made, deleted after it."""
    paths: list[str] = []
    yield paths
    for path in paths:
        control_plane.request("DELETE", path)


def job_token(cp: ControlPlane, installation: Installation, name: str) -> str:
    """The token the kubelet would mount into the head pod of job `name` (its own account, made by the operator),
    once the operator has made the account and the ConfigMap it reports into (as before the pods start)."""
    ns = installation.jobs_namespace
    account = f"/api/v1/namespaces/{ns}/serviceaccounts/{name}-runtime"
    wait_until(lambda: get_or_none(cp, account), timeout=30, what=f"the ServiceAccount {name}-runtime")
    wait_until(lambda: get_or_none(cp, configmap_path(ns, f"{name}-progress")), timeout=30, what="the report ConfigMap")
    return service_account_token(cp, ns, f"{name}-runtime")


def test_the_runtime_publishes_progress_with_its_jobs_token_and_the_operator_shows_it(
    control_plane: ControlPlane, installation: Installation
):
    ns = installation.jobs_namespace
    create_rljob(control_plane, ns, "publishing")
    token_file = installation.folder / "publishing-token"
    token_file.write_text(job_token(control_plane, installation, "publishing"))
    publisher = KubernetesStatusPublisher(
        "publishing",
        ns,
        control_plane.server,
        token_file,
        ssl.create_default_context(cafile=str(control_plane.ca_file)),
        configmap="publishing-progress",
        min_interval=0.0,
    )
    last = {"step": 5, "uri": "s3://bucket/publishing/step-5", "time": "2026-01-01T00:00:00Z"}
    publisher.publish({"step": 5, "totalSteps": 60}, {"rewardMean": 0.25}, last)
    publisher.close(timeout=10)
    status = wait_until(
        lambda: (s := status_of(control_plane, ns, "publishing")).get("progress") and s,
        timeout=30,
        what="the report in the RLJob's status",
    )
    assert status["progress"] == {"step": 5, "totalSteps": 60, "epoch": 0}
    assert status["metrics"] == {"rewardMean": 0.25}
    assert status["lastCheckpoint"] == last
    assert status["phase"] == "Starting"  # the operator's own


def test_a_jobs_token_may_write_its_own_report_and_nothing_else(
    control_plane: ControlPlane, installation: Installation
):
    """User code in a job's pods holds at most this token: it cannot reach a neighbour, nor any RLJob."""
    cp, ns = control_plane, installation.jobs_namespace
    for name in ("mine", "neighbour"):
        create_rljob(cp, ns, name)
        wait_until(lambda name=name: get_or_none(cp, configmap_path(ns, f"{name}-progress")), timeout=30, what="report")
    token = job_token(cp, installation, "mine")
    report = {"data": {"report.json": '{"progress": {"step": 1}}'}}
    call(cp, token, "PATCH", configmap_path(ns, "mine-progress"), report, MERGE_PATCH)  # its own: allowed
    refused = {
        "a neighbour's report": ("PATCH", configmap_path(ns, "neighbour-progress"), report),
        "its own RLJob's status": ("PATCH", rljob_path(ns, "mine") + "/status", {"status": {"phase": "Succeeded"}}),
        "a neighbour's status": ("PATCH", rljob_path(ns, "neighbour") + "/status", {"status": {"phase": "Failed"}}),
        "any RLJob": ("GET", rljob_path(ns, "mine"), None),
        "the Ray token": ("GET", f"/api/v1/namespaces/{ns}/secrets/mine-ray-token", None),
        "a new report": ("POST", configmap_path(ns), {"metadata": {"name": "mine-progress-2"}}),
    }
    answers = {what: refused_status(cp, token, m, path, body, MERGE_PATCH) for what, (m, path, body) in refused.items()}
    assert answers == dict.fromkeys(refused, 403)
    assert not allowed(cp, token, ns, "create", "pods")
    assert not allowed(cp, token, ns, "delete", "configmaps")


def test_the_operator_cannot_grant_more_than_it_holds_through_the_roles_it_creates(
    control_plane: ControlPlane, installation: Installation, cleanups: list[str]
):
    token, ns = installation.operator_token, installation.jobs_namespace
    reader = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "secret-reader"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    }
    roles = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    assert refused_status(control_plane, token, "POST", f"{roles}/roles", reader) == 403
    cluster_reader = {**reader, "kind": "ClusterRole", "metadata": {"name": f"{ns}-secret-reader"}}
    try:  # an existing role that holds more than the operator (edit's rules come from aggregation, not run here)
        control_plane.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", cluster_reader)
    except urllib.error.HTTPError as error:
        assert error.code == 409  # the other scope's run made it
    cleanups.append(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{ns}-secret-reader")
    for cluster_role in (f"{ns}-secret-reader", "cluster-admin"):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"to-{cluster_role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
        }
        assert refused_status(control_plane, token, "POST", f"{roles}/rolebindings", binding) == 403
    assert refused_status(control_plane, token, "GET", f"/api/v1/namespaces/{ns}/secrets/anything") == 403


def test_rljobs_carry_no_finalizer(control_plane: ControlPlane, installation: Installation):
    ns = installation.jobs_namespace
    create_rljob(control_plane, ns, "unfinalized")
    wait_until(lambda: rayjob(control_plane, ns, "unfinalized-0"), timeout=30, what="the RayJob")
    assert (rljob(control_plane, ns, "unfinalized") or {})["metadata"].get("finalizers") is None


def test_while_the_operator_is_down_deletes_work_and_writes_wait_for_the_webhook(
    control_plane: ControlPlane, installation: Installation
):
    """A clean stop leaves the webhook registered (nothing unvalidated gets in), and nothing wedges a delete."""
    ns = installation.jobs_namespace
    create_rljob(control_plane, ns, "outlived")
    wait_until(lambda: rayjob(control_plane, ns, "outlived-0"), timeout=30, what="the RayJob")
    before = control_plane.request("GET", f"{WEBHOOKS}/{installation.webhook_configuration}")
    installation.running.stop()
    try:
        after = control_plane.request("GET", f"{WEBHOOKS}/{installation.webhook_configuration}")
        assert after["webhooks"] == before["webhooks"]  # not purged by the shutdown
        with pytest.raises(urllib.error.HTTPError) as refusal:  # an invalid spec cannot slip in meanwhile
            create_rljob(control_plane, ns, "unchecked", algorithm={"advantageEstimator": "gae"})
        assert "failed calling webhook" in refusal.value.read().decode()
        control_plane.request("DELETE", rljob_path(ns, "outlived"))
        wait_until(lambda: rljob(control_plane, ns, "outlived") is None, timeout=10, what="the RLJob deleted")
    finally:
        installation.running.start()
    wait_until(lambda: webhook_answers(control_plane, ns), timeout=30, what="the webhook answering after the restart")
    create_rljob(control_plane, ns, "after-restart")
    wait_until(lambda: rayjob(control_plane, ns, "after-restart-0"), timeout=30, what="a job after the restart")


def test_a_namespace_with_rljobs_deletes_while_the_operator_is_down(
    control_plane: ControlPlane, installation: Installation
):
    if installation.scope != "cluster":
        pytest.skip("needs an operator that watches a namespace created for the test")
    ns = f"chart-gone-{secrets.token_hex(3)}"
    create_namespace(control_plane, ns)
    create_rljob(control_plane, ns, "doomed")
    wait_until(lambda: rayjob(control_plane, ns, "doomed-0"), timeout=30, what="the RayJob")
    installation.running.stop()
    try:
        control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")
        wait_until(
            lambda: get_or_none(control_plane, f"/api/v1/namespaces/{ns}") is None,
            timeout=60,
            what=f"namespace {ns} gone",
        )
    finally:
        installation.running.start()
