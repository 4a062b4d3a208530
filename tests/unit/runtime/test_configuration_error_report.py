"""A job that cannot run as specified says so in its report, so the operator does not restart it.

`kuberl.runtime` in a pod: a configuration error (here a training file that does not exist) is found
before anything starts; the report the runtime applies to its ConfigMap names the RayJob (from
`--rayjob`) and the error, and the runtime exits with ExitCode.CONFIG_ERROR. The API server is the
loopback recorder of the publisher's own tests; decide.py's side is tests/unit/operator/test_decide.py.
"""

import json

import pytest
import yaml

from kuberl.api.contract import ExitCode, RuntimeArgs
from kuberl.api.status import REPORT_KEY
from kuberl.runtime import main
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher, StatusPublisher
from tests.conftest import REPO
from tests.unit.runtime.checkpoint.test_checkpoint_store import RecordingApiServer


@pytest.fixture
def api_server(monkeypatch: pytest.MonkeyPatch):
    server = RecordingApiServer()

    def in_the_head_pod(*, rayjob: str | None = None) -> StatusPublisher:
        return KubernetesStatusPublisher("tiny-grpo", "rl", server.url, None, None, min_interval=0.0, rayjob=rayjob)

    monkeypatch.setattr(StatusPublisher, "from_environment", staticmethod(in_the_head_pod))
    yield server
    server.close()


def test_a_missing_training_file_is_reported_as_a_configuration_error_of_this_rayjob(api_server, tmp_path):
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    manifest["spec"]["data"]["train"] = str(tmp_path / "nowhere.jsonl")
    spec = tmp_path / "rljob.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    code = main.run_from_cli(RuntimeArgs(spec=str(spec), output=str(tmp_path / "out"), rayjob="tiny-grpo-3"))
    assert code == ExitCode.CONFIG_ERROR
    (request,) = api_server.requests
    report = json.loads(request["body"]["data"][REPORT_KEY])
    assert report["rayjob"] == "tiny-grpo-3"
    error = report["configurationError"]
    assert error.startswith("spec.data.train: ") and "nowhere.jsonl" in error
