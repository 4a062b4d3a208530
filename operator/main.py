"""`kuberl operator`: run the kopf operator for RLJobs.

    kuberl operator [--namespace NS ...] [--webhook-port 9443] [--metrics-port 8080]

Without --namespace it watches the whole cluster. With --webhook-port it serves the validating
webhook (see webhook.py; the Helm chart templates its configuration). Settings beyond
the flags come from environment variables (settings.py). One replica is expected: the operator
runs kopf in standalone mode (no peering), and deterministic names keep even an overlap harmless.
"""

import argparse
import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

import kopf

from kuberl.operator import handlers, webhook
from kuberl.operator.kube import Kube
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.reconcile import ReconcileQueue, Reconciler
from kuberl.operator.settings import OperatorSettings

logger = logging.getLogger("kuberl.operator")


@dataclass
class Operator:
    """Everything one operator instance holds: kopf's registry and memo, the queue, the metrics."""

    settings: OperatorSettings
    registry: kopf.OperatorRegistry
    queue: ReconcileQueue
    metrics: OperatorMetrics
    kube: Kube

    def close(self) -> None:
        self.queue.close()
        self.kube.close()


def build_operator(settings: OperatorSettings, kube: Kube | None = None) -> Operator:
    kube = kube or Kube.from_environment(pool_size=settings.workers + 4)
    metrics = OperatorMetrics()
    queue = ReconcileQueue(
        Reconciler(kube, settings, metrics), workers=settings.workers, resync_seconds=settings.resync_seconds
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    if settings.webhook_port is not None:
        webhook.register(registry)
        server = webhook.server(settings)  # fails now, with what to set, when the certificate files are not given

        @kopf.on.startup(registry=registry)
        def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.admission.server = server  # served only: settings.admission.managed stays None

    return Operator(settings=settings, registry=registry, queue=queue, metrics=metrics, kube=kube)


async def serve(
    operator: Operator,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator in the current event loop until `stop_flag` is set (or forever)."""
    namespaces = list(operator.settings.namespaces)
    await kopf.operator(
        registry=operator.registry,
        memo=kopf.Memo(queue=operator.queue, metrics=operator.metrics),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(args: argparse.Namespace) -> int:
    """The `kuberl operator` command; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handler run at INFO ("Timer 'resync' succeeded."): thousands of lines per minute at scale.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings = OperatorSettings.from_env(
        namespaces=args.namespace, metrics_port=args.metrics_port, webhook_port=args.webhook_port
    )
    operator = build_operator(settings)
    metrics_server = operator.metrics.serve(settings.metrics_port) if settings.metrics_port else None
    try:
        asyncio.run(serve(operator))
    except KeyboardInterrupt:
        pass
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        operator.close()
    return 0
