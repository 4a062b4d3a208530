"""Prometheus metrics: passes, errors and jobs by phase."""

from prometheus_client import generate_latest

from kuberl.operator.metrics import OperatorMetrics


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_jobs_are_counted_by_their_latest_phase():
    metrics = OperatorMetrics()
    metrics.job_phase(("ns", "a"), "Running")
    metrics.job_phase(("ns", "b"), "Running")
    metrics.job_phase(("ns", "a"), "Succeeded")
    assert sample(metrics, "kuberl_operator_jobs", phase="Running") == 1
    assert sample(metrics, "kuberl_operator_jobs", phase="Succeeded") == 1


def test_a_deleted_job_is_no_longer_counted():
    metrics = OperatorMetrics()
    metrics.job_phase(("ns", "a"), "Running")
    metrics.job_phase(("ns", "a"), None)
    assert sample(metrics, "kuberl_operator_jobs", phase="Running") == 0


def test_counters_are_exposed_with_their_total_names():
    metrics = OperatorMetrics()
    metrics.reconciles.inc()
    text = generate_latest(metrics.registry).decode()
    assert "kuberl_operator_reconciles_total 1.0" in text
    assert "kuberl_operator_reconcile_errors_total 0.0" in text
