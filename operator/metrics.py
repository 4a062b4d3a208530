"""Prometheus metrics of the operator, on their own registry (several operators may share a process in tests).

kuberl_operator_reconciles_total          reconcile passes run
kuberl_operator_reconcile_errors_total    passes that ended in an error (they are retried)
kuberl_operator_reconcile_seconds         how long a pass took (observe + decide + apply)
kuberl_operator_jobs{phase="Running"}     RLJobs by phase, as of their latest pass
"""

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kuberl.api.enums import Phase


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("kuberl_operator_reconciles", "Reconcile passes run.", registry=self.registry)
        self.errors = Counter(
            "kuberl_operator_reconcile_errors",
            "Reconcile passes that failed (and are retried).",
            registry=self.registry,
        )
        self.seconds = Histogram(
            "kuberl_operator_reconcile_seconds", "Duration of a reconcile pass.", registry=self.registry
        )
        self.jobs = Gauge("kuberl_operator_jobs", "RLJobs by phase.", ["phase"], registry=self.registry)
        for phase in Phase:
            self.jobs.labels(phase.value).set(0)
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def job_phase(self, key: tuple[str, str], phase: str | None) -> None:
        """Record a job's phase (None: the job is gone) and refresh the per-phase gauge."""
        with self._lock:
            if phase is None:
                self._phases.pop(key, None)
            else:
                self._phases[key] = phase
            counts = {p.value: 0 for p in Phase}
            for value in self._phases.values():
                counts[value] = counts.get(value, 0) + 1
            for value, count in counts.items():
                self.jobs.labels(value).set(count)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `port`; returns the server (call .shutdown() to stop it)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
