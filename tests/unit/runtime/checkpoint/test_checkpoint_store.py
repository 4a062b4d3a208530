"""The checkpoint commit protocol on a local folder and on an object store, the save policy, SIGTERM,
and the status publisher that reports the last checkpoint on the RLJob.

No ranks here: a "rank's save" is a fake DCP folder (`actor/.metadata` and a shard), which is
all the store looks at. The object-store cases run on fsspec's in-memory filesystem, which has
no atomic rename, so they exercise the marker commit that S3 uses.
"""

import http.server
import json
import logging
import os
import signal
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import yaml

from kuberl.api.spec import CheckpointSpec
from kuberl.runtime.checkpoint import CheckpointError, CheckpointStore, PreemptionWatcher, should_save
from kuberl.runtime.checkpoint.policy import Start, start_from
from kuberl.runtime.checkpoint.preemption import RAY_JOB_MARKER_ENV, save_outlook, stop_window_seconds
from kuberl.runtime.checkpoint.storage import Location, storage_options
from kuberl.runtime.checkpoint.store import JOB_MANIFEST, LATEST, MARKER, TRAIN_STATE
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher, StatusPublisher, status_metrics

JOB = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "demo"}}


@pytest.fixture(params=["local", "object-store"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "ckpt")
        return
    memory = fsspec.filesystem("memory")
    folder = f"/{tmp_path.name}"  # unique per test: the in-memory filesystem is one per process
    yield f"memory://{folder}"
    if memory.exists(folder):
        memory.rm(folder, recursive=True)


def fake_rank_save(location: str, payload: bytes = b"shard") -> None:
    """What the ranks' save_trainer_state leaves: DCP metadata, one shard, one rank file."""
    folder = Location(location).child("actor")
    folder.makedirs()
    folder.child(".metadata").write_bytes(b"dcp metadata")
    folder.child("__0_0.distcp").write_bytes(payload)
    folder.child("rank-00000.pt").write_bytes(b"rng")


def save(store: CheckpointStore, step: int) -> str:
    location = store.begin(step)
    fake_rank_save(location)
    return store.commit(location, step, {"epoch": 0, "history": [{"step": step}]}, JOB).uri


def steps(store: CheckpointStore) -> list[int]:
    return [step for step, _ in store.checkpoints()]


# -- commit -------------------------------------------------------------------------------------------
def test_committed_checkpoint_is_the_latest_with_its_train_state(root: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    ref = store.latest()
    assert ref is not None and ref.step == 10 and ref.uri.endswith("step-000010")
    assert store.load_train_state(ref) == {"epoch": 0, "history": [{"step": 10}], "step": 10}
    assert yaml.safe_load(Location(ref.uri).child(JOB_MANIFEST).read_bytes()) == JOB


def test_a_save_is_invisible_until_commit(root: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    fake_rank_save(store.begin(20))
    assert store.latest().step == 10


def test_latest_pointer_names_the_newest_commit(root: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    save(store, 20)
    assert store.root.child(LATEST).read_bytes() == b"step-000020\n"


def test_local_save_in_progress_lives_in_a_tmp_folder_until_renamed(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), keep_last=3)
    location = store.begin(20)
    assert Path(location).name.startswith("step-000020.tmp-")
    fake_rank_save(location)
    store.commit(location, 20, {}, JOB)
    assert not Path(location).exists() and (tmp_path / "step-000020" / MARKER).is_file()


def test_commit_without_any_model_state_is_refused(root: str):
    store = CheckpointStore(root, keep_last=3)
    with pytest.raises(CheckpointError, match="save_trainer_state"):
        store.commit(store.begin(10), 10, {}, JOB)


def test_commit_of_a_failed_rank_save_without_dcp_metadata_is_refused(root: str):
    store = CheckpointStore(root, keep_last=3)
    location = store.begin(10)
    Location(location).child("actor", "__0_0.distcp").write_bytes(b"half")
    with pytest.raises(CheckpointError, match="actor has no DCP .metadata"):
        store.commit(location, 10, {}, JOB)


def test_saving_a_step_that_is_already_committed_is_refused(root: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    with pytest.raises(CheckpointError, match="already holds a committed checkpoint of step 10"):
        store.begin(10)


# -- validation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: c.child(MARKER).remove(), "no COMPLETE marker"),
        (lambda c: c.child(MARKER).write_bytes(b"{not json"), "COMPLETE marker is unreadable"),
        (lambda c: c.child("actor", ".metadata").remove(), "actor/.metadata is missing"),
        (lambda c: c.child("actor", ".metadata").write_bytes(b"dcp metadatX"), "actor/.metadata is corrupt"),
        (lambda c: c.child("actor", "__0_0.distcp").write_bytes(b"sh"), "__0_0.distcp has 2 bytes"),
        (lambda c: c.child(TRAIN_STATE).write_bytes(b"{"), "train_state.json"),
    ],
    ids=["no-marker", "corrupt-marker", "no-metadata", "corrupt-metadata", "truncated-shard", "bad-train-state"],
)
def test_damaged_newest_checkpoint_is_skipped_with_a_warning(root: str, caplog, damage, reason: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    newest = save(store, 20)
    damage(Location(newest))
    with caplog.at_level(logging.WARNING, logger="kuberl.runtime.checkpoint.store"):
        ref = store.latest()
    assert ref is not None and ref.step == 10
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert newest in warning and reason in warning


def save_two_ranks(store: CheckpointStore, step: int) -> str:
    """A checkpoint whose DCP save spans two ranks: rank 1's shard is a file of its own."""
    location = store.begin(step)
    fake_rank_save(location)
    Location(location).child("actor", "__1_0.distcp").write_bytes(b"rank 1 shard")
    return store.commit(location, step, {"epoch": 0}, JOB).uri


def test_a_checkpoint_missing_a_shard_its_marker_lists_never_becomes_latest_nor_costs_the_good_one(root: str, caplog):
    store = CheckpointStore(root, keep_last=2)
    save_two_ranks(store, 10)
    damaged = save_two_ranks(store, 20)
    Location(damaged).child("actor", "__1_0.distcp").remove()  # a lost upload, or a hand-deleted file
    with caplog.at_level(logging.WARNING, logger="kuberl.runtime.checkpoint.store"):
        assert store.latest().step == 10
    assert any(damaged in r.getMessage() and "actor/__1_0.distcp is missing" in r.getMessage() for r in caplog.records)
    save_two_ranks(store, 30)  # keepLast 2 counts 30 and the good 10; the damaged 20 is not one of them
    assert steps(store) == [10, 20, 30]
    Location(store.latest().uri).child(MARKER).remove()
    assert store.latest().step == 10  # the good fallback is still there


def test_no_checkpoint_at_all_is_none(root: str):
    assert CheckpointStore(root, keep_last=3).latest() is None


def test_marker_of_another_step_is_not_trusted(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), keep_last=3)
    save(store, 10)
    os.rename(tmp_path / "step-000010", tmp_path / "step-000030")  # e.g. a hand copy under the wrong name
    assert store.latest() is None


def test_saving_a_step_again_replaces_an_unusable_checkpoint_of_that_step(root: str):
    store = CheckpointStore(root, keep_last=3)
    damaged = save(store, 10)
    Location(damaged).child("actor", ".metadata").remove()
    save(store, 10)
    assert store.latest().step == 10


# -- retention ------------------------------------------------------------------------------------------
def test_keep_last_keeps_the_newest_k(root: str):
    store = CheckpointStore(root, keep_last=2)
    for step in (10, 20, 30, 40):
        save(store, step)
    assert steps(store) == [30, 40]


def test_keep_last_one_keeps_the_newest_commit(root: str):
    store = CheckpointStore(root, keep_last=1)
    save(store, 10)
    save(store, 20)
    assert steps(store) == [20] and store.latest().step == 20


def test_retention_counts_only_valid_checkpoints_and_keeps_a_fallback(root: str):
    store = CheckpointStore(root, keep_last=2)
    save(store, 10)
    Location(save(store, 20)).child("actor", ".metadata").write_bytes(b"rot")
    save(store, 30)
    # step 20 does not count: 30 and the valid 10 are the two kept (20 is left alone: maybe only unreadable now)
    assert steps(store) == [10, 20, 30]
    Location(store.latest().uri).child(MARKER).remove()
    assert store.latest().step == 10


# -- start-up cleaning ------------------------------------------------------------------------------------
def test_opening_leaves_a_crashed_save_and_remove_unfinished_removes_it_keeping_the_commits(root: str):
    store = CheckpointStore(root, keep_last=3)
    save(store, 10)
    crashed = store.begin(20)
    fake_rank_save(crashed)
    reopened = CheckpointStore(root, keep_last=3)
    assert Location(crashed).exists()  # perhaps another job's save in progress: checkpointing.py decides
    reopened.remove_unfinished()
    assert not Location(crashed).exists()
    assert reopened.latest().step == 10 and steps(reopened) == [10]


def test_reopening_keeps_a_committed_but_damaged_checkpoint_for_inspection(root: str):
    store = CheckpointStore(root, keep_last=3)
    damaged = save(store, 10)
    Location(damaged).child("actor", ".metadata").remove()
    CheckpointStore(root, keep_last=3).remove_unfinished()
    assert Location(damaged).exists()


# -- storage options ------------------------------------------------------------------------------------------
def test_s3_endpoint_comes_from_aws_endpoint_url():
    options = storage_options("s3://bucket/ckpt", {"AWS_ENDPOINT_URL": "http://minio:9000"})
    assert options["client_kwargs"] == {"endpoint_url": "http://minio:9000"}


def test_local_paths_need_no_storage_options():
    assert storage_options("/checkpoints/job", {"AWS_ENDPOINT_URL": "http://minio:9000"}) == {}


# -- policy --------------------------------------------------------------------------------------------
EVERY_10 = CheckpointSpec(interval_steps=10)
EVERY_5_MIN = CheckpointSpec(interval_steps=None, interval_minutes=5)
BOTH = CheckpointSpec(interval_steps=10, interval_minutes=5)
NO_PREEMPTION_SAVE = CheckpointSpec(interval_steps=10, save_on_preemption=False)


@pytest.mark.parametrize(
    ("step", "last_step", "last_time", "now", "spec", "final", "preempted", "expected"),
    [
        (10, None, 0.0, 1.0, EVERY_10, False, False, True),  # on the step interval
        (11, 10, 0.0, 1.0, EVERY_10, False, False, False),  # between intervals
        (20, 17, 0.0, 1.0, EVERY_10, False, False, True),  # a save at 17 does not shift the schedule
        (10, 10, 0.0, 1.0, EVERY_10, False, False, False),  # already saved this step
        (10, 10, 0.0, 1.0, EVERY_10, True, True, False),  # ... even when final or preempted
        (0, None, 0.0, 1.0, EVERY_10, True, False, False),  # nothing trained yet
        (7, 0, 0.0, 299.0, EVERY_5_MIN, False, False, False),  # 4 min 59 s since the last save
        (7, 0, 0.0, 300.0, EVERY_5_MIN, False, False, True),  # 5 min since the last save
        (7, 0, 100.0, 399.0, BOTH, False, False, False),  # neither interval reached
        (7, 0, 100.0, 400.0, BOTH, False, False, True),  # the time interval alone
        (7, 0, 0.0, 1.0, EVERY_10, False, True, True),  # preempted: save now
        (7, 0, 0.0, 1.0, NO_PREEMPTION_SAVE, False, True, False),  # preempted, but told not to save
        (7, 0, 0.0, 1.0, EVERY_10, True, False, True),  # the last step always saves
        (7, 0, 0.0, 1.0, CheckpointSpec(interval_steps=None), False, False, False),  # no interval at all
    ],
)
def test_should_save(step, last_step, last_time, now, spec, final, preempted, expected):
    assert should_save(step, last_step, last_time, now, spec, final=final, preempted=preempted) is expected


# -- preemption --------------------------------------------------------------------------------------------
def test_sigterm_sets_the_preemption_flag_instead_of_killing():
    with PreemptionWatcher() as watcher:
        assert not watcher.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.requested and watcher.signal_name == "SIGTERM"


def test_the_stop_window_is_rays_only_inside_a_ray_job():
    assert stop_window_seconds({}) is None  # kuberl run: no SIGKILL follows
    assert stop_window_seconds({RAY_JOB_MARKER_ENV: "{}"}) == 3.0  # Ray's default
    assert stop_window_seconds({RAY_JOB_MARKER_ENV: "{}", "RAY_JOB_STOP_WAIT_TIME_S": "120"}) == 120.0


@pytest.mark.parametrize(
    ("window", "elapsed", "save_seconds", "expected"),
    [
        (None, 500.0, 60.0, None),  # locally nothing kills the save
        (120.0, 30.0, 60.0, None),  # 90 s left, a save takes 60
        (120.0, 80.0, 60.0, "40 s of the 120 s stop window are left and the last save took 60 s"),
        (120.0, 30.0, None, None),  # no save timed yet: no guess
        (3.0, 9.0, None, "the stop window (3 s) is already over"),
    ],
)
def test_the_save_outlook_warns_only_when_the_save_is_unlikely_to_fit(window, elapsed, save_seconds, expected):
    warning = save_outlook(window, elapsed, save_seconds, committed=40)
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and expected in warning and "resumes from step 40" in warning


def test_a_sigterm_late_in_the_window_is_warned_about_before_the_save(caplog: pytest.LogCaptureFixture):
    with PreemptionWatcher(window_seconds=3.0) as watcher:
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.received_at is not None
        watcher.received_at -= 2.5  # the step under way ended 2.5 s after the signal
        with caplog.at_level(logging.WARNING):
            watcher.warn_if_the_save_may_not_fit(save_seconds=4.0, committed=None)
    assert "Ray kills this driver 3 s after it" in caplog.text
    assert "likely cut off by SIGKILL, and the job starts again from step 0" in caplog.text


def test_closing_the_watcher_restores_the_previous_handler():
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, _frame: seen.append(number))
    try:
        with PreemptionWatcher():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_marker_records_every_file_size(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), keep_last=3)
    marker = json.loads((Path(save(store, 10)) / MARKER).read_text())
    assert marker["step"] == 10 and marker["states"] == ["actor"]
    assert marker["files"]["actor/__0_0.distcp"] == {"size": 5}
    assert set(marker["files"]) == {
        "actor/.metadata",
        "actor/__0_0.distcp",
        "actor/rank-00000.pt",
        "train_state.json",
        "job.yaml",
    }


