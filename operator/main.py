"""`kuberl operator`: run the kopf operator for RLJobs.

    kuberl operator [--namespace NS ...] [--webhook-port 9443] [--metrics-port 8080]

Without --namespace it watches the whole cluster. With --webhook-port it serves the validating
webhook (see webhook.py; the Helm chart templates its configuration). Settings beyond
the flags come from environment variables (settings.py). With --metrics-port it serves /metrics and
/healthz (health.py: fails when the event loop is wedged).

Several replicas may run with KUBERL_LEASE_NAMESPACE set (the chart runs two): every replica watches and
serves the webhook, the one holding the Lease reconciles (leader.py). kopf itself runs standalone: its
own peering freezes every replica of equal priority and has no fence, so kuberl elects with a Lease.
Without KUBERL_LEASE_NAMESPACE exactly one replica may run; it reconciles from the start.
"""

import argparse
import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kopf

from kuberl import __version__
from kuberl.operator import handlers, webhook
from kuberl.operator.health import LoopHeartbeat
from kuberl.operator.kube import Kube, load_configuration
from kuberl.operator.leader import Leadership, LeaseElector
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import ReconcileQueue, Reconciler
from kuberl.operator.settings import HEARTBEAT_SECONDS, OperatorSettings

logger = logging.getLogger("kuberl.operator")
#: How long a stopping operator waits for its Lease to be released before it exits anyway.
RELEASE_TIMEOUT_SECONDS = 15.0


@dataclass
class Operator:
    """Everything one operator instance holds: kopf's registry and memo, the queue, the metrics."""

    settings: OperatorSettings
    registry: kopf.OperatorRegistry
    queue: ReconcileQueue
    metrics: OperatorMetrics
    kube: Kube
    leadership: Leadership
    heartbeat: LoopHeartbeat
    #: None without leader election
    elector: LeaseElector | None = None

    def close(self) -> None:
        self.queue.close()
        self.kube.close()
        if self.elector is not None:
            self.elector.kube.close()


def user_agent(settings: OperatorSettings) -> str:
    """`kuberl-operator/<version>`, and the replica's Lease identity: the audit log tells replicas apart."""
    election = settings.leader_election
    return f"kuberl-operator/{__version__}" + (f" ({election.identity})" if election else "")


def build_operator(settings: OperatorSettings, kube: Kube | None = None) -> Operator:
    """The operator; `kube` (for the reconcile passes) is made from the environment unless given, fenced by
    the Lease when there is an election."""
    election = settings.leader_election
    leadership = Leadership.unelected() if election is None else Leadership(election.renew_deadline_seconds)
    agent = user_agent(settings)
    fence = leadership if election is not None else None
    kube = kube or Kube.from_environment(pool_size=settings.workers + 4, fence=fence, user_agent=agent)
    metrics = OperatorMetrics()
    queue = ReconcileQueue(
        Reconciler(kube, settings, metrics),
        workers=settings.workers,
        resync_seconds=settings.resync_seconds,
        leadership=leadership,
    )
    elector = None
    if election is not None:
        elector = LeaseElector(
            # its own connection, never fenced; a request slower than the renew deadline is of no use
            Kube(load_configuration(1), timeout=election.renew_deadline_seconds, user_agent=agent),
            election,
            leadership,
            on_started_leading=queue.start_leading,
            on_renewed=queue.start_leading,  # the jobs set aside while a late renewal had closed the fence
            on_stopped_leading=queue.stop_leading,
            on_leading_changed=lambda leading: metrics.leader.set(1 if leading else 0),
        )
    else:
        metrics.leader.set(1)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    if settings.webhook_port is not None:
        webhook.register(registry)
        server = webhook.server(settings)  # fails now, with what to set, when the certificate files are not given

        @kopf.on.startup(registry=registry)
        def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.admission.server = server  # served only: settings.admission.managed stays None

    return Operator(
        settings=settings,
        registry=registry,
        queue=queue,
        metrics=metrics,
        kube=kube,
        leadership=leadership,
        heartbeat=LoopHeartbeat(settings.loop_stall_seconds, interval=HEARTBEAT_SECONDS),
        elector=elector,
    )


async def serve(
    operator: Operator,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator in the current event loop until `stop_flag` is set (or forever).

    The heartbeat and the elector run beside kopf, in the same loop; when kopf stops, the elector closes
    the fence and releases the Lease."""
    namespaces = list(operator.settings.namespaces)
    with background(operator.heartbeat.run()):
        stop_electing = asyncio.Event()
        elector = None if operator.elector is None else asyncio.create_task(operator.elector.run(stop_electing))
        try:
            await kopf.operator(
                registry=operator.registry,
                memo=kopf.Memo(queue=operator.queue, metrics=operator.metrics),
                clusterwide=not namespaces,
                namespaces=namespaces,
                standalone=True,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        finally:
            if elector is not None:
                stop_electing.set()
                try:
                    await asyncio.wait_for(elector, timeout=RELEASE_TIMEOUT_SECONDS)
                except TimeoutError:
                    logger.warning("the Lease was not released in time: a standby takes it when it expires")


@contextlib.contextmanager
def background(coroutine: Any) -> Iterator[None]:
    """Run `coroutine` as a task for the duration of the block; cancelled after it."""
    task = asyncio.get_running_loop().create_task(coroutine)
    try:
        yield
    finally:
        task.cancel()


def run_operator(args: argparse.Namespace) -> int:
    """The `kuberl operator` command; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handler run at INFO ("Timer 'resync' succeeded."): thousands of lines per minute at scale.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings = OperatorSettings.from_env(
        namespaces=args.namespace, metrics_port=args.metrics_port, webhook_port=args.webhook_port
    )
    operator = build_operator(settings)
    metrics_server = None
    if settings.metrics_port:
        metrics_server = operator.metrics.serve(settings.metrics_port, health=operator.heartbeat.check)
    try:
        asyncio.run(serve(operator))
    except KeyboardInterrupt:
        pass
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        operator.close()
    return 0
