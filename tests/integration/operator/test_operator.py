"""The operator against a real API server: RLJobs in, RayJobs and ConfigMaps out, status back.

Nothing plays KubeRay but the tests themselves (`cluster.kuberay(...)` writes a RayJob's status
as KubeRay would); the RayJob CRD is a structural fake (crds/fake-kuberay-rayjob-crd.yaml).
"""

import json
import shlex
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml

from kuberl.operator import names
from kuberl.operator.kube import ApiError
from tests.integration.envtest import ControlPlane
from tests.integration.operator.conftest import (
    RUNTIME_IMAGE,
    Cluster,
    RunningOperator,
    rljob_manifest,
    tiny_spec,
    wait_for,
)

pytestmark = pytest.mark.integration

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def refusal(error: ApiError) -> str:
    assert error.status == 422
    return str(json.loads(error.body)["message"])


def test_an_rljob_gets_an_owned_rayjob_and_configmap_with_a_worker_group_per_role(cluster: Cluster):
    spec = tiny_spec(
        rollout={"placement": "separate", "tensorParallelSize": 4},
        resources={
            "actor": {"replicas": 2, "gpus": 8},
            "rollout": {"replicas": 1, "gpus": 4},
            "reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 8},
        },
        checkpoint={"pvcClaimName": "ckpt"},
    )
    job = cluster.create("tiny-grpo", spec)
    status = cluster.wait_status("tiny-grpo", phase="Starting", rayJobName="tiny-grpo-0")
    assert status["observedGeneration"] == 1
    rayjob = wait_for(lambda: cluster.rayjobs().get("tiny-grpo-0"), what="RayJob tiny-grpo-0")
    configmap = cluster.configmap("tiny-grpo")
    assert configmap is not None
    for child in (rayjob, configmap):
        assert child["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert child["metadata"]["labels"][names.JOB_LABEL] == "tiny-grpo"
    cluster_spec = rayjob["spec"]["rayClusterSpec"]
    groups = {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}
    assert list(groups) == ["actor", "reward", "rollout"]
    assert groups["actor"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert (groups["reward"]["minReplicas"], groups["reward"]["maxReplicas"]) == (1, 8)
    assert cluster_spec["enableInTreeAutoscaling"] is True
    assert cluster_spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == RUNTIME_IMAGE
    assert shlex.split(rayjob["spec"]["entrypoint"])[:3] == ["python", "-m", "kuberl.runtime"]
    assert yaml.safe_load(configmap["data"]["rljob.yaml"])["spec"] == spec


def test_printer_columns_show_phase_progress_reward_and_restarts(cluster: Cluster, control_plane: ControlPlane):
    cluster.create("columns", tiny_spec())
    cluster.wait_status("columns", phase="Starting")
    wait_for(lambda: cluster.kube.get(names.configmap_path(cluster.ns, "columns-progress")), what="the report's home")
    report = {"progress": {"step": 12, "totalSteps": 60}, "metrics": {"rewardMean": 0.75}}
    cluster.kube.call(  # what the runtime publishes, into its report ConfigMap; the operator copies it
        "PATCH",
        names.configmap_path(cluster.ns, "columns-progress"),
        body={"data": {"report.json": json.dumps(report)}},
        content_type="application/merge-patch+json",
    )
    wait_for(lambda: cluster.status("columns").get("progress"), what="the report in the status")
    table = control_plane.request("GET", names.rljob_path(cluster.ns, "columns"), accept=TABLE)
    columns = [column["name"] for column in table["columnDefinitions"]]
    row = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert (row["Name"], row["Phase"], row["Step"], row["Total"], row["Reward"], row["Restarts"]) == (
        "columns",
        "Starting",
        12,
        60,
        0.75,
        0,
    )


def test_deleting_the_rljob_garbage_collects_its_children(cluster: Cluster):
    cluster.create("doomed", tiny_spec())
    wait_for(lambda: "doomed-0" in cluster.rayjobs(), what="RayJob doomed-0")
    cluster.kube.delete(names.rljob_path(cluster.ns, "doomed"))
    wait_for(lambda: cluster.rayjobs() == {} and cluster.configmap("doomed") is None, timeout=60, what="GC")


def test_the_rljob_follows_its_rayjob_to_success(cluster: Cluster):
    cluster.create("follow", tiny_spec())
    wait_for(lambda: "follow-0" in cluster.rayjobs(), what="RayJob follow-0")
    cluster.kuberay("follow-0", "Initializing")
    cluster.wait_status("follow", phase="Starting")
    cluster.kuberay("follow-0", "Running", "RUNNING", dashboardURL="follow-0-head-svc:8265")
    status = cluster.wait_status("follow", phase="Running")
    assert status["dashboardUrl"] == "follow-0-head-svc:8265"
    cluster.kuberay("follow-0", "Complete", "SUCCEEDED")
    status = cluster.wait_status("follow", phase="Succeeded")
    assert status["completionTime"]
    # the pass that writes a status posts its events after the write (operator/reconcile.py `act`)
    expected = {"RayJobCreated", "RayJobRunning", "RayJobSucceeded"}
    wait_for(lambda: expected <= {event["reason"] for event in cluster.events("follow")}, what=f"events {expected}")


def test_a_failure_restarts_from_the_checkpoint_until_max_restarts(cluster: Cluster):
    cluster.create("flaky", tiny_spec(runPolicy={"maxRestarts": 1, "backoffSeconds": 1}))
    wait_for(lambda: "flaky-0" in cluster.rayjobs(), what="RayJob flaky-0")
    # KubeRay's message is the end of the job's log: Ray's colour codes, and gloo's emoji beyond U+FFFF (which
    # a surrogate-pair JSON body would have made the API server refuse in every status write after it).
    log = "\x1b[36m(ModelWorker pid=123)\x1b[0m Read error: Connection reset by peer. GLHF! \U0001f3d6\ufe0f"
    cluster.kuberay("flaky-0", "Failed", "FAILED", message=f"Job entrypoint command failed with exit code 1\n{log}")
    restarting = cluster.wait_status("flaky", phase="Restarting")
    shown = next(c for c in restarting["conditions"] if c["type"] == "Restarting")["message"]
    assert "exit code 1\n(ModelWorker pid=123) Read error: Connection reset by peer. GLHF! \U0001f3d6\ufe0f" in shown
    restarted = wait_for(lambda: cluster.rayjobs().get("flaky-1"), timeout=10, what="RayJob flaky-1")
    assert restarted["metadata"]["labels"][names.RESTART_LABEL] == "1"
    assert "--resume" in shlex.split(restarted["spec"]["entrypoint"])
    wait_for(lambda: list(cluster.rayjobs()) == ["flaky-1"], what="flaky-0 deleted")
    assert cluster.status("flaky")["restarts"] == 1
    cluster.kuberay("flaky-1", "Failed", "FAILED")
    status = cluster.wait_status("flaky", phase="Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "MaxRestartsExceeded"
    assert status["restarts"] == 1
    assert list(cluster.rayjobs()) == ["flaky-1"]
    expected = {"BackoffBeforeRestart", "MaxRestartsExceeded"}  # posted after the status write
    wait_for(
        lambda: expected <= {e["reason"] for e in cluster.events("flaky") if e["type"] == "Warning"},
        what=f"events {expected}",
    )


def test_suspend_removes_the_rayjob_and_unsuspend_resumes_in_a_new_one(cluster: Cluster):
    cluster.create("pausable", tiny_spec())
    wait_for(lambda: "pausable-0" in cluster.rayjobs(), what="RayJob pausable-0")
    cluster.edit_spec("pausable", {"runPolicy": {"suspend": True}})
    cluster.wait_status("pausable", phase="Suspended")
    wait_for(lambda: cluster.rayjobs() == {}, what="the RayJob removed")
    assert cluster.configmap("pausable") is not None
    cluster.edit_spec("pausable", {"runPolicy": {"suspend": False}})
    cluster.wait_status("pausable", phase="Starting", rayJobName="pausable-1")
    resumed = wait_for(lambda: cluster.rayjobs().get("pausable-1"), what="RayJob pausable-1")
    assert "--resume" in resumed["spec"]["entrypoint"]
    assert cluster.status("pausable")["restarts"] == 0


def test_a_safe_spec_change_restarts_the_job_with_the_new_spec(cluster: Cluster):
    cluster.create("tunable", tiny_spec())
    wait_for(lambda: "tunable-0" in cluster.rayjobs(), what="RayJob tunable-0")
    cluster.kuberay("tunable-0", "Running", "RUNNING")
    cluster.wait_status("tunable", phase="Running")
    cluster.edit_spec("tunable", {"rollout": {"temperature": 0.5}})
    cluster.wait_status("tunable", rayJobName="tunable-1", observedGeneration=2)
    wait_for(lambda: list(cluster.rayjobs()) == ["tunable-1"], what="only tunable-1")
    configmap = cluster.configmap("tunable")
    assert configmap is not None
    assert yaml.safe_load(configmap["data"]["rljob.yaml"])["spec"]["rollout"] == {"temperature": 0.5}


def test_the_next_rayjob_waits_until_the_previous_one_and_its_pods_are_gone(cluster: Cluster):
    """Two runtimes never share a checkpoint location. KubeRay's pods stand in as a ConfigMap owned by the
    RayJob that a finalizer keeps (a pod that has not stopped yet); the real garbage collector keeps the
    foreground-deleted RayJob until it goes, and only then does the operator create the next one."""
    cluster.create("careful", tiny_spec())
    old = wait_for(lambda: cluster.rayjobs().get("careful-0"), what="RayJob careful-0")
    cluster.kuberay("careful-0", "Running", "RUNNING")
    cluster.wait_status("careful", phase="Running")
    stopping = "kuberl.test/pod-still-stopping"
    pod_path = names.configmap_path(cluster.ns, "careful-0-head-standin")
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "careful-0", "uid": old["metadata"]["uid"]}
    cluster.kube.create(
        names.configmap_path(cluster.ns),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "careful-0-head-standin",
                "finalizers": [stopping],
                "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
            },
        },
    )
    cluster.edit_spec("careful", {"rollout": {"temperature": 0.5}})
    status = cluster.wait_status("careful", rayJobName="careful-1", observedGeneration=2)
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["reason"] == "WaitingForPreviousRayJob"
    assert "careful-0" in running["message"]
    time.sleep(5)  # a few passes (one every 2 s) while the stand-in pod stops
    left = {item["metadata"]["name"]: item for item in cluster.kube.call("GET", names.rayjob_path(cluster.ns))["items"]}
    assert set(left) == {"careful-0"}, "the next RayJob was created while the previous one still had pods"
    assert left["careful-0"]["metadata"].get("deletionTimestamp")
    cluster.kube.call(
        "PATCH", pod_path, body={"metadata": {"finalizers": []}}, content_type="application/merge-patch+json"
    )
    wait_for(lambda: list(cluster.rayjobs()) == ["careful-1"], timeout=30, what="careful-1 after careful-0 is gone")
    assert cluster.status("careful")["restarts"] == 0


