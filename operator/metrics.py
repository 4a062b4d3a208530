"""Prometheus metrics of the operator, on their own registry (several operators may share a process in tests).

kuberl_operator_reconciles_total          reconcile passes run
kuberl_operator_reconcile_errors_total    passes that ended in an error (they are retried)
kuberl_operator_reconcile_seconds         how long a pass took (observe + decide + apply)
kuberl_operator_jobs{phase="Running"}     RLJobs by phase, as of their latest pass
kuberl_operator_leader                    1 while this replica reconciles (holds the Lease, or no election), else 0

`serve` answers /metrics and, given a health check, /healthz (health.py) on the same port.
"""

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.leader = Gauge(
            "kuberl_operator_leader",
            "1 while this replica reconciles (it holds the Lease, or runs without leader election).",
            registry=self.registry,
        )
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

    def serve(
        self, port: int, addr: str = "0.0.0.0", health: Callable[[], tuple[bool, str]] | None = None
    ) -> ThreadingHTTPServer:
        """Serve /metrics (and /healthz with `health`) on `port` from a thread; call .shutdown() to stop it."""
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self.answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz" and health is not None:
                    healthy, why = health()
                    self.answer(200 if healthy else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
                else:
                    self.answer(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

            def answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - probes every few seconds
                pass

        server = ThreadingHTTPServer((addr, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="kuberl-metrics", daemon=True).start()
        return server
