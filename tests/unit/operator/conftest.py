"""Builders of RLJob / RayJob dicts as the API server returns them, and a tiny in-memory cluster.

`World` applies a Decision the way `Reconciler.act` does (status first, then deletions, then
children), so multi-pass scenarios — a failure, the backoff, the restart — run as pure functions
of the clock, and a crash is a Decision applied only in part.
"""

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kuberl.operator.access import KubeRayPeer
from kuberl.operator.decide import Decision, Observed, decide
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.status import status_manifest

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "0d6f1c1e-0000-4000-8000-000000000001"
#: Where the tests' KubeRay runs (the operator requires its namespace: KUBERL_KUBERAY_NAMESPACE).
KUBERAY = KubeRayPeer(namespace="kuberay-system")
#: The environment variables the operator requires (OperatorSettings.from_env).
REQUIRED_ENV = {"KUBERL_KUBERAY_NAMESPACE": "kuberay-system"}
SETTINGS = OperatorSettings(runtime_image="registry.test/kuberl-runtime:1.0", kuberay=KUBERAY)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def base_spec() -> dict[str, Any]:
    return {
        "models": {"actor": {"path": "hf://org/actor"}},
        "data": {"train": "/data/train.jsonl"},
        "reward": {"function": "math_exact"},
        "runPolicy": {"maxRestarts": 2, "backoffSeconds": 10},
    }


def make_rljob(
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    *,
    name: str = "tiny-grpo",
    generation: int = 1,
    uid: str = UID,
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "generation": generation,
            "resourceVersion": "100",
        },
        "spec": base_spec() if spec is None else spec,
    }
    if status is not None:
        job["status"] = status
    return job


def with_rayjob_status(rayjob: dict[str, Any], deployment: str, job_status: str = "", **extra: Any) -> dict[str, Any]:
    moved = copy.deepcopy(rayjob)
    moved["status"] = {"jobDeploymentStatus": deployment, **({"jobStatus": job_status} if job_status else {}), **extra}
    return moved


@dataclass
class World:
    """One RLJob and its children, changed only by applying Decisions (and by the test, playing KubeRay)."""

    rljob: dict[str, Any]
    rayjobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    configmap: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None  # the ConfigMap the runtime reports into
    access: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) of the rest
    deleted: bool = False
    kuberay_missing: bool = False
    history: list[Decision] = field(default_factory=list)
    #: RayJobs whose deletion does not finish (their pods still stop): deleted, they stay, marked for deletion
    pods_stopping: set[str] = field(default_factory=set)

    def observed(self) -> Observed:
        if self.kuberay_missing:
            return Observed(rljob=self.rljob, kuberay_missing=True)
        return Observed(
            rljob=self.rljob, rayjobs=tuple(self.rayjobs.values()), configmap=self.configmap, progress=self.progress
        )

    def step(self, now: datetime, *, crash_after_status: bool = False) -> Decision:
        decision = decide(self.observed(), now, SETTINGS)
        self.history.append(decision)
        if decision.write_status:
            self.rljob["status"] = status_manifest(decision.status)
        if crash_after_status:
            return decision
        for name in decision.delete_rayjobs:  # foreground: gone once its pods are
            if name in self.pods_stopping and name in self.rayjobs:
                self.rayjobs[name]["metadata"]["deletionTimestamp"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            else:
                self.rayjobs.pop(name, None)
        for child in decision.apply:
            kind, name = child["kind"], child["metadata"]["name"]
            if kind == "ConfigMap" and name.endswith("-progress"):
                self.progress = self.progress or child
            elif kind == "ConfigMap":
                self.configmap = child
            elif kind == "RayJob":
                self.rayjobs.setdefault(name, child)
            else:
                self.access.setdefault((kind, name), child)
        self.deleted = self.deleted or decision.delete_rljob
        return decision

    def kuberay(self, name: str, deployment: str, job_status: str = "", **extra: Any) -> None:
        self.rayjobs[name] = with_rayjob_status(self.rayjobs[name], deployment, job_status, **extra)

    def edit_spec(self, change: dict[str, Any]) -> None:
        """A user's edit: deep-merge `change` into spec and bump metadata.generation."""

        def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
            for key, value in new.items():
                if isinstance(value, dict) and isinstance(into.get(key), dict):
                    merge(into[key], value)
                else:
                    into[key] = value

        merge(self.rljob["spec"], change)
        self.rljob["metadata"]["generation"] += 1

    @property
    def status(self) -> dict[str, Any]:
        return self.rljob.get("status") or {}

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions", []) if c["type"] == kind), None)


@pytest.fixture
def world() -> World:
    return World(rljob=make_rljob())


class ManualClock:
    """A monotonic clock the test moves by hand (`clock.now = ...`), for code that takes a `clock` callable."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
