"""kopf handlers: thin. Each one only asks the reconcile queue for a pass of the RLJob concerned.

create/update/resume of an RLJob, a timer (the resync), and any change of a RayJob labelled
`kuberl.io/job` (KubeRay moving its status) all lead to the same level-triggered pass. A pass
that fails raises TemporaryError, and kopf retries the handler after the delay.
"""

import logging
from typing import Any

import kopf

from kuberl.api import GROUP, PLURAL, VERSION
from kuberl.operator import names
from kuberl.operator.kube import ApiError, connection_info, load_configuration
from kuberl.operator.reconcile import ReconcileQueue
from kuberl.operator.settings import OperatorSettings

#: Delay before kopf retries a handler whose pass failed.
RETRY_DELAY_SECONDS = 2.0


async def request_pass(queue: ReconcileQueue, namespace: str | None, name: str) -> None:
    if namespace is None:  # RLJobs and RayJobs are namespaced; kopf types allow cluster-scoped objects too
        raise kopf.PermanentError(f"{name} has no namespace")
    try:
        await queue.trigger(namespace, name)
    except ApiError as error:
        raise kopf.TemporaryError(
            f"reconcile of {namespace}/{name} failed: {error}", delay=RETRY_DELAY_SECONDS
        ) from error
    except (OSError, TimeoutError) as error:  # the API server unreachable for a moment
        raise kopf.TemporaryError(f"API server unreachable: {error}", delay=RETRY_DELAY_SECONDS) from error


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register every handler on `registry` (one registry per operator instance; no module-level state)."""

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(load_configuration())

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf's own bookkeeping lives in annotations: the RLJob status schema keeps only known fields.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kuberl.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="kuberl.io", key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING  # the operator posts its own Events on transitions
        # A deleted RLJob keeps its finalizer until its resync timer has stopped; kopf checks a timer that
        # is mid-run every `cancellation_polling` seconds (60 by default, which held TTL deletions a minute).
        settings.background.cancellation_polling = 1.0

    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-created", registry=registry)
    async def created(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
        await request_pass(memo.queue, namespace, name)

    @kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-updated", registry=registry)
    async def updated(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
        await request_pass(memo.queue, namespace, name)

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile-resumed", registry=registry)
    async def resumed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
        await request_pass(memo.queue, namespace, name)

    @kopf.timer(GROUP, VERSION, PLURAL, id="resync", interval=settings.resync_seconds, registry=registry)
    async def resync(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
        await request_pass(memo.queue, namespace, name)

    @kopf.on.event(
        names.RAY_GROUP, names.RAY_VERSION, "rayjobs", labels={names.JOB_LABEL: kopf.PRESENT}, registry=registry
    )
    async def rayjob_changed(labels: kopf.Labels, namespace: str | None, memo: Any, **_: Any) -> None:
        await request_pass(memo.queue, namespace, labels[names.JOB_LABEL])

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="forget", optional=True, registry=registry)
    async def deleted(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
        memo.queue.forget(namespace or "", name)
        memo.metrics.job_phase((namespace or "", name), None)