def test_an_unsafe_spec_change_is_refused_with_a_condition_and_an_event(cluster: Cluster):
    cluster.create("stubborn", tiny_spec())
    wait_for(lambda: "stubborn-0" in cluster.rayjobs(), what="RayJob stubborn-0")
    cluster.edit_spec("stubborn", {"models": {"actor": {"path": "hf://org/another"}}})

    def refused() -> dict | None:
        conditions = cluster.status("stubborn").get("conditions", [])
        return next((c for c in conditions if c["type"] == "SpecChangeRefused" and c["status"] == "True"), None)

    condition = wait_for(refused, what="SpecChangeRefused")
    assert "spec.models.actor.path" in condition["message"]
    assert list(cluster.rayjobs()) == ["stubborn-0"]
    configmap = cluster.configmap("stubborn")
    assert configmap is not None
    assert yaml.safe_load(configmap["data"]["rljob.yaml"])["spec"]["models"]["actor"]["path"] == "tiny://demo"
    wait_for(
        lambda: any(e["reason"] == "UnsafeSpecChange" for e in cluster.events("stubborn")), what="the Warning event"
    )


def test_the_webhook_refuses_an_invalid_rljob_naming_the_fields(cluster: Cluster):
    spec = tiny_spec(
        env=[{"name": "HF_TOKEN", "value": "hf_secret"}],
        resources={"reward": {"replicas": 1, "minReplicas": 3, "maxReplicas": 2}},
    )
    with pytest.raises(ApiError) as refused:
        cluster.create("bad", spec)
    message = refusal(refused.value)
    assert "denied the request" in message
    assert "spec.env[0].name: HF_TOKEN looks like a credential" in message
    assert "spec.resources.reward.minReplicas: minReplicas (3) is above maxReplicas (2)" in message
    assert cluster.rljob("bad") is None


