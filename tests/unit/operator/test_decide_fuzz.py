"""Property: `decide()` answers every valid RLJob at every time: it never raises and never asks for a
pass at a time that is not a number of seconds from now.

A pass that raises raises again on the next pass, forever (the RLJob, its status and the clock barely
change between passes), so one job could never be reconciled again. The runPolicy values come from the
whole range the schema admits (its bounds are read from the model, so a new field or bound is fuzzed
too); the status times from the whole range RFC 3339 can write, with offsets; the RayJobs in every state
KubeRay reports.
"""

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import annotated_types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberl.api.enums import TERMINAL_PHASES, ConditionReason, ConditionType, Phase
from kuberl.api.limits import MAX_DURATION_SECONDS
from kuberl.api.spec import RunPolicy
from kuberl.operator.builders import Owner, build_configmap
from kuberl.operator.decide import Observed, decide
from tests.unit.operator.conftest import SETTINGS, UID, base_spec, make_rljob

NAME = "fuzz"
DEPLOYMENT_STATUSES = [
    *("", "New", "Initializing", "Running", "Complete", "Failed", "Suspended", "Retrying", "Waiting"),
    "ValidationFailed",
]
JOB_STATUSES = ["", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]


def _bound(field: Any, kind: type) -> Any:
    return next((getattr(m, kind.__name__.lower()) for m in field.metadata if isinstance(m, kind)), None)


#: What an unbounded integer field would let the API server store (int64 holds more still).
UNBOUNDED = 10**15


def field_values(name: str, field: Any) -> st.SearchStrategy[Any]:
    """Every value RunPolicy's field admits: booleans, or integers between its bounds (and null if optional)."""
    if field.annotation is bool:
        return st.booleans()
    low, high = _bound(field, annotated_types.Ge) or 0, _bound(field, annotated_types.Le) or UNBOUNDED
    values = st.integers(min_value=low, max_value=high) | st.sampled_from([low, high])
    return values | st.none() if field.default is None else values


run_policies = st.fixed_dictionaries(
    {},
    optional={
        (field.alias or name): field_values(name, field)
        for name, field in RunPolicy.model_fields.items()
        if field.annotation in (bool, int, int | None)
    },
).map(lambda values: {key: value for key, value in values.items() if value is not None})

offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))
moments = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59), timezones=offsets)


def rfc3339(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


times = st.none() | moments.map(rfc3339)
rayjob_names = st.integers(min_value=0, max_value=10**6).map(lambda index: f"{NAME}-{index}")


@st.composite
def conditions(draw: st.DrawFn) -> list[dict[str, Any]]:
    found = []
    for kind in draw(st.lists(st.sampled_from(list(ConditionType)), unique=True, max_size=4)):
        found.append(
            {
                "type": kind.value,
                "status": draw(st.sampled_from(["True", "False", "Unknown"])),
                "reason": draw(st.sampled_from(list(ConditionReason))).value,
                "message": "",
                "lastTransitionTime": draw(moments.map(rfc3339)),
            }
        )
    return found


@st.composite
def statuses(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    status = {
        "phase": draw(st.sampled_from(list(Phase))).value,
        "conditions": draw(conditions()),
        "restarts": draw(st.integers(min_value=0, max_value=2**31)),
        "rayJobName": draw(st.none() | rayjob_names),
        "startTime": draw(times),
        "completionTime": draw(times),
    }
    return {key: value for key, value in status.items() if value is not None}


@st.composite
def rayjobs(draw: st.DrawFn, status: dict[str, Any] | None) -> tuple[dict[str, Any], ...]:
    names = draw(st.lists(rayjob_names, unique=True, max_size=2))
    if status and status.get("rayJobName") and draw(st.booleans()):
        names.append(status["rayJobName"])
    found = []
    for name in dict.fromkeys(names):
        uid = UID if draw(st.booleans()) else "another-owner"
        found.append(
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": {
                    "name": name,
                    "namespace": "team-a",
                    "labels": {"kuberl.io/job": NAME},
                    "ownerReferences": [{"uid": uid, "controller": True, "kind": "RLJob", "name": NAME}],
                },
                "status": {
                    "jobDeploymentStatus": draw(st.sampled_from(DEPLOYMENT_STATUSES)),
                    "jobStatus": draw(st.sampled_from(JOB_STATUSES)),
                },
            }
        )
    return tuple(found)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Observed, datetime]:
    spec = {**base_spec(), "runPolicy": draw(run_policies)}
    status = draw(statuses())
    rljob = make_rljob(spec, status, name=NAME, generation=draw(st.integers(min_value=1, max_value=2**31)))
    configmap = build_configmap(Owner.of(rljob), spec, 1) if draw(st.booleans()) else None
    now = draw(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)))
    return Observed(rljob=rljob, rayjobs=draw(rayjobs(status)), configmap=configmap), now


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_decide_answers_every_valid_job_at_every_time(world: tuple[Observed, datetime]) -> None:
    observed, now = world
    decision = decide(observed, now, SETTINGS)
    if decision.requeue_after is not None:
        assert 0 <= decision.requeue_after and math.isfinite(decision.requeue_after)
    before = (observed.rljob.get("status") or {}).get("phase")
    if before in {phase.value for phase in TERMINAL_PHASES}:
        assert decision.status.phase.value == before  # a finished job stays finished
        assert decision.apply == ()


def test_the_longest_deadline_and_ttl_from_a_time_near_the_end_of_the_calendar_are_decided() -> None:
    # 10**12 s raised OverflowError on every pass before the schema bounded it; the bound alone is not
    # enough near year 9999, where even ten years do not fit
    policy = {"activeDeadlineSeconds": MAX_DURATION_SECONDS, "ttlSecondsAfterFinished": MAX_DURATION_SECONDS}
    late = "9999-12-31T00:00:00Z"
    now = datetime(9999, 12, 31, 1, tzinfo=UTC)
    for phase in ("Running", "Succeeded"):
        status = {"phase": phase, "startTime": late, "completionTime": late, "rayJobName": f"{NAME}-0"}
        decision = decide(Observed(make_rljob({**base_spec(), "runPolicy": policy}, status, name=NAME)), now, SETTINGS)
        assert decision.status.phase.value != "Failed" and not decision.delete_rljob  # neither is due yet
        assert decision.requeue_after is not None and math.isfinite(decision.requeue_after)
