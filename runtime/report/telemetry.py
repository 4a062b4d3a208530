"""Every metric that leaves a run, named once.

The controller returns one step record per training step: a flat dict of `"<group>/<name>"` ->
float (`reward/mean`, `kl/mean`, `time/update`, ...); the reporter adds `step` and `epoch`. Four
readers take that record as it is, and none keeps names of its own:

- metrics.jsonl and TensorBoard: every key (`metrics.RunReporter`);
- the plot and the progress bar: `PLOTTED`, `PROGRESS`;
- the RLJob's `status.metrics`: the keys in `EXPORTS` with a `status` field (`status_publisher`);
- Prometheus: every key in `EXPORTS`, served by the driver at `/metrics` (`PrometheusExporter`).

The checkpoint is the one exception, and it is the same for both exporters: its step and time come
from the committed `CheckpointRef` (what `status.lastCheckpoint` shows), not from the step record.

Prometheus names follow its conventions (prometheus.io/docs/practices/naming): the `kuberl_` prefix,
base units spelt out (`_seconds`, `_bytes`, `_tokens`, `_ratio`), `_per_second` for rates, no
`_total` on gauges. Every series carries `rljob` (the RLJob's name; `job` is Prometheus' own label
for the scrape job) and `namespace`. A scrape shows one step whole: the collector reads a snapshot
that each step replaces in one assignment, never a mix of two steps.
"""

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.api import contract

#: The greedy validation score's key (loop/validation.py makes it; the plot and status.validation read it).
GREEDY_MEAN = "val/greedy_mean"
#: The step-record keys that more than the stage making them reads (the plot, the progress bar, the
#: status, the final printout, the exporters).
REWARD_MEAN = "reward/mean"
#: `reward/extra/<name>`: the step's mean of each number a reward returns beside its score (verl's `acc`, ...).
REWARD_EXTRA_PREFIX = "reward/extra/"
KL_MEAN = "kl/mean"
RESPONSE_LENGTH_MEAN = "response/length_mean"
REWARD_POOL_SIZE = "reward/pool_size"
ROLLOUT_POOL_SIZE = "rollout/pool_size"  # the separate rollout pool's replicas (runtime/pools/rollout.py)
ROLLOUT_TOKENS_PER_SECOND = "throughput/rollout_tokens_per_second"
#: The asynchronous rollout (spec.rollout.maxStaleness >= 1, loop/async_controller.py): per step, how many weight
#: versions the samples lag the policy they train (mean, max), the shares of the step's wall-clock time the pool
#: spent idle and the trainer spent waiting for a batch, the versions each side holds, batches generated again
#: for breaking the bound (over the run), and generated tokens per wall-clock second.
STALENESS_MEAN = "async/staleness_mean"
STALENESS_MAX = "async/staleness_max"
ROLLOUT_IDLE_FRACTION = "async/rollout_idle_fraction"
TRAINER_IDLE_FRACTION = "async/trainer_idle_fraction"
TRAINER_VERSION = "async/trainer_version"
ROLLOUT_VERSION = "async/rollout_version"
REGENERATED = "async/regenerated"
GENERATED_TOKENS_PER_SECOND = "async/generated_tokens_per_second"
#: Stages of the controller's loop, in order; `time/<stage>` is each one's seconds in a step.
STAGES = (
    "rollout",
    "reward",
    "sleep",
    "reference",
    "old_logprobs",
    "correction",
    "critic",
    "advantages",
    "update",
    "sync",
)
#: Stages that run a model over the step's response tokens: their tokens per second are recorded.
TOKEN_STAGES = ("rollout", "reference", "old_logprobs", "critic", "update")
#: A stage that took less than this did not run (the controller skips what the configuration does not ask for).
RAN_SECONDS = 1e-3

#: Panels of training.png: (record key, title).
PLOTTED = (
    (REWARD_MEAN, "reward (mean of the step's responses)"),
    (KL_MEAN, "KL to the reference (nats per token)"),
    (RESPONSE_LENGTH_MEAN, "response length (tokens)"),
)
#: A panel more when the run validated: the greedy validation mean and the sampled one (`val/mean@<n>`).
PLOTTED_VALIDATION = GREEDY_MEAN
PLOTTED_VALIDATION_SAMPLED = "val/mean@"
#: (record key, progress-bar label, format) shown beside the progress bar.
PROGRESS = (
    (REWARD_MEAN, "reward", ".3f"),
    (KL_MEAN, "kl", ".4f"),
    (ROLLOUT_TOKENS_PER_SECOND, "tok_s", ".0f"),
)


@dataclass(frozen=True)
class Export:
    """One step-record key as the exporters name it."""

    record_key: str
    metric: str  # Prometheus name
    help: str
    labels: tuple[tuple[str, str], ...] = ()  # extra labels, e.g. (("stage", "rollout"),)
    status: str | None = None  # the field of status.metrics (api/status.py Metrics), when it has one