def test_the_webhook_refuses_a_cross_field_mistake_the_crd_schema_cannot_see(cluster: Cluster):
    with pytest.raises(ApiError) as refused:
        cluster.create("no-critic", tiny_spec(algorithm={"name": "ppo"}))
    assert "spec.models.critic: advantageEstimator gae (PPO) needs a critic" in refusal(refused.value)


def test_the_webhook_refuses_a_job_whose_checkpoints_would_stay_on_the_heads_disk(cluster: Cluster):
    spec = tiny_spec()
    del spec["checkpoint"]  # no claim, no object store: each rank's shards would stay on its own pod
    with pytest.raises(ApiError) as refused:
        cluster.create("no-storage", spec)
    assert "spec.checkpoint: on Kubernetes every trainer rank writes its checkpoint shards" in refusal(refused.value)
    assert cluster.rljob("no-storage") is None


def warnings_of_a_dry_run(cp: ControlPlane, manifest: dict[str, Any]) -> list[str]:
    """The Warning headers the API server sends back for a dry-run create (kubectl prints them as `Warning: ...`)."""
    path = names.rljob_path(manifest["metadata"]["namespace"]) + "?dryRun=All"
    headers = {"Authorization": f"Bearer {cp.token}", "Content-Type": "application/json"}
    request = urllib.request.Request(
        cp.server + path, data=json.dumps(manifest).encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(cp.ca_file))) as response:
        return response.headers.get_all("Warning") or []


