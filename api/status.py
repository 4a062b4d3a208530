"""`status` of an RLJob, which only the operator writes.

The runtime reports its progress, metrics, validation scores and last checkpoint as a `RuntimeReport`
in the job's ConfigMap `<job>-progress` (key REPORT_KEY), the one object its ServiceAccount may write;
the operator validates the report with these models and copies its fields into status.progress,
status.metrics, status.validation and status.lastCheckpoint. Phase, conditions, names and times are
the operator's own.
"""

from datetime import datetime

from pydantic import Field

from kuberl.api.base import KuberlModel
from kuberl.api.enums import ConditionReason, ConditionStatus, ConditionType, Phase


class Condition(KuberlModel):
    """One aspect of the job's state, Kubernetes-style."""

    type: ConditionType = Field(description="Which aspect of the job this condition describes.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: ConditionReason = Field(description="Machine-readable cause of the last transition.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: datetime = Field(description="When status last flipped.")


class Progress(KuberlModel):
    """How far training has got."""

    step: int = Field(0, ge=0, description="Training steps completed.")
    total_steps: int | None = Field(None, ge=0, description="Steps the job will run.")
    epoch: int = Field(0, ge=0, description="Current pass over the training prompts (0-based).")
    eta_seconds: float | None = Field(None, ge=0, description="Estimated time to finish.")


class Metrics(KuberlModel):
    """The latest step's headline metrics."""

    reward_mean: float | None = Field(None, description="Mean reward of the latest step's responses.")
    kl: float | None = Field(None, description="Mean KL to the reference model, latest step.")
    response_length: float | None = Field(None, description="Mean response length in tokens, latest step.")
    tokens_per_second: float | None = Field(None, description="Generated tokens per second, latest step.")
    reward_workers: int | None = Field(None, ge=0, description="Reward workers running now (elastic pool).")
    staleness_max: int | None = Field(
        None,
        ge=0,
        description="Asynchronous rollout (spec.rollout.maxStaleness): the most weight versions a sample of the "
        "latest step lagged the policy it trained; never above maxStaleness.",
    )


class Validation(KuberlModel):
    """The latest scores on spec.data.validation (see that field)."""

    step: int = Field(ge=0, description="Training steps done when the validation prompts were scored.")
    samples: int = Field(ge=1, description="k: sampled responses per prompt (groupSize).")
    greedy_mean: float = Field(description="Mean score of the greedy responses.")
    mean_at_k: float = Field(description="Mean score of the k sampled responses.")
    pass_at_k: float | None = Field(
        None, description="Share of prompts with a correct response among k (a 0/1 reward only)."
    )
    maj_at_k: float | None = Field(
        None, description="Share of prompts whose most frequent final answer among k is correct (a 0/1 reward only)."
    )


class CheckpointRef(KuberlModel):
    """A committed checkpoint."""

    step: int = Field(ge=0, description="Step the checkpoint was written after.")
    uri: str = Field(description="Where it is.")
    time: datetime = Field(description="When it was committed.")


class RLJobStatus(KuberlModel):
    """Observed state of the job: the operator's view (phase, conditions) and the runtime's (progress)."""

    phase: Phase = Field(
        Phase.PENDING,
        description="Pending, Queued (Kueue holds it), Starting, Running, Suspended, Restarting, Succeeded, Failed.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations of the job's state.")
    observed_generation: int | None = Field(None, description="The spec generation this status reflects.")
    ray_job_name: str | None = Field(None, description="The current RayJob, named before it is created.")
    dashboard_url: str | None = Field(None, description="The Ray dashboard of the current cluster.")
    restarts: int = Field(0, ge=0, description="Times the job was restarted from a checkpoint.")
    start_time: datetime | None = Field(
        None, description="When the job first started (the active deadline counts from it, less suspendedSeconds)."
    )
    completion_time: datetime | None = Field(None, description="When the job succeeded or failed.")
    suspended_seconds: int = Field(
        0,
        ge=0,
        description="Seconds the job spent suspended (runPolicy.suspend), counted when it resumes; they do not "
        "count towards runPolicy.activeDeadlineSeconds.",
    )
    progress: Progress | None = Field(None, description="Training progress, as the runtime reported it.")
    metrics: Metrics | None = Field(None, description="Latest training metrics, as the runtime reported them.")
    validation: Validation | None = Field(None, description="Latest validation scores, as the runtime reported them.")
    last_checkpoint: CheckpointRef | None = Field(None, description="The newest complete checkpoint.")
    exported_model: str | None = Field(
        None,
        description="Where the trained model was exported in Hugging Face format (checkpoint.exportHf), as the "
        "runtime reported it: `<checkpoint uri>/model` on an object store, the job's folder on its claim "
        "(`/checkpoints/<namespace>/<name>/model`), else the output folder.",
    )


#: The key of the runtime's report in its ConfigMap.
REPORT_KEY = "report.json"


class RuntimeReport(KuberlModel):
    """What the runtime publishes about its job, as JSON under REPORT_KEY in the ConfigMap `<job>-progress`."""

    progress: Progress = Field(default_factory=Progress, description="Training progress.")
    metrics: Metrics = Field(default_factory=Metrics, description="The latest step's headline metrics.")
    validation: Validation | None = Field(None, description="The latest validation scores.")
    last_checkpoint: CheckpointRef | None = Field(None, description="The newest committed checkpoint.")
    exported_model: str | None = Field(
        None, max_length=4096, description="Where the final model was exported (checkpoint.exportHf), once it is."
    )
    rayjob: str | None = Field(None, max_length=63, description="The RayJob whose run wrote this report.")
    configuration_error: str | None = Field(
        None,
        max_length=4096,
        description="Why the job cannot run as specified (the runtime then exits with contract.ExitCode."
        "CONFIG_ERROR): no restart will help, so the operator fails the job with reason InvalidConfiguration.",
    )