def _stage_exports() -> list[Export]:
    seconds = [
        Export(f"time/{stage}", "kuberl_stage_seconds", "Seconds a stage of the latest step took.", (("stage", stage),))
        for stage in STAGES
    ]
    rates = [
        Export(
            f"throughput/{stage}_tokens_per_second",
            "kuberl_stage_tokens_per_second",
            "Response tokens a stage processed per second in the latest step (rollout: generated).",
            (("stage", stage),),
            status="tokens_per_second" if stage == "rollout" else None,
        )
        for stage in TOKEN_STAGES
    ]
    return seconds + rates


EXPORTS: tuple[Export, ...] = (
    Export("step", "kuberl_training_step", "Training steps completed."),
    Export("epoch", "kuberl_training_epoch", "Current pass over the training prompts (0-based)."),
    Export(REWARD_MEAN, "kuberl_reward_mean", "Mean reward of the latest step's responses.", status="reward_mean"),
    Export("reward/std", "kuberl_reward_std", "Standard deviation of the latest step's rewards."),
    Export("reward/failed", "kuberl_reward_failed_responses", "Responses of the latest step whose reward failed."),
    Export(KL_MEAN, "kuberl_kl_mean", "Mean KL to the reference model per response token, in nats.", status="kl"),
    Export(
        RESPONSE_LENGTH_MEAN,
        "kuberl_response_length_tokens",
        "Mean response length of the latest step, in tokens.",
        status="response_length",
    ),
    Export(
        "response/clip_fraction",
        "kuberl_response_truncated_ratio",
        "Share of the latest step's responses cut at rollout.maxNewTokens.",
    ),
    Export("actor/loss", "kuberl_actor_loss", "Actor loss of the latest update."),
    Export("actor/grad_norm", "kuberl_actor_grad_norm", "Actor gradient norm of the latest update."),
    Export("time/step", "kuberl_step_seconds", "Seconds the latest training step took."),
    *_stage_exports(),
    Export("sync/seconds", "kuberl_weight_sync_seconds", "Seconds the latest weight sync into the engines took."),
    Export("sync/bytes", "kuberl_weight_sync_bytes", "Bytes the latest weight sync moved."),
    Export(
        "engine/sleep_freed_bytes",
        "kuberl_engine_sleep_freed_bytes",
        "Device memory a colocated engine freed for the trainer by sleeping in the latest step (per rank).",
    ),
    Export(
        STALENESS_MAX,
        "kuberl_async_staleness_max",
        "Most weight versions a sample of the latest step lagged the policy it trained (rollout.maxStaleness).",
        status="staleness_max",
    ),
    Export(STALENESS_MEAN, "kuberl_async_staleness_mean", "Mean weight versions the latest step's samples lagged."),
    Export(
        ROLLOUT_IDLE_FRACTION,
        "kuberl_async_rollout_idle_ratio",
        "Share of the latest step's wall-clock time the rollout pool generated nothing.",
    ),
    Export(
        TRAINER_IDLE_FRACTION,
        "kuberl_async_trainer_idle_ratio",
        "Share of the latest step's wall-clock time the trainer waited for a batch.",
    ),
    Export(REWARD_POOL_SIZE, "kuberl_reward_pool_workers", "Reward workers running now.", status="reward_workers"),
    Export(ROLLOUT_POOL_SIZE, "kuberl_rollout_pool_replicas", "Separate rollout replicas running or starting now."),
    Export(
        "reward/queue_wait_seconds",
        "kuberl_reward_queue_wait_seconds",
        "Mean wait of the latest step's reward batches in the pool's queue.",
    ),
    Export(
        "reward/queue_wait_max_seconds",
        "kuberl_reward_queue_wait_max_seconds",
        "Longest wait of a reward batch in the pool's queue in the latest step.",
    ),
)

#: Prometheus metrics that do not come from the step record.
PLANNED_STEPS = "kuberl_training_planned_steps"
CHECKPOINT_STEP = "kuberl_checkpoint_step"
CHECKPOINT_TIME = "kuberl_checkpoint_timestamp_seconds"
CHECKPOINT_AGE = "kuberl_checkpoint_age_seconds"
RUN_METRICS = {
    PLANNED_STEPS: "Training steps the run will make.",
    CHECKPOINT_STEP: "Step of the newest committed checkpoint.",
    CHECKPOINT_TIME: "Unix time the newest checkpoint was committed.",
    CHECKPOINT_AGE: "Seconds since the newest checkpoint was committed.",
}


def metric_names() -> set[str]:
    """Every Prometheus metric name the runtime exports (dashboards may use these and no others)."""
    return {export.metric for export in EXPORTS} | set(RUN_METRICS)