def test_the_webhook_admits_a_path_no_pod_that_reads_it_mounts_with_a_warning_naming_it(
    cluster: Cluster, control_plane: ControlPlane
):
    # tiny_spec's prompts are at /data/train.jsonl, and no pod of the job mounts a volume at /data
    (warning,) = warnings_of_a_dry_run(control_plane, rljob_manifest("unmounted", cluster.ns, tiny_spec()))
    assert warning.startswith('299 - "spec.data.train: /data/train.jsonl is read on the head pods')
    mounted = {
        "head": {
            "podTemplate": {
                "spec": {
                    "containers": [{"name": "ray-head", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
                }
            }
        }
    }
    manifest = rljob_manifest("mounted", cluster.ns, tiny_spec(resources=mounted))
    assert warnings_of_a_dry_run(control_plane, manifest) == []


def test_the_webhook_refuses_an_invalid_edit(cluster: Cluster):
    cluster.create("editable", tiny_spec())
    with pytest.raises(ApiError) as refused:
        cluster.edit_spec("editable", {"env": [{"name": "API_KEY", "value": "oops"}]})
    assert "spec.env[0].name:" in refusal(refused.value)


def test_the_runtimes_status_fields_survive_the_operators_status_writes(cluster: Cluster):
    cluster.create("observed", tiny_spec())
    wait_for(lambda: "observed-0" in cluster.rayjobs(), what="RayJob observed-0")
    runtime_fields = {
        "progress": {"step": 5, "totalSteps": 60, "epoch": 0},
        "metrics": {"rewardMean": 0.5, "kl": 0.01},
        "lastCheckpoint": {"step": 5, "uri": "/checkpoints/step-5", "time": "2025-01-01T12:00:00Z"},
    }
    cluster.kube.call(
        "PATCH",
        names.rljob_path(cluster.ns, "observed") + "/status",
        body={"status": runtime_fields},
        content_type="application/merge-patch+json",
    )
    cluster.kuberay("observed-0", "Running", "RUNNING")
    status = cluster.wait_status("observed", phase="Running")
    assert {key: status[key] for key in runtime_fields} == runtime_fields
    cluster.kuberay("observed-0", "Complete", "SUCCEEDED")
    status = cluster.wait_status("observed", phase="Succeeded")
    assert {key: status[key] for key in runtime_fields} == runtime_fields
    managers = {
        entry["manager"]
        for entry in cluster.rljob("observed")["metadata"]["managedFields"]  # type: ignore[index]
        if entry.get("subresource", "status") == "status" and entry["operation"] == "Apply"
    }
    assert managers == {"kuberl-operator"}


def test_metrics_are_served(cluster: Cluster, operator: RunningOperator):
    cluster.create("measured", tiny_spec())
    cluster.wait_status("measured", phase="Starting")
    url = f"http://127.0.0.1:{operator.settings.metrics_port}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except urllib.error.URLError as error:  # pragma: no cover - a failure message, not a branch
        pytest.fail(f"no metrics at {url}: {error}")
    assert "kuberl_operator_reconciles_total" in text
    assert 'kuberl_operator_jobs{phase="Starting"}' in text


def test_the_active_deadline_fails_the_job_and_deletes_its_rayjob(cluster: Cluster):
    cluster.create("slow", tiny_spec(runPolicy={"activeDeadlineSeconds": 2}))
    wait_for(lambda: "slow-0" in cluster.rayjobs(), what="RayJob slow-0")
    status = cluster.wait_status("slow", phase="Failed", timeout=15)
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: cluster.rayjobs() == {}, what="the RayJob deleted")


def test_a_finished_job_is_deleted_when_its_ttl_is_up(cluster: Cluster):
    cluster.create("brief", tiny_spec(runPolicy={"ttlSecondsAfterFinished": 1}))
    wait_for(lambda: "brief-0" in cluster.rayjobs(), what="RayJob brief-0")
    cluster.kuberay("brief-0", "Complete", "SUCCEEDED")
    cluster.wait_status("brief", phase="Succeeded")
    wait_for(lambda: cluster.rljob("brief") is None, timeout=15, what="the RLJob deleted by its TTL")


def test_a_refused_rayjob_shows_the_api_servers_message_and_is_retried_until_it_goes_through(
    cluster: Cluster, control_plane: ControlPlane
):
    """A quota the RayJob does not fit: Created=False with the quota's words, one Warning, then created once lifted."""
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-rayjobs", "namespace": cluster.ns}}
    quotas = f"/api/v1/namespaces/{cluster.ns}/resourcequotas"
    control_plane.request("POST", quotas, {**quota, "spec": {"hard": {"count/rayjobs.ray.io": "0"}}})
    usage = {"hard": {"count/rayjobs.ray.io": "0"}, "used": {"count/rayjobs.ray.io": "0"}}
    current = control_plane.request("GET", f"{quotas}/no-rayjobs")  # the quota controller's job: it does not run here
    control_plane.request("PUT", f"{quotas}/no-rayjobs/status", {**current, "status": usage})
    cluster.create("squeezed", tiny_spec())

    def refused() -> dict[str, Any] | None:
        created = next((c for c in cluster.status("squeezed").get("conditions", []) if c["type"] == "Created"), None)
        return created if created and created["reason"] == "ApplyFailed" else None

    created = wait_for(refused, what="Created=False/ApplyFailed")
    assert created["status"] == "False"
    assert "RayJob squeezed-0" in created["message"] and "exceeded quota: no-rayjobs" in created["message"]
    wait_for(lambda: any(e["reason"] == "ApplyFailed" for e in cluster.events("squeezed")), what="the Warning event")
    time.sleep(3)  # retries meanwhile (after 1 s, then 2 s) bring no new Event
    warnings = [e for e in cluster.events("squeezed") if e["reason"] == "ApplyFailed"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    control_plane.request("DELETE", f"{quotas}/no-rayjobs")
    wait_for(lambda: "squeezed-0" in cluster.rayjobs(), timeout=30, what="the RayJob once the quota is gone")

    def created_true() -> dict[str, Any] | None:
        created = next((c for c in cluster.status("squeezed")["conditions"] if c["type"] == "Created"), None)
        return created if created and created["status"] == "True" else None

    assert wait_for(created_true, what="Created=True once the RayJob is seen")["reason"] == "RayJobCreated"


TYPO = "spec.algorithm.groupsize: unknown field (did you mean groupSize?)"


def test_a_typo_is_refused_for_a_create_as_helm_and_kubectl_create_send_it(cluster: Cluster):
    """The CRD keeps unknown fields (api/crd.py), so the webhook sees the typo the API server used to drop."""
    with pytest.raises(ApiError) as refused:
        cluster.create("typo", tiny_spec(algorithm={"groupsize": 4}))
    assert TYPO in refusal(refused.value)
    assert cluster.rljob("typo") is None


def test_a_typo_is_refused_for_a_server_side_apply(cluster: Cluster):
    manifest = rljob_manifest("typo-ssa", cluster.ns, tiny_spec(algorithm={"groupsize": 4}))
    with pytest.raises(ApiError) as refused:
        cluster.kube.apply(names.rljob_path(cluster.ns, "typo-ssa"), manifest)
    assert TYPO in refusal(refused.value)
    assert cluster.rljob("typo-ssa") is None


def test_a_typo_is_refused_in_an_edit_and_beside_the_spec(cluster: Cluster):
    cluster.create("typo-edit", tiny_spec())
    with pytest.raises(ApiError) as refused:
        cluster.edit_spec("typo-edit", {"runPolicy": {"maxRestart": 2}})
    assert "spec.runPolicy.maxRestart: unknown field (did you mean maxRestarts?)" in refusal(refused.value)
    misplaced = rljob_manifest("typo-top", cluster.ns, tiny_spec())
    misplaced["runPolicy"] = {"suspend": True}  # indented one level too little: beside spec, not in it
    with pytest.raises(ApiError) as refused:
        cluster.kube.create(names.rljob_path(cluster.ns), misplaced)
    assert "runPolicy: unknown field" in refusal(refused.value)


def test_a_typo_an_older_crd_dropped_is_reported_as_unknown_fields(cluster: Cluster):
    """A job stored before the CRD kept unknown fields: what `kubectl apply` applied (its last-applied annotation)
    holds the typo, the stored spec does not."""
    applied = rljob_manifest("typo-old", cluster.ns, tiny_spec(algorithm={"groupsize": 4}))
    stored = rljob_manifest("typo-old", cluster.ns, tiny_spec(algorithm={}))
    stored["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied)}
    cluster.kube.create(names.rljob_path(cluster.ns), stored)

    def unknown_fields() -> dict[str, Any] | None:
        return next((c for c in cluster.status("typo-old").get("conditions", []) if c["type"] == "UnknownFields"), None)

    condition = wait_for(unknown_fields, what="the UnknownFields condition")
    assert condition["status"] == "True" and "spec.algorithm.groupsize" in condition["message"]
    warned = wait_for(lambda: [e["type"] for e in cluster.events("typo-old") if e["reason"] == "FieldsPruned"])
    assert warned == ["Warning"]


def test_a_configmap_or_rayjob_with_a_jobs_name_that_is_not_its_own_is_left_alone(
    cluster: Cluster, control_plane: ControlPlane
):
    """Objects someone made with the names a job would use: never changed, and the job says why it waits."""
    ns = cluster.ns
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "squatted-spec"}, "data": {"a": "b"}}
    control_plane.request("POST", names.configmap_path(ns), configmap)
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "taken-0"}, "spec": {"entrypoint": "x"}}
    control_plane.request("POST", names.rayjob_path(ns), rayjob)
    before = {
        "squatted-spec": control_plane.request("GET", names.configmap_path(ns, "squatted-spec")),
        "taken-0": control_plane.request("GET", names.rayjob_path(ns, "taken-0")),
    }
    cluster.create("squatted", tiny_spec())
    cluster.create("taken", tiny_spec())

    def created(job: str) -> dict[str, Any] | None:
        found = next((c for c in cluster.status(job).get("conditions", []) if c["type"] == "Created"), None)
        return found if found and found["status"] == "False" else None

    assert wait_for(lambda: created("squatted"), what="squatted waits")["reason"] == "NameTaken"
    taken = wait_for(lambda: created("taken"), what="taken waits")
    assert taken["reason"] == "ApplyFailed" and "RayJob named taken-0 exists and does not belong" in taken["message"]
    after = {
        "squatted-spec": control_plane.request("GET", names.configmap_path(ns, "squatted-spec")),
        "taken-0": control_plane.request("GET", names.rayjob_path(ns, "taken-0")),
    }
    for name, obj in after.items():  # not one write: same version, no owner reference, no label added
        assert obj["metadata"]["resourceVersion"] == before[name]["metadata"]["resourceVersion"], name
        assert "ownerReferences" not in obj["metadata"] and "labels" not in obj["metadata"], name
    assert cluster.rayjobs().keys() == {"taken-0"}  # and nothing was created for squatted
