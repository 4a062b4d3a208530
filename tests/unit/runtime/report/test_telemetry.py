"""One set of metric names: the step record's keys, as status.metrics, the progress bar and Prometheus name them."""

import re
import urllib.request

import pytest

from kuberl.api.status import Metrics
from kuberl.operator import builders
from kuberl.runtime.report.status_publisher import status_metrics
from kuberl.runtime.report.telemetry import (
    CHECKPOINT_AGE,
    EXPORTS,
    PrometheusExporter,
    StepRecordCollector,
    metric_names,
    stage_throughput,
    status_fields,
)

#: Prometheus' metric name grammar, and its suffix conventions for gauges.
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_every_exported_name_follows_prometheus_conventions():
    for name in metric_names():
        assert METRIC_NAME.match(name), name
        assert name.startswith("kuberl_"), name
        assert not name.endswith("_total"), f"{name}: _total is for counters; these are gauges"


def test_no_two_record_keys_share_a_series():
    series = [(export.metric, export.labels) for export in EXPORTS]
    assert len(series) == len(set(series))
    assert len({export.record_key for export in EXPORTS}) == len(EXPORTS)


def test_one_metric_name_keeps_one_set_of_labels():
    labels: dict[str, set[str]] = {}
    for export in EXPORTS:
        labels.setdefault(export.metric, set()).add(",".join(name for name, _ in export.labels))
    assert all(len(sets) == 1 for sets in labels.values()), labels


def test_status_fields_are_fields_of_status_metrics():
    declared = {export.status for export in EXPORTS if export.status}
    assert declared == set(Metrics.model_fields)


def test_status_metrics_come_from_the_step_record_keys_telemetry_names():
    record = {
        "reward/mean": 0.9,
        "kl/mean": 0.4,
        "response/length_mean": 4.0,
        "throughput/rollout_tokens_per_second": 900.0,
        "throughput/update_tokens_per_second": 300.0,
        "reward/pool_size": 2.0,
        "async/staleness_max": 1.0,
        "async/staleness_mean": 0.75,
    }
    assert status_metrics(record) == {
        "rewardMean": 0.9,
        "kl": 0.4,
        "responseLength": 4.0,
        "tokensPerSecond": 900.0,
        "rewardWorkers": 2,
        "stalenessMax": 1,
    }
    assert status_fields({"time/step": 1.0}) == {}


def test_stage_throughput_skips_stages_that_did_not_run():
    # 640 generated tokens in 2 s of rollout -> 320/s; 320 of them trained in 0.5 s -> 640/s; reference 0 s: not run
    rates = stage_throughput({"time/rollout": 2.0, "time/reference": 0.0, "time/update": 0.5}, 640.0, 320.0)
    assert rates == {
        "throughput/rollout_tokens_per_second": 320.0,
        "throughput/update_tokens_per_second": 640.0,
    }


def test_a_step_that_trained_nothing_reports_only_the_rollout_rate():
    # dynamic sampling found no group worth training on: no batch, so no model stage's rate
    assert stage_throughput({"time/rollout": 2.0}, 640.0, None) == {"throughput/rollout_tokens_per_second": 320.0}


def scrape(collector: StepRecordCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in collector.collect()
        for sample in family.samples
    }


def test_a_scrape_shows_the_latest_record_with_job_and_namespace_labels():
    collector = StepRecordCollector("tiny-grpo", "team-a", planned_steps=60, clock=lambda: 1000.0)
    collector.update({"step": 3, "reward/mean": 0.5, "time/rollout": 1.5, "unexported/key": 7.0})
    collector.update({"step": 4, "reward/mean": 0.75, "time/rollout": 1.25})
    identity = (("namespace", "team-a"), ("rljob", "tiny-grpo"))
    samples = scrape(collector)
    assert samples[("kuberl_training_step", identity)] == 4
    assert samples[("kuberl_reward_mean", identity)] == 0.75
    assert samples[("kuberl_stage_seconds", tuple(sorted((*identity, ("stage", "rollout")))))] == 1.25
    assert samples[("kuberl_training_planned_steps", identity)] == 60
    assert CHECKPOINT_AGE not in {name for name, _ in samples}  # no checkpoint yet: no age to show
    assert {name for name, _ in samples} <= metric_names()


def test_checkpoint_age_counts_from_the_commit_at_scrape_time():
    now = [1000.0]
    collector = StepRecordCollector("tiny-grpo", "team-a", planned_steps=60, clock=lambda: now[0])
    collector.checkpoint_committed(step=20, unix_time=990.0)
    identity = (("namespace", "team-a"), ("rljob", "tiny-grpo"))
    assert scrape(collector)[(CHECKPOINT_AGE, identity)] == 10.0
    now[0] = 1030.0
    samples = scrape(collector)
    assert samples[(CHECKPOINT_AGE, identity)] == 40.0
    assert samples[("kuberl_checkpoint_step", identity)] == 20


def test_the_exporter_serves_the_text_format_over_http():
    exporter = PrometheusExporter("tiny-grpo", "team-a", planned_steps=60, port=0, addr="127.0.0.1")
    try:
        exporter.record({"step": 1, "reward/mean": 0.25})
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).read().decode()
        assert 'kuberl_reward_mean{namespace="team-a",rljob="tiny-grpo"} 0.25' in body
        assert "# TYPE kuberl_reward_mean gauge" in body
    finally:
        exporter.close()


@pytest.mark.parametrize(("port", "env", "serves"), [(None, {}, False), (None, {"KUBERL_METRICS_PORT": "0"}, True)])
def test_the_exporter_runs_when_a_port_is_given(port, env, serves):
    exporter = PrometheusExporter.from_environment("j", "ns", 1, port, env=env)
    assert (exporter is not None) == serves
    if exporter is not None:
        exporter.close()


def test_a_port_that_is_no_number_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="KUBERL_METRICS_PORT.*'metrics'"):
        PrometheusExporter.from_environment("j", "ns", 1, env={"KUBERL_METRICS_PORT": "metrics"})


def test_the_operator_names_the_metrics_port_on_the_head():
    # The variable itself is api/contract.py's (test_builders checks the head's env carries it).
    assert builders.METRICS_PORT_NAME in {port["name"] for port in builders.HEAD_PORTS}
