"""charts/kuberl/argocd/rljob-health.lua, run by Lua 5.1 (Argo CD's gopher-lua speaks 5.1) through lupa.

Argo CD runs the script with the live object as the global `obj` and reads the returned table's
`status` and `message`. Needs lupa (the `dev` extra); skipped without it.
"""

from typing import Any

import pytest

from tests.unit.chart.rendering import CHART

lua51 = pytest.importorskip("lupa.lua51")

SCRIPT = (CHART / "argocd" / "rljob-health.lua").read_text()


def health(rljob: dict[str, Any]) -> dict[str, str]:
    """What Argo CD shows for this RLJob."""
    lua = lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(rljob, recursive=True)
    return dict(lua.execute(SCRIPT))


def rljob(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "tiny-grpo", "generation": generation},
    }
    if status is not None:
        job["status"] = status
    return job


def condition(kind: str, status: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "Test", "message": message}


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("Succeeded", "Healthy"),
        ("Pending", "Progressing"),
        ("Starting", "Progressing"),
        ("Running", "Progressing"),
        ("Restarting", "Progressing"),
        ("Failed", "Degraded"),
        ("Suspended", "Suspended"),
        ("Queued", "Suspended"),
    ],
)
def test_phase_maps_to_argocd_health(phase: str, expected: str):
    assert health(rljob({"phase": phase, "observedGeneration": 1}))["status"] == expected


def test_a_queued_job_says_where_it_waits():
    message = "RayJob tiny-grpo-0 waits in Kueue queue team-a for admission"
    status = {"phase": "Queued", "observedGeneration": 1, "conditions": [condition("Queued", "True", message)]}
    assert health(rljob(status)) == {"status": "Suspended", "message": message}


def test_job_without_status_is_progressing():
    assert health(rljob(None))["status"] == "Progressing"


def test_status_without_phase_is_progressing():
    assert health(rljob({"conditions": []}))["status"] == "Progressing"


def test_status_of_an_older_generation_is_progressing_even_when_succeeded():
    result = health(rljob({"phase": "Succeeded", "observedGeneration": 1}, generation=2))
    assert result == {"status": "Progressing", "message": "Waiting for the operator to act on generation 2"}


def test_failed_job_shows_the_failed_condition_message():
    status = {"phase": "Failed", "conditions": [condition("Failed", "True", "restarts exhausted (3 of 3)")]}
    assert health(rljob(status)) == {"status": "Degraded", "message": "restarts exhausted (3 of 3)"}


def test_refused_spec_change_of_a_running_job_is_degraded():
    status = {
        "phase": "Running",
        "conditions": [
            condition("Running", "True", "training"),
            condition("SpecChangeRefused", "True", "spec.models.actor.path changed"),
        ],
    }
    assert health(rljob(status)) == {
        "status": "Degraded",
        "message": "Spec change refused: spec.models.actor.path changed",
    }


def test_running_job_shows_its_progress():
    status = {"phase": "Running", "progress": {"step": 12, "totalSteps": 60}}
    assert health(rljob(status)) == {"status": "Progressing", "message": "Phase Running, step 12/60"}


def test_unknown_phase_is_unknown():
    assert health(rljob({"phase": "Exploded"}))["status"] == "Unknown"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("InvalidSpec", "spec.models.critic: advantageEstimator gae (PPO) needs a critic"),
        ("ApplyFailed", "the API server refused RayJob j-0: exceeded quota: gpus"),
        ("KubeRayMissing", "the API server does not know RayJobs (ray.io/v1): install KubeRay"),
    ],
)
def test_a_job_that_cannot_start_is_degraded_not_progressing_forever(reason: str, message: str):
    status = {
        "phase": "Pending",
        "observedGeneration": 1,
        "conditions": [{**condition("Created", "False", message), "reason": reason}],
    }
    assert health(rljob(status)) == {"status": "Degraded", "message": f"Cannot start ({reason}): {message}"}


def test_a_created_job_is_progressing():
    status = {
        "phase": "Starting",
        "observedGeneration": 1,
        "conditions": [condition("Created", "True", "created RayJob j-0")],
    }
    assert health(rljob(status))["status"] == "Progressing"