def stage_throughput(
    timings: Mapping[str, float], generated_tokens: float, trained_tokens: float | None
) -> dict[str, float]:
    """`throughput/<stage>_tokens_per_second` of each token stage that ran (its `time/<stage>` in timings): the
    rollout's generated tokens (every dynamic-sampling round), the others' tokens of the batch that trained.

    >>> stage_throughput({"time/rollout": 2.0, "time/reference": 0.0, "time/update": 0.5}, 640.0, 320.0)
    {'throughput/rollout_tokens_per_second': 320.0, 'throughput/update_tokens_per_second': 640.0}
    """
    rates = {}
    for stage in TOKEN_STAGES:
        seconds = timings.get(f"time/{stage}", 0.0)
        tokens = generated_tokens if stage == "rollout" else trained_tokens
        if seconds >= RAN_SECONDS and tokens is not None:
            rates[f"throughput/{stage}_tokens_per_second"] = tokens / seconds
    return rates


def status_fields(record: Mapping[str, float]) -> dict[str, Any]:
    """The status.metrics fields (snake_case, as api/status.py Metrics names them) of a step record. A value
    that is not a finite number is left out: JSON cannot carry it (metrics.jsonl records it as it was).

    >>> status_fields({"reward/mean": 0.5, "kl/mean": 0.01, "time/step": 3.0})
    {'reward_mean': 0.5, 'kl': 0.01}
    >>> status_fields({"reward/mean": float("nan"), "kl/mean": float("inf"), "response/length_mean": 9.0})
    {'response_length': 9.0}
    """
    fields: dict[str, Any] = {
        export.status: record[export.record_key]
        for export in EXPORTS
        if export.status and export.record_key in record and math.isfinite(record[export.record_key])
    }
    for integral in ("reward_workers", "staleness_max"):
        if integral in fields:
            fields[integral] = int(fields[integral])
    return fields


@dataclass(frozen=True)
class Checkpoint:
    step: int
    unix_time: float


class StepRecordCollector:
    """A prometheus_client collector over the latest step record (a custom collector, so one scrape is one step)."""

    def __init__(
        self, job_name: str, namespace: str, planned_steps: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.identity = (("rljob", job_name), ("namespace", namespace))
        self.planned_steps = planned_steps
        self.clock = clock
        self._record: Mapping[str, float] = {}
        self._checkpoint: Checkpoint | None = None

    def update(self, record: Mapping[str, float]) -> None:
        self._record = dict(record)  # one assignment: a scrape sees the old record or the new one, whole

    def checkpoint_committed(self, step: int, unix_time: float) -> None:
        self._checkpoint = Checkpoint(step, unix_time)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        record, checkpoint = self._record, self._checkpoint
        base = [name for name, _ in self.identity]
        values = [value for _, value in self.identity]
        families: dict[str, GaugeMetricFamily] = {}

        def family(name: str, help_text: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            if name not in families:
                families[name] = GaugeMetricFamily(name, help_text, labels=[*base, *extra])
            return families[name]

        for export in EXPORTS:
            if export.record_key in record:
                extra = tuple(name for name, _ in export.labels)
                family(export.metric, export.help, extra).add_metric(
                    [*values, *(value for _, value in export.labels)], float(record[export.record_key])
                )
        family(PLANNED_STEPS, RUN_METRICS[PLANNED_STEPS]).add_metric(values, float(self.planned_steps))
        if checkpoint is not None:
            family(CHECKPOINT_STEP, RUN_METRICS[CHECKPOINT_STEP]).add_metric(values, float(checkpoint.step))
            family(CHECKPOINT_TIME, RUN_METRICS[CHECKPOINT_TIME]).add_metric(values, checkpoint.unix_time)
            age = max(0.0, self.clock() - checkpoint.unix_time)
            family(CHECKPOINT_AGE, RUN_METRICS[CHECKPOINT_AGE]).add_metric(values, age)
        yield from families.values()


class PrometheusExporter:
    """Serves the run's metrics at http://<addr>:<port>/metrics from a background thread; `close()` stops it."""

    def __init__(self, job_name: str, namespace: str, planned_steps: int, port: int, addr: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.collector = StepRecordCollector(job_name, namespace, planned_steps)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)  # type: ignore[arg-type]
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self._server.server_address[1])

    def record(self, record: Mapping[str, float]) -> None:
        self.collector.update(record)

    def checkpoint_committed(self, step: int, unix_time: float) -> None:
        self.collector.checkpoint_committed(step, unix_time)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @classmethod
    def from_environment(
        cls,
        job_name: str,
        namespace: str,
        planned_steps: int,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> "PrometheusExporter | None":
        """On `port`, else on $KUBERL_METRICS_PORT (the operator sets it on the Ray head); None when neither."""
        env = os.environ if env is None else env
        chosen = port if port is not None else env.get(contract.METRICS_PORT_ENV)
        if chosen in (None, ""):
            return None
        if not str(chosen).isdigit() or int(chosen) > 65535:
            raise ValueError(
                f"{contract.METRICS_PORT_ENV} / --metrics-port is {chosen!r}; give a port number (0: any free)"
            )
        return cls(job_name, namespace, planned_steps, int(chosen))
