"""`spec.tracking`: where every step's metrics go besides metrics.jsonl — Weights & Biases, MLflow.

The trackers receive the step record that metrics.jsonl holds, key for key, at the same step
number. Credentials never appear here: wandb reads WANDB_API_KEY, MLflow MLFLOW_TRACKING_TOKEN or
MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from the environment, which a Secret listed in
spec.secretRefs provides on Kubernetes.
"""

import re
from enum import StrEnum

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kuberl.api.base import KuberlModel

#: wandb refuses longer tags; MLflow takes them as tag keys.
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/=+-]{0,63}$"


class WandbMode(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"  # run files on disk under <output>/wandb, for `wandb sync` later


class WandbSpec(KuberlModel):
    """Weights & Biases (verl: trainer.logger=[wandb])."""

    entity: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,128}$", description="Team or user that owns the project. Default: the key's."
    )
    mode: WandbMode = Field(
        WandbMode.ONLINE,
        description="online: send to the server (needs WANDB_API_KEY from a Secret in spec.secretRefs); offline: "
        "write the run under <output>/wandb for `wandb sync`.",
    )


class MLflowSpec(KuberlModel):
    """MLflow (verl: trainer.logger=[mlflow])."""

    tracking_uri: str | None = Field(
        None,
        max_length=2048,
        description="The tracking server (https://...), or a database store (sqlite:///path/mlflow.db). Default: "
        "$MLFLOW_TRACKING_URI. Credentials come from MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / "
        "MLFLOW_TRACKING_PASSWORD in a Secret listed in spec.secretRefs, never from the URI.",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and "://" in value and "@" in value.split("://", 1)[1].split("/", 1)[0]:
            raise PydanticCustomError(
                "credential_uri",
                "the URI carries a user or password; give them as MLFLOW_TRACKING_USERNAME / "
                "MLFLOW_TRACKING_PASSWORD in a Secret listed in spec.secretRefs",
            )
        return value


class TrackingSpec(KuberlModel):
    """Experiment trackers that receive every step's metrics (the record metrics.jsonl holds)."""

    project: str = Field(
        min_length=1,
        max_length=128,
        description="The wandb project, and the MLflow experiment (verl: trainer.project_name).",
    )
    run_name: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="The run's name in the trackers (verl: trainer.experiment_name). Default: the RLJob's name. "
        "A restarted or resumed job continues the same run.",
    )
    tags: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Tags on the run (wandb tags; MLflow tags with the value true).",
    )
    wandb: WandbSpec | None = Field(None, description="Send the metrics to Weights & Biases.")
    mlflow: MLflowSpec | None = Field(None, description="Send the metrics to MLflow.")

    @field_validator("tags")
    @classmethod
    def _tags_are_short_words(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if not re.fullmatch(TAG_PATTERN, tag):
                raise PydanticCustomError(
                    "bad_tag",
                    "tag {tag}: 1 to 64 letters, digits and _ . : / = + -, starting with a letter or digit",
                    {"tag": repr(tag)},
                )
        return tags

    @model_validator(mode="after")
    def _some_tracker(self) -> "TrackingSpec":
        if self.wandb is None and self.mlflow is None:
            raise PydanticCustomError("no_tracker", "name at least one tracker: wandb: {} or mlflow: {}")
        return self