# -- status publisher (runtime/report/status_publisher.py) ------------------------------------------------------
# It lives with the checkpoint because it publishes status.lastCheckpoint among the progress fields.
class RecordingApiServer:
    """A loopback HTTP server that records each request and answers 200 (or `status`)."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                recorder.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")
                recorder.arrived.set()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api_server() -> Iterator[RecordingApiServer]:
    server = RecordingApiServer()
    yield server
    server.close()


def publisher_for(server: RecordingApiServer, tmp_path: Path, **kwargs: Any) -> KubernetesStatusPublisher:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    return KubernetesStatusPublisher("demo", "team-a", server.url, token, None, **kwargs)


PROGRESS = {"step": 20, "totalSteps": 100, "epoch": 1, "etaSeconds": 412.5}
METRICS = {"rewardMean": 0.62, "kl": 0.013, "responseLength": 87.0, "tokensPerSecond": 1530.0}
LAST = {"step": 20, "uri": "s3://ckpt/demo/step-000020", "time": "2026-03-01T12:00:00Z"}


def test_publish_server_side_applies_the_jobs_report_configmap(api_server: RecordingApiServer, tmp_path: Path):
    publisher = publisher_for(api_server, tmp_path)
    publisher.publish(PROGRESS, METRICS, LAST)
    publisher.close()
    (request,) = api_server.requests
    assert (
        request["path"] == "/api/v1/namespaces/team-a/configmaps/demo-progress?fieldManager=kuberl-runtime&force=true"
    )
    assert request["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert request["headers"]["Authorization"] == "Bearer sa-token"


def report_of(request: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(request["body"]["data"]["report.json"]))


def test_publish_writes_only_progress_metrics_and_last_checkpoint(api_server: RecordingApiServer, tmp_path: Path):
    publisher = publisher_for(api_server, tmp_path)
    publisher.publish(PROGRESS, METRICS, LAST)
    publisher.close()
    body = api_server.requests[0]["body"]
    assert {key: body[key] for key in ("apiVersion", "kind", "metadata")} == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-progress", "namespace": "team-a"},
    }
    assert report_of(api_server.requests[0]) == {"progress": PROGRESS, "metrics": METRICS, "lastCheckpoint": LAST}


def test_publish_without_a_checkpoint_leaves_last_checkpoint_out(api_server: RecordingApiServer, tmp_path: Path):
    publisher = publisher_for(api_server, tmp_path)
    publisher.publish({"step": 3}, {}, None)
    publisher.close()
    assert report_of(api_server.requests[0]) == {"progress": {"step": 3, "epoch": 0}, "metrics": {}}


def test_the_latest_validation_goes_with_every_apply_after_it(api_server: RecordingApiServer, tmp_path: Path):
    # each report replaces the last one whole: the scores must ride along until new ones replace them
    scores = {"step": 2, "samples": 4, "greedyMean": 0.5, "meanAtK": 0.25, "passAtK": 1.0, "majAtK": 0.5}
    publisher = publisher_for(api_server, tmp_path, min_interval=0.0)
    for step, validation in ((1, None), (2, scores), (3, None)):
        publisher.publish({"step": step}, {}, None, validation)
        assert api_server.arrived.wait(5.0)
        api_server.arrived.clear()
    publisher.close()
    sent = [report_of(r).get("validation") for r in api_server.requests]
    assert sent == [None, scores, scores]


def test_publishing_faster_than_the_interval_sends_only_the_newest(api_server: RecordingApiServer, tmp_path: Path):
    publisher = publisher_for(api_server, tmp_path, min_interval=60.0)
    publisher.publish({"step": 1}, {}, None)
    assert api_server.arrived.wait(5.0)
    for step in (2, 3, 4):
        publisher.publish({"step": step}, {}, None)
    publisher.close()  # flushes the pending one at once
    assert [report_of(r)["progress"]["step"] for r in api_server.requests] == [1, 4]


def test_an_unreachable_api_server_is_logged_not_raised(tmp_path: Path, caplog):
    token = tmp_path / "token"
    token.write_text("t")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    publisher = KubernetesStatusPublisher("demo", "team-a", dead, token, None, request_timeout=2.0)
    with caplog.at_level(logging.WARNING, logger="kuberl.runtime.report.status_publisher"):
        publisher.publish({"step": 1}, {}, None)
        publisher.close()
    assert any("could not publish progress to RLJob team-a/demo" in r.getMessage() for r in caplog.records)


def test_metric_names_of_the_controller_map_to_status_fields():
    step = {"reward/mean": 0.5, "kl/mean": 0.01, "response/length_mean": 40.0, "time/step": 3.0}
    assert status_metrics(step) == {"rewardMean": 0.5, "kl": 0.01, "responseLength": 40.0}


def test_outside_kubernetes_the_publisher_does_nothing(tmp_path: Path):
    publisher = StatusPublisher.from_environment({}, service_account_dir=tmp_path)
    assert type(publisher) is StatusPublisher
    publisher.publish(PROGRESS, METRICS, None)  # and it does not fail


def test_in_a_pod_the_publisher_targets_the_in_cluster_api_server(tmp_path: Path):
    (tmp_path / "token").write_text("t")
    certificate = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    if not certificate.is_file():
        pytest.skip("no CA bundle on this machine to stand in for the service account's ca.crt")
    (tmp_path / "ca.crt").write_bytes(certificate.read_bytes())
    env = {
        "KUBERL_JOB_NAME": "demo",
        "KUBERL_JOB_NAMESPACE": "team-a",
        "KUBERL_STATUS_CONFIGMAP": "demo-progress",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    publisher = StatusPublisher.from_environment(env, service_account_dir=tmp_path)
    assert isinstance(publisher, KubernetesStatusPublisher)
    assert publisher.url.startswith("https://10.96.0.1:443/api/v1/namespaces/team-a/configmaps/demo-progress?")
    publisher.close()
    # a worker pod (no KUBERL_STATUS_CONFIGMAP, and no token: the operator mounts it in the head pod only)
    del env["KUBERL_STATUS_CONFIGMAP"]
    assert type(StatusPublisher.from_environment(env, service_account_dir=tmp_path)) is StatusPublisher


# -- where a run starts -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("has_checkpoint", "resume", "restart", "start"),
    [
        (False, True, False, Start.FRESH),
        (False, False, True, Start.FRESH),  # a restart before the first save starts over
        (True, True, False, Start.RESUME),
        (True, False, False, Start.REFUSE),  # resume: false never starts over saved work
        (True, False, True, Start.RESUME),  # --resume: a restart of the same run resumes anyway
        (True, True, True, Start.RESUME),
    ],
)
def test_where_a_run_starts(has_checkpoint: bool, resume: bool, restart: bool, start: Start):
    assert start_from(has_checkpoint, CheckpointSpec(resume=resume), restart) == start
