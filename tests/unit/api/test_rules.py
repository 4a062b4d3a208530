"""Cross-field rules, one behaviour each: the spec that breaks the rule, and the field path blamed."""

import copy

import pytest

from kuberl.api import ManifestError, parse_rljob

BASE = {
    "apiVersion": "kuberl.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "rules"},
    "spec": {
        "models": {"actor": {"path": "/m"}},
        "data": {"train": "/d.jsonl", "batchSize": 8},
        "reward": {"function": "math_exact"},
    },
}


def spec_with(changes: dict) -> dict:
    manifest = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = manifest["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return manifest


# (case, changes that break exactly one rule, the path blamed, a phrase of the message)
BROKEN = [
    ("gae without critic", {"algorithm.name": "ppo"}, "spec.models.critic", "needs a critic"),
    ("grpo with one sample", {"algorithm.groupSize": 1}, "spec.algorithm.groupSize", "groupSize >= 2"),
    ("rloo with one sample", {"algorithm.name": "rloo", "algorithm.groupSize": 1}, "spec.algorithm.groupSize", ">= 2"),
    (
        "colocated with a rollout pool",
        {"resources.rollout": {"replicas": 1}},
        "spec.resources.rollout",
        "actor's pool",
    ),
    ("separate without a pool", {"rollout.placement": "separate"}, "spec.resources.rollout", "pool of its own"),
    (
        "asynchronous rollout in the actor's workers",
        {"rollout.maxStaleness": 1, "algorithm.rolloutCorrection": {"importanceSampling": "token"}},
        "spec.rollout.maxStaleness",
        "placement: separate",
    ),
    (
        "asynchronous rollout without a correction",
        {"rollout.maxStaleness": 2, "rollout.placement": "separate", "resources.rollout": {"replicas": 1}},
        "spec.rollout.maxStaleness",
        "algorithm.rolloutCorrection",
    ),
    (
        "asynchronous rollout with a sync probe",
        {
            "rollout.maxStaleness": 1,
            "rollout.placement": "separate",
            "resources.rollout": {"replicas": 1},
            "rollout.useEngineLogprobs": True,
            "rollout.verifySync": True,
        },
        "spec.rollout.verifySync",
        "verifySync: false",
    ),
    ("staleness beyond its range", {"rollout.maxStaleness": 65}, "spec.rollout.maxStaleness", "less than or equal"),
    (
        "replicas above max",
        {"resources.reward": {"replicas": 5, "maxReplicas": 4}},
        "spec.resources.reward.replicas",
        "above maxReplicas",
    ),
    (
        "replicas below min",
        {"resources.reward": {"replicas": 1, "minReplicas": 2, "maxReplicas": 4}},
        "spec.resources.reward.replicas",
        "below minReplicas",
    ),
    (
        "min above max",
        {"resources.reward": {"replicas": 3, "minReplicas": 5, "maxReplicas": 4}},
        "spec.resources.reward.minReplicas",
        "above maxReplicas",
    ),
    (
        "elastic actor",
        {"resources.actor": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4}},
        "spec.resources.actor.maxReplicas",
        "cannot scale",
    ),
    (
        "a colocated engine split over ranks the actor does not have",
        {"rollout.tensorParallelSize": 2, "rollout.engine": "vllm", "resources.actor": {"replicas": 3}},
        "spec.rollout.tensorParallelSize",
        "the actor has 3",
    ),
    (
        "a colocated engine split across pods",
        {"rollout.tensorParallelSize": 2, "rollout.engine": "vllm", "resources.actor": {"replicas": 2, "gpus": 1}},
        "spec.resources.actor.gpus",
        "must be a multiple of 2",
    ),
    (
        "a colocated engine split over ranks with episodes",
        {
            "rollout.tensorParallelSize": 2,
            "rollout.engine": "vllm",
            "resources.actor": {"gpus": 2},
            "environment": {"name": "python"},
        },
        "spec.rollout.tensorParallelSize",
        "multi-turn episodes",
    ),
    (
        "tensor parallel with the hf engine",
        {
            "rollout.engine": "hf",
            "rollout.placement": "separate",
            "rollout.tensorParallelSize": 2,
            "resources.rollout": {"gpus": 2},
        },
        "spec.rollout.tensorParallelSize",
        "splits a vLLM engine",
    ),
    (
        "tensor parallel with fewer GPUs per replica",
        {"rollout.placement": "separate", "rollout.tensorParallelSize": 4, "resources.rollout": {"gpus": 2}},
        "spec.resources.rollout.gpus",
        "gpus (2) must equal rollout.tensorParallelSize (4)",
    ),
    (
        "more GPUs per replica than one engine spans",
        {"rollout.placement": "separate", "resources.rollout": {"gpus": 4}},
        "spec.resources.rollout.gpus",
        "gpus (4) must equal rollout.tensorParallelSize (1)",
    ),
    (
        "tensor parallel with less than a core per shard",
        {"rollout.placement": "separate", "rollout.tensorParallelSize": 2, "resources.rollout": {"cpus": 1}},
        "spec.resources.rollout.cpus",
        "cpus (1) must be at least rollout.tensorParallelSize (2)",
    ),
    (
        "tensor parallel with the LoRA adapter sync",
        {
            "models.actor": {"path": "/m", "lora": {"rank": 8, "sync": "adapter"}},
            "rollout.placement": "separate",
            "rollout.tensorParallelSize": 2,
            "resources.rollout": {"gpus": 2},
        },
        "spec.models.actor.lora.sync",
        "set sync: merged",
    ),
    ("reward with two kinds", {"reward.model": {"path": "/rm"}}, "spec.reward", "exactly one"),
    ("reward with no kind", {"reward": {"batchSize": 4}}, "spec.reward", "found: none"),
    ("critic pool, no critic", {"resources.critic": {"gpus": 1}}, "spec.resources.critic", "without models.critic"),
    ("mini-batch not a divisor", {"algorithm.miniBatchSize": 3}, "spec.algorithm.miniBatchSize", "must divide"),
    (
        "checkpoint in two places",
        {"checkpoint.pvcClaimName": "ckpt", "checkpoint.uri": "s3://b/p"},
        "spec.checkpoint.uri",
        "choose one",
    ),
    (
        "checkpoint never written",
        {"checkpoint.intervalSteps": None, "checkpoint.savOnPreemption": None},
        "spec.checkpoint.savOnPreemption",
        "unknown field",
    ),
    (
        "checkpoint never written (really)",
        {"checkpoint.intervalSteps": None, "checkpoint.saveOnPreemption": False},
        "spec.checkpoint.intervalSteps",
        "never saves",
    ),
    (
        "engine log-probs with greedy decoding",
        {"rollout.useEngineLogprobs": True, "rollout.temperature": 0},
        "spec.rollout.useEngineLogprobs",
        "greedy",
    ),
    (
        "opo with one sample",
        {"algorithm.advantageEstimator": "opo", "algorithm.groupSize": 1},
        "spec.algorithm.groupSize",
        ">= 2",
    ),
    (
        "gspo weighing responses by length",
        {"algorithm.policyLoss": "gspo", "algorithm.lossAggregation": "token_mean"},
        "spec.algorithm.lossAggregation",
        "one ratio per response",
    ),
    (
        "geo_mean with a token sum",
        {"algorithm.policyLoss": "geo_mean", "algorithm.lossAggregation": "seq_mean_token_sum"},
        "spec.algorithm.lossAggregation",
        "seq_mean_token_mean",
    ),
    (
        "sapo knobs on another loss",
        {"algorithm.sapo": {"tauPositive": 2.0}},
        "spec.algorithm.sapo",
        "policyLoss sapo, but policyLoss is ppo_clip",
    ),
    (
        "clipCov knobs on cispo",
        {"algorithm.name": "cispo", "algorithm.clipCov": {}},
        "spec.algorithm.clipCov",
        "clip_cov",
    ),
    (
        "clipCov bounds the wrong way round",
        {"algorithm.policyLoss": "clip_cov", "algorithm.clipCov": {"lowerBound": 5, "upperBound": 1}},
        "spec.algorithm.clipCov",
        "below upperBound",
    ),
    (
        "dynamic sampling of single responses",
        {"algorithm.name": "dapo", "algorithm.advantageEstimator": "reinforce_plus_plus", "algorithm.groupSize": 1},
        "spec.algorithm.dynamicSampling",
        "groupSize >= 2",
    ),
    (
        "rollout correction that corrects nothing",
        {"algorithm.rolloutCorrection": {"isThreshold": 3}},
        "spec.algorithm.rolloutCorrection",
        "neither importanceSampling nor rejection",
    ),
    (
        "truncated weights in bypass mode",
        {"algorithm.rolloutCorrection": {"importanceSampling": "token"}, "rollout.useEngineLogprobs": True},
        "spec.algorithm.rolloutCorrection.importanceSampling",
        "twice",
    ),
    (
        "rollout correction of greedy decoding",
        {"algorithm.rolloutCorrection": {"rejection": "token"}, "rollout.temperature": 0},
        "spec.algorithm.rolloutCorrection",
        "greedy",
    ),
    (
        "overlong buffer as long as the budget",
        {"reward.overlongPenalty": {"bufferLength": 64}, "rollout.maxNewTokens": 64},
        "spec.reward.overlongPenalty.bufferLength",
        "shorter than rollout.maxNewTokens",
    ),
    (
        "validation schedule without prompts",
        {"training.validationEverySteps": 5},
        "spec.training.validationEverySteps",
        "set data.validation",
    ),
    (
        "a token baseline on the engine's log-probs",
        {"algorithm.advantageEstimator": "optimal_token_baseline", "rollout.useEngineLogprobs": True},
        "spec.rollout.useEngineLogprobs",
        "sum_v pi(v)^2",
    ),
    (
        "a token baseline without groups",
        {"algorithm.advantageEstimator": "tir_optimal_token_baseline", "algorithm.groupSize": 1},
        "spec.algorithm.groupSize",
        "needs groupSize >= 2",
    ),
    (
        "validation before training without prompts",
        {"training.validateBeforeTraining": True},
        "spec.training.validateBeforeTraining",
        "set data.validation",
    ),
    (
        "engine arguments for the hf engine",
        {"rollout.engine": "hf", "rollout.engineArgs": {"max_num_seqs": 4}},
        "spec.rollout.engineArgs",
        "engineArgs are vLLM's",
    ),
    (
        "a LoRA reference in another dtype than its actor's base weights",
        {"models.actor": {"path": "/m", "lora": {}}, "models.reference": {"dtype": "bfloat16"}},
        "spec.models.reference.dtype",
        "the actor's base weights",
    ),
    (
        "a sync probe as tight as float32 on a bfloat16 rollout",
        {"rollout.dtype": "bfloat16", "rollout.verifySync": True},
        "spec.rollout.verifySyncTolerance",
        "raise verifySyncTolerance",
    ),
    (
        "a message longer than its episode",
        {"environment": {"name": "python", "maxTokensPerTurn": 300, "maxEpisodeTokens": 200}},
        "spec.environment.maxTokensPerTurn",
        "cannot fit an episode",
    ),
    (
        "the default message longer than its episode",
        {"environment": {"name": "python", "maxEpisodeTokens": 100}, "rollout.maxNewTokens": 128},
        "spec.rollout.maxNewTokens",
        "raise maxEpisodeTokens or lower rollout.maxNewTokens",
    ),
    (
        "two per-turn budgets",
        {"environment": {"name": "python", "maxTokensPerTurn": 32}, "rollout.maxNewTokens": 32},
        "spec.environment.maxTokensPerTurn",
        "set one of the two",
    ),
    (
        "overlong buffer as long as the episode",
        {
            "environment": {"name": "python", "maxEpisodeTokens": 64},
            "reward.overlongPenalty": {"bufferLength": 64},
            "rollout.maxNewTokens": 32,
        },
        "spec.reward.overlongPenalty.bufferLength",
        "shorter than environment.maxEpisodeTokens",
    ),
    (
        "unknown built-in environment",
        {"environment": {"name": "bash"}},
        "spec.environment.name",
        "built-ins are python",
    ),
    (
        "environment without a name",
        {"environment": {"maxTurns": 3}},
        "spec.environment.name",
        "required field is missing",
    ),
    (
        "a tool call with no time",
        {"environment": {"name": "python", "toolTimeoutSeconds": 0}},
        "spec.environment.toolTimeoutSeconds",
        "greater than 0",
    ),
    (
        "RAY_REDIS_ADDRESS without GCS fault tolerance (KubeRay 1.6.2 ValidateRayClusterSpec)",
        {"env": [{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]},
        "spec.env[0].name",
        "gcsFaultToleranceOptions",
    ),
    (
        "REDIS_USERNAME in the head's Ray container",
        {
            "resources.head": {
                "podTemplate": {
                    "spec": {"containers": [{"name": "ray-head", "env": [{"name": "REDIS_USERNAME", "value": "ray"}]}]}
                }
            }
        },
        "spec.resources.head.podTemplate.spec.containers[0].env[0].name",
        "Redis user",
    ),
    (
        "autoscaler v2 without an elastic pool",
        {"env": [{"name": "RAY_enable_autoscaler_v2", "value": "1"}]},
        "spec.env[0].name",
        "in-tree autoscaling",
    ),
    (
        "a head without containers",
        {"resources.head": {"podTemplate": {"spec": {"containers": []}}}},
        "spec.resources.head.podTemplate.spec.containers",
        "KubeRay refuses a pod without one",
    ),
    (
        "a pool without containers",
        {"resources.reward": {"podTemplate": {"spec": {"containers": []}}}},
        "spec.resources.reward.podTemplate.spec.containers",
        "ray-worker",
    ),
    (
        "token authentication turned off in env",
        {"env": [{"name": "RAY_AUTH_MODE", "value": "disabled"}]},
        "spec.env[0].name",
        "RAY_AUTH_MODE=disabled would turn authentication off",
    ),
    (
        "token authentication turned off in a pool's Ray container",
        {
            "resources.actor": {
                "podTemplate": {
                    "spec": {
                        "containers": [{"name": "ray-worker", "env": [{"name": "RAY_AUTH_MODE", "value": "disabled"}]}]
                    }
                }
            }
        },
        "spec.resources.actor.podTemplate.spec.containers[0].env[0].name",
        "KubeRay's",
    ),
    (
        "episodes on an elastic rollout pool",
        {
            "environment": {"name": "python"},
            "rollout.placement": "separate",
            "resources.rollout": {"replicas": 1, "minReplicas": 1, "maxReplicas": 2},
        },
        "spec.resources.rollout.maxReplicas",
        "does not scale",
    ),
]


@pytest.mark.parametrize(("changes", "path", "phrase"), [case[1:] for case in BROKEN], ids=[c[0] for c in BROKEN])
def test_broken_rule_is_blamed_on_its_field(changes, path, phrase):
    with pytest.raises(ManifestError) as caught:
        parse_rljob(spec_with(changes))
    problems = {problem.path: problem.message for problem in caught.value.problems}
    assert list(problems) == [path]
    assert phrase in problems[path]


# The nearest valid neighbours of the cases above: the rule must not fire on them.
VALID = [
    ("ppo with critic", {"algorithm.name": "ppo", "models.critic": {}}),
    ("reinforce++ with one sample", {"algorithm.name": "reinforce_pp"}),
    ("separate with a pool", {"rollout.placement": "separate", "resources.rollout": {"replicas": 2}}),
    (
        "tensor parallel on a separate GPU pool",
        {"rollout.placement": "separate", "rollout.tensorParallelSize": 4, "resources.rollout": {"gpus": 4}},
    ),
    (
        "tensor parallel on a separate CPU pool",
        {"rollout.placement": "separate", "rollout.tensorParallelSize": 2, "resources.rollout": {"cpus": 2}},
    ),
    (
        "tensor parallel with the LoRA merged sync",
        {
            "models.actor": {"path": "/m", "lora": {"rank": 8, "sync": "merged"}},
            "rollout.placement": "separate",
            "rollout.tensorParallelSize": 2,
            "resources.rollout": {"gpus": 2},
        },
    ),
    (
        "asynchronous rollout, separate and corrected",
        {
            "rollout.maxStaleness": 1,
            "rollout.placement": "separate",
            "resources.rollout": {"replicas": 1},
            "algorithm.rolloutCorrection": {"importanceSampling": "token"},
        },
    ),
    (
        "asynchronous rollout in bypass mode",
        {
            "rollout.maxStaleness": 2,
            "rollout.placement": "separate",
            "resources.rollout": {"replicas": 1},
            "rollout.useEngineLogprobs": True,
        },
    ),
    # minReplicas = maxReplicas = replicas: what the rules tell users to write for a fixed pool (a role that cannot
    # scale, a job in a Kueue queue, a rollout pool serving episodes); an off-by-one in the bounds would refuse it
    (
        "every bound written out on a fixed pool",
        {
            "resources.actor": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2},
            "resources.reward": {"replicas": 3, "minReplicas": 3, "maxReplicas": 3},
        },
    ),
    (
        "every bound written out in a Kueue queue",
        {"queueName": "team-a", "resources.reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 1}},
    ),
    (
        "every bound written out on a rollout pool serving episodes",
        {
            "environment": {"name": "python"},
            "rollout.placement": "separate",
            "resources.rollout": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2},
        },
    ),
    ("elastic reward", {"resources.reward": {"replicas": 2, "minReplicas": 1, "maxReplicas": 8}}),
    ("elastic reward at zero", {"resources.reward": {"replicas": 1, "minReplicas": 0, "maxReplicas": 8}}),
    ("mini-batch divisor", {"algorithm.miniBatchSize": 4}),
    ("pvc with a path inside it", {"checkpoint.pvcClaimName": "ckpt", "checkpoint.uri": "/checkpoints/run1"}),
    ("only preemption saves", {"checkpoint.intervalSteps": None}),
    ("gspo on its own aggregation", {"algorithm.policyLoss": "gspo"}),
    ("sapo knobs on sapo", {"algorithm.policyLoss": "sapo", "algorithm.sapo": {"tauPositive": 2.0}}),
    ("sapo with a token mean", {"algorithm.policyLoss": "sapo", "algorithm.lossAggregation": "token_mean"}),
    (
        "dapo without dynamic sampling, one sample",
        {
            "algorithm.name": "dapo",
            "algorithm.advantageEstimator": "reinforce_plus_plus",
            "algorithm.groupSize": 1,
            "algorithm.dynamicSampling": {"enabled": False},
        },
    ),
    (
        "rejection in bypass mode",
        {"algorithm.rolloutCorrection": {"rejection": "geometric"}, "rollout.useEngineLogprobs": True},
    ),
    ("validation with prompts", {"training.validationEverySteps": 5, "data.validation": "/v.jsonl"}),
    (
        "a colocated engine split over the two GPUs of each actor pod",
        {"rollout.tensorParallelSize": 2, "rollout.engine": "vllm", "resources.actor": {"replicas": 2, "gpus": 2}},
    ),
    (
        "validation before training with prompts",
        {"training.validateBeforeTraining": True, "data.validation": "/v.jsonl"},
    ),
    (
        "a LoRA reference of its own in bfloat16",
        {"models.actor": {"path": "/m", "lora": {}}, "models.reference": {"path": "/r", "dtype": "bfloat16"}},
    ),
    ("a full fine-tune's reference in bfloat16", {"models.reference": {"dtype": "bfloat16"}}),
    (
        "a sync probe loose enough for a bfloat16 rollout",
        {"rollout.dtype": "bfloat16", "rollout.verifySync": True, "rollout.verifySyncTolerance": 0.2},
    ),
    ("overlong buffer inside the budget", {"reward.overlongPenalty": {"bufferLength": 63}, "rollout.maxNewTokens": 64}),
    (
        "a message that fits its episode",
        {"environment": {"name": "python", "maxTokensPerTurn": 200, "maxEpisodeTokens": 200}},
    ),
    ("an environment of one's own", {"environment": {"name": "my_envs.games:TicTacToe"}}),
    (
        "episodes on a fixed rollout pool",
        {"environment": {"name": "python"}, "rollout.placement": "separate", "resources.rollout": {"replicas": 2}},
    ),
    (
        "an elastic rollout pool without episodes",
        {"rollout.placement": "separate", "resources.rollout": {"replicas": 1, "minReplicas": 1, "maxReplicas": 3}},
    ),
    (
        "autoscaler v2 with an elastic pool",
        {
            "env": [{"name": "RAY_enable_autoscaler_v2", "value": "1"}],
            "resources.reward": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
        },
    ),
    ("autoscaler v2 turned off without an elastic pool", {"env": [{"name": "RAY_enable_autoscaler_v2", "value": "0"}]}),
    (
        "Redis variables in a sidecar of the head",
        {
            "resources.head": {
                "podTemplate": {
                    "spec": {
                        "containers": [
                            {"name": "cache", "image": "redis", "env": [{"name": "REDIS_USERNAME", "value": "ray"}]}
                        ]
                    }
                }
            }
        },
    ),
    ("RAY_ variables that are not KubeRay's", {"env": [{"name": "RAY_DEDUP_LOGS", "value": "0"}]}),
    (
        "the overlong buffer against the episode",
        {"environment": {"name": "python", "maxEpisodeTokens": 512}, "reward.overlongPenalty": {"bufferLength": 300}},
    ),
]


@pytest.mark.parametrize("changes", [case[1] for case in VALID], ids=[c[0] for c in VALID])
def test_valid_neighbour_passes(changes):
    parse_rljob(spec_with(changes))
