"""Closed sets of names used by the RLJob schema.

Every enum value is what a user writes in YAML. The runtime keeps registries keyed by the
same strings (advantage estimators, policy losses, KL estimators, rewards), and a test keeps
the two in step.
"""

from enum import StrEnum


class AlgorithmName(StrEnum):
    """Named presets: each fills in the estimator, KL placement and loss defaults of a published recipe."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    DAPO = "dapo"
    PPO = "ppo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce_pp"
    REMAX = "remax"
    GSPO = "gspo"
    CISPO = "cispo"


class AdvantageEstimator(StrEnum):
    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    GRPO_PASSK = "grpo_passk"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"


#: Estimators that compare samples of the same prompt with each other, so need groupSize > 1.
GROUP_ESTIMATORS = frozenset(
    {
        AdvantageEstimator.GRPO,
        AdvantageEstimator.RLOO,
        AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
        AdvantageEstimator.OPO,
        AdvantageEstimator.GPG,
        AdvantageEstimator.GRPO_PASSK,
        AdvantageEstimator.OPTIMAL_TOKEN_BASELINE,
        AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE,
    }
)


class PolicyLoss(StrEnum):
    PPO_CLIP = "ppo_clip"
    GSPO = "gspo"
    CISPO = "cispo"
    CLIP_COV = "clip_cov"
    KL_COV = "kl_cov"
    GPG = "gpg"
    GEO_MEAN = "geo_mean"
    SAPO = "sapo"


class LossAggregation(StrEnum):
    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"


class ImportanceSamplingLevel(StrEnum):
    """Rollout correction: one truncated importance weight per token, or one per sequence (their product)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class RejectionLevel(StrEnum):
    """Rollout correction: reject a token, a whole sequence (ratio product) or a sequence by its geometric mean."""

    TOKEN = "token"
    SEQUENCE = "sequence"
    GEOMETRIC = "geometric"


class KLEstimator(StrEnum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class KLPlacement(StrEnum):
    REWARD = "reward"
    LOSS = "loss"


class DType(StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class ComputeDType(StrEnum):
    """Precision of the trainers' forward and backward passes (parameters keep the model's dtype)."""

    AUTO = "auto"  # bfloat16 on GPU, float32 on CPU
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class RolloutEngine(StrEnum):
    VLLM = "vllm"
    HF = "hf"


class RolloutPlacement(StrEnum):
    """Where the rollout engine runs (not verl's rollout.mode, which is sync or async)."""

    COLOCATED = "colocated"
    SEPARATE = "separate"


class LoRASync(StrEnum):
    """What a LoRA run's weight sync sends to the rollout engine."""

    ADAPTER = "adapter"  # the adapter tensors; the engine generates with the adapter
    MERGED = "merged"  # the layers the adapters touch, merged into the base weights, loaded in place


class OverlongPrompt(StrEnum):
    ERROR = "error"
    TRUNCATE_LEFT = "truncate_left"
    TRUNCATE_RIGHT = "truncate_right"
    DROP = "drop"  # verl's filter_overlong_prompts


class LRSchedule(StrEnum):
    CONSTANT = "constant"
    COSINE = "cosine"
    LINEAR = "linear"


class Role(StrEnum):
    """A pool of workers; on Kubernetes each role with resources is one Ray worker group."""

    ACTOR = "actor"
    CRITIC = "critic"
    REFERENCE = "reference"
    REWARD = "reward"
    ROLLOUT = "rollout"


#: Roles whose replica count may move at run time (minReplicas < maxReplicas).
ELASTIC_ROLES = frozenset({Role.REWARD, Role.ROLLOUT})


class Phase(StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"  # Kueue holds the RayJob (spec.queueName): waiting for admission, or preempted
    STARTING = "Starting"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


#: Phases a job never leaves.
TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ConditionType(StrEnum):
    CREATED = "Created"
    QUEUED = "Queued"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SPEC_CHANGE_REFUSED = "SpecChangeRefused"
    UNKNOWN_FIELDS = "UnknownFields"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionReason(StrEnum):
    RAYJOB_CREATED = "RayJobCreated"
    RAYJOB_RUNNING = "RayJobRunning"
    RAYJOB_SUCCEEDED = "RayJobSucceeded"
    RAYJOB_FAILED = "RayJobFailed"
    BACKOFF = "BackoffBeforeRestart"
    RESTARTED_FROM_CHECKPOINT = "RestartedFromCheckpoint"
    MAX_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
    INVALID_CONFIGURATION = "InvalidConfiguration"
    KUBERAY_REFUSED = "KubeRayRefused"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    SUSPENDED_BY_USER = "SuspendedByUser"
    RESUMED_BY_USER = "ResumedByUser"
    SPEC_CHANGED = "SpecChanged"
    UNSAFE_SPEC_CHANGE = "UnsafeSpecChange"
    INVALID_SPEC = "InvalidSpec"
    APPLY_FAILED = "ApplyFailed"
    KUBERAY_MISSING = "KubeRayMissing"
    KUBERAY_TOO_OLD = "KubeRayTooOld"
    NAME_TAKEN = "NameTaken"
    FIELDS_PRUNED = "FieldsPruned"
    NO_FIELDS_PRUNED = "NoFieldsPruned"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    WAITING_FOR_PREVIOUS_RAYJOB = "WaitingForPreviousRayJob"
    PREEMPTED = "Preempted"
    ADMITTED = "Admitted"
