"""kopf handlers: thin. Each one only asks the reconcile queue for a pass of the RLJob concerned.

Every handler is a watch-event handler (`kopf.on.event`), never a create/update/timer handler: kopf
puts its finalizer on an object only for those (and for daemons), and a finalizer held by an operator
that is down stops RLJobs, and the namespaces holding them, from being deleted. Nothing here needs one:
owner references let the garbage collector take a deleted job's children, and the queue's own timers
give every job its resync. kopf also removes the finalizer earlier versions put on RLJobs.

An RLJob event asks for a pass when the job is new to this operator or its spec changed (a new
generation); a status-only change is the operator's own write and needs none. Changes of a RayJob
labelled `kuberl.io/job` (KubeRay moving its status) and of a job's report ConfigMap (the runtime
publishing progress) always ask for one. A pass that fails is retried
by the queue with a growing delay; a handler never raises, so kopf posts no Error event per failure.
"""

import logging
from typing import Any

import kopf

from kuberl.api import GROUP, PLURAL, VERSION
from kuberl.operator import names
from kuberl.operator.kube import connection_info, load_configuration
from kuberl.operator.settings import OperatorSettings


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register every handler on `registry` (one registry per operator instance; no module-level state)."""

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(load_configuration())

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # the operator posts its own Events on transitions
        # Watch only what concerns jobs, filtered by the API server: the runtimes' report ConfigMaps, and
        # RayJobs labelled with a job (not every ConfigMap and RayJob of the cluster).
        settings.watching.label_selectors["v1", "configmaps"] = f"{names.COMPONENT_LABEL}={names.PROGRESS_COMPONENT}"
        settings.watching.label_selectors[names.RAY_GROUP, "rayjobs"] = names.JOB_LABEL

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def rljob_changed(
        type: str | None, name: str, namespace: str | None, body: kopf.Body, memo: Any, **_: Any
    ) -> None:
        if namespace is None:  # RLJobs are namespaced; kopf's types allow cluster-scoped objects too
            return
        if type == "DELETED":
            memo.queue.forget(namespace, name)
            memo.metrics.job_phase((namespace, name), None)
            return
        memo.queue.notice(namespace, name, body.get("metadata", {}).get("generation"))

    @kopf.on.event(
        names.RAY_GROUP, names.RAY_VERSION, "rayjobs", labels={names.JOB_LABEL: kopf.PRESENT}, registry=registry
    )
    async def rayjob_changed(labels: kopf.Labels, namespace: str | None, memo: Any, **_: Any) -> None:
        if namespace is not None:
            memo.queue.request(namespace, labels[names.JOB_LABEL])

    @kopf.on.event(
        "v1",
        "configmaps",
        labels={names.COMPONENT_LABEL: names.PROGRESS_COMPONENT, names.JOB_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def report_changed(labels: kopf.Labels, namespace: str | None, memo: Any, **_: Any) -> None:
        """The runtime wrote its report: the pass copies it into the RLJob's status (the pass reads it by name)."""
        if namespace is not None:
            memo.queue.request(namespace, labels[names.JOB_LABEL])
