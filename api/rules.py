"""Cross-field rules of an RLJob spec: what no single field can check on its own.

Each rule is a pure function of a field-valid model that yields `(path, message)` pairs, the
path relative to that model in YAML (camelCase) names. A rule hangs on the smallest model
that holds all it reads (`AlgorithmSpec`, `ResourcesSpec`, ... or the whole `RLJobSpec`), so a
mistake in one section never hides a broken rule in another. `raise_rule_problems` runs a
model's rules together: a manifest with several mistakes hears about every one.
"""

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticCustomError

from kuberl.api.credentials import credential_in, credential_name
from kuberl.api.engine_args import engine_arg_problem
from kuberl.api.enums import (
    ELASTIC_ROLES,
    GROUP_ESTIMATORS,
    AdvantageEstimator,
    LoRASync,
    LossAggregation,
    Role,
    RolloutEngine,
    RolloutPlacement,
)
from kuberl.api.kuberay import KUBERAY_RULES, pod_template_containers
from kuberl.api.policy_losses import LOSS_KNOB_SECTIONS, SEQUENCE_LEVEL_LOSSES

if TYPE_CHECKING:
    from kuberl.api.algorithm import AlgorithmSpec
    from kuberl.api.resources import ResourcesSpec
    from kuberl.api.spec import CheckpointSpec, OffloadSpec, RewardSpec, RLJobSpec, RolloutSpec

RuleProblem = tuple[tuple[str | int, ...], str]
Rule = Callable[[Any], Iterator[RuleProblem]]
#: The error type that carries rule problems through pydantic; `kuberl.api.manifest` unpacks it.
RULES_ERROR_TYPE = "rljob_rules"


def gae_needs_a_critic(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    if spec.algorithm.advantage_estimator == AdvantageEstimator.GAE and spec.models.critic is None:
        yield (
            ("models", "critic"),
            ("advantageEstimator gae (PPO) needs a critic; add models.critic, or pick an estimator without one (grpo)"),
        )


#: Estimators that read the trainer's old-log-prob pass (its log-probs and each token's sum_v pi(v)^2).
TOKEN_BASELINE_ESTIMATORS = frozenset(
    {AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE}
)


def token_baselines_need_the_trainers_pass(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    estimator = spec.algorithm.advantage_estimator
    if estimator in TOKEN_BASELINE_ESTIMATORS and spec.rollout.use_engine_logprobs:
        yield (
            ("rollout", "useEngineLogprobs"),
            f"advantageEstimator {estimator} weighs each token by the trainer's old policy (its log-probs and "
            "sum_v pi(v)^2 from the old-log-prob pass), which useEngineLogprobs skips; set it false",
        )


def group_estimators_need_groups(algorithm: "AlgorithmSpec") -> Iterator[RuleProblem]:
    estimator = algorithm.advantage_estimator
    if estimator in GROUP_ESTIMATORS and (algorithm.group_size or 1) < 2:
        yield (
            ("groupSize",),
            (f"advantageEstimator {estimator} compares responses to the same prompt and needs groupSize >= 2"),
        )


def sequence_losses_weigh_each_response_once(algorithm: "AlgorithmSpec") -> Iterator[RuleProblem]:
    loss, aggregation = algorithm.policy_loss, algorithm.loss_aggregation
    if loss in SEQUENCE_LEVEL_LOSSES and aggregation != LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        yield (
            ("lossAggregation",),
            (
                f"policyLoss {loss} has one ratio per response and needs lossAggregation seq_mean_token_mean "
                f"(every response weighs the same); {aggregation} would weigh responses by their length"
            ),
        )


def loss_knobs_belong_to_the_chosen_loss(algorithm: "AlgorithmSpec") -> Iterator[RuleProblem]:
    for section, loss in LOSS_KNOB_SECTIONS.items():
        if getattr(algorithm, section) is not None and algorithm.policy_loss != loss:
            name = "".join(part.capitalize() if i else part for i, part in enumerate(section.split("_")))
            yield (
                (name,),
                f"{name} holds the knobs of policyLoss {loss}, but policyLoss is {algorithm.policy_loss}; "
                f"remove {name} or set policyLoss: {loss}",
            )


def dynamic_sampling_needs_groups(algorithm: "AlgorithmSpec") -> Iterator[RuleProblem]:
    sampling = algorithm.dynamic_sampling
    if sampling is not None and sampling.enabled and (algorithm.group_size or 1) < 2:
        yield (
            ("dynamicSampling",),
            "dynamic sampling drops groups whose responses all score alike and needs groupSize >= 2; "
            "raise groupSize or set dynamicSampling.enabled: false",
        )


def critic_pool_needs_a_critic(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    if spec.resources.critic is not None and spec.models.critic is None:
        yield ("resources", "critic"), "a critic pool without models.critic; remove it or add the critic model"


def colocated_rollout_uses_the_actor_pool(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    if spec.rollout.placement == RolloutPlacement.COLOCATED and spec.resources.rollout is not None:
        yield (
            ("resources", "rollout"),
            (
                "a colocated rollout runs in the actor's pool; remove resources.rollout "
                "or set rollout.placement: separate"
            ),
        )
    if spec.rollout.placement == RolloutPlacement.SEPARATE and spec.resources.rollout is None:
        yield ("resources", "rollout"), "rollout.placement: separate needs a pool of its own in resources.rollout"


def replicas_within_bounds(resources: "ResourcesSpec") -> Iterator[RuleProblem]:
    for role in Role:
        pool = getattr(resources, role.value)
        if pool is None:
            continue
        low, high = pool.min_replicas, pool.max_replicas
        if low is not None and high is not None and low > high:
            yield (role.value, "minReplicas"), f"minReplicas ({low}) is above maxReplicas ({high})"
        elif low is not None and pool.replicas < low:
            yield (role.value, "replicas"), f"replicas ({pool.replicas}) is below minReplicas ({low})"
        elif high is not None and pool.replicas > high:
            yield (role.value, "replicas"), f"replicas ({pool.replicas}) is above maxReplicas ({high})"
        if pool.is_elastic and role not in ELASTIC_ROLES:
            yield (
                (role.value, "maxReplicas"),
                (
                    f"the {role.value} pool cannot scale at run time (only reward and a separate rollout can); "
                    "set minReplicas = maxReplicas = replicas"
                ),
            )


def tensor_parallel_fits_its_pool(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """An engine split over tensorParallelSize devices (or CPU processes) only where kuberl can start one.

    A separate rollout replica is one vLLM engine whose mp executor starts a worker per shard, so its
    pod must hold exactly that many GPUs (api/topology.py: one engine per pod spanning the pod's GPUs),
    or on CPU a core per shard. A colocated engine is split over consecutive actor ranks, one shard in each
    rank's process on its one device (vLLM's external launcher, as verl's hybrid engine does), so the actor's
    ranks must make whole groups, and on GPU a group must lie in one pod (its all-reduces stay on the node).
    Multi-turn episodes send each engine calls of their own, which a split colocated engine cannot take yet.
    Refused here, at validate and admission, rather than when the engine starts on allocated GPUs.
    """
    rollout, pool = spec.rollout, spec.resources.rollout
    tp = rollout.tensor_parallel_size
    if tp > 1 and rollout.engine != RolloutEngine.VLLM:
        yield (
            ("rollout", "tensorParallelSize"),
            f"tensor parallel {tp} splits a vLLM engine; the {rollout.engine} engine runs on one device: "
            "set rollout.engine: vllm, or tensorParallelSize: 1",
        )
    if tp > 1 and rollout.placement == RolloutPlacement.COLOCATED:
        yield from colocated_tensor_parallel_problems(spec, tp)
    lora = spec.models.actor.lora
    separate = rollout.placement == RolloutPlacement.SEPARATE
    if tp > 1 and separate and lora is not None and lora.sync == LoRASync.ADAPTER:
        yield (
            ("models", "actor", "lora", "sync"),
            f"the adapter sync loads LoRA adapters from memory in one process, not in the {tp} worker processes of "
            "a rollout replica's tensor-parallel engine; set sync: merged, or rollout.tensorParallelSize: 1",
        )
    if rollout.placement != RolloutPlacement.SEPARATE or pool is None:
        return
    if pool.gpus and pool.gpus != tp:
        yield (
            ("resources", "rollout", "gpus"),
            f"each rollout replica is one engine spanning its pod's GPUs: gpus ({pool.gpus}) must equal "
            f"rollout.tensorParallelSize ({tp}); for more throughput add replicas",
        )
    if tp > 1 and not pool.gpus and pool.cpus < tp:
        yield (
            ("resources", "rollout", "cpus"),
            f"a CPU rollout replica runs one engine process per tensor-parallel shard, a core each: cpus "
            f"({pool.cpus:g}) must be at least rollout.tensorParallelSize ({tp})",
        )


def colocated_tensor_parallel_problems(spec: "RLJobSpec", tp: int) -> Iterator[RuleProblem]:
    """A colocated engine split `tp` ways over the actor's ranks (see tensor_parallel_fits_its_pool)."""
    actor = spec.resources.actor
    if actor.world_size % tp:
        yield (
            ("rollout", "tensorParallelSize"),
            f"a colocated engine split {tp} ways takes {tp} consecutive actor ranks; the actor has "
            f"{actor.world_size} (resources.actor): make it a multiple of {tp}, or tensorParallelSize a divisor",
        )
    elif actor.gpus and actor.gpus % tp:
        yield (
            ("resources", "actor", "gpus"),
            f"a colocated engine split {tp} ways spans {tp} GPUs of one pod; gpus ({actor.gpus}) per actor "
            f"replica must be a multiple of {tp}",
        )
    if spec.environment is not None:
        yield (
            ("rollout", "tensorParallelSize"),
            f"multi-turn episodes call each engine on its own, which a colocated engine split {tp} ways over "
            "ranks cannot take yet: set rollout.placement: separate with a rollout pool, or tensorParallelSize: 1",
        )


def mini_batch_divides_batch(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    mini = spec.algorithm.mini_batch_size
    if mini is not None and spec.data.batch_size % mini != 0:
        yield (
            ("algorithm", "miniBatchSize"),
            (f"miniBatchSize ({mini}) must divide data.batchSize ({spec.data.batch_size})"),
        )


def checkpoint_storage_is_one_place(ckpt: "CheckpointSpec") -> Iterator[RuleProblem]:
    if ckpt.pvc_claim_name and ckpt.uri and "://" in ckpt.uri and not ckpt.uri.startswith("file://"):
        yield ("uri",), "pvcClaimName and an object-store uri are two places; choose one"
    if ckpt.interval_steps is None and ckpt.interval_minutes is None and not ckpt.save_on_preemption:
        yield (
            ("intervalSteps",),
            ("with no intervalSteps, no intervalMinutes and saveOnPreemption false the job never saves"),
        )


def engine_logprobs_need_sampling_at_temperature(rollout: "RolloutSpec") -> Iterator[RuleProblem]:
    if rollout.use_engine_logprobs and rollout.temperature == 0:
        yield ("useEngineLogprobs",), "greedy decoding (temperature 0) has no behaviour log-probs to use"


def correction_is_not_counted_twice(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    correction = spec.algorithm.rollout_correction
    if correction is None:
        return
    if spec.rollout.temperature == 0:
        yield (
            ("algorithm", "rolloutCorrection"),
            "greedy decoding (rollout.temperature 0) has no sampling distribution to correct for; "
            "remove rolloutCorrection or sample at a temperature above 0",
        )
    if correction.importance_sampling is not None and spec.rollout.use_engine_logprobs:
        yield (
            ("algorithm", "rolloutCorrection", "importanceSampling"),
            "with rollout.useEngineLogprobs the PPO ratio already is pi / pi_engine; truncated weights on top "
            "would count the correction twice. Use rejection only, or set useEngineLogprobs: false",
        )


def asynchronous_rollout_is_separate_and_corrected(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """maxStaleness >= 1 overlaps generation with training: only a pool of its own can generate while the actor
    trains, the stale samples need an off-policy correction, and no probe can match a trainer that moved on."""
    rollout = spec.rollout
    if rollout.max_staleness == 0:
        return
    if rollout.placement != RolloutPlacement.SEPARATE:
        yield (
            ("rollout", "maxStaleness"),
            f"maxStaleness {rollout.max_staleness} generates while the actor trains, which a colocated engine "
            "(it lives in the actor's workers) cannot; set rollout.placement: separate with resources.rollout, "
            "or maxStaleness: 0",
        )
    if spec.algorithm.rollout_correction is None and not rollout.use_engine_logprobs:
        yield (
            ("rollout", "maxStaleness"),
            f"with maxStaleness {rollout.max_staleness} samples come from a policy up to {rollout.max_staleness} "
            "updates older than the one they train, and nothing would correct for it; set "
            "algorithm.rolloutCorrection (recommended: {importanceSampling: token}, decoupled PPO as in AReaL) "
            "or rollout.useEngineLogprobs: true",
        )
    if rollout.verify_sync:
        yield (
            ("rollout", "verifySync"),
            "with maxStaleness >= 1 the trainer is updates ahead of the engine by design, so the probe after a "
            "sync cannot match; set verifySync: false (or maxStaleness: 0)",
        )


def overlong_buffer_fits_the_budget(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    penalty = spec.reward.overlong_penalty
    if penalty is None or not penalty.enabled or penalty.buffer_length is None:
        return
    budget = "environment.maxEpisodeTokens" if spec.environment is not None else "rollout.maxNewTokens"
    if penalty.buffer_length >= spec.max_response_tokens:
        yield (
            ("reward", "overlongPenalty", "bufferLength"),
            (
                f"the overlong buffer ({penalty.buffer_length} tokens) must be shorter than {budget} "
                f"({spec.max_response_tokens}): responses shorter than {budget} - bufferLength go unpunished"
            ),
        )


#: The longest wait between two attempts of an endpoint request (runtime/rewards/endpoint.py backoff_delay's cap).
ENDPOINT_BACKOFF_CAP_SECONDS = 30.0


def batch_timeout_covers_endpoint_retries(reward: "RewardSpec") -> Iterator[RuleProblem]:
    """The pool would replace an endpoint worker while it is still retrying within its own limits."""
    endpoint = reward.endpoint
    if endpoint is None:
        return
    attempts = endpoint.max_retries + 1
    longest = attempts * endpoint.timeout_seconds + endpoint.max_retries * ENDPOINT_BACKOFF_CAP_SECONDS
    if reward.batch_timeout_seconds < longest:
        yield (
            ("batchTimeoutSeconds",),
            (
                f"batchTimeoutSeconds ({reward.batch_timeout_seconds:g}) is shorter than one batch may take at the "
                f"endpoint: {attempts} attempts of timeoutSeconds ({endpoint.timeout_seconds:g}) and the backoff "
                f"between them, up to {longest:g} s; raise batchTimeoutSeconds or lower endpoint.timeoutSeconds "
                "or endpoint.maxRetries"
            ),
        )


def validation_needs_prompts(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    if spec.training.validation_every_steps is not None and spec.data.validation is None:
        yield (
            ("training", "validationEverySteps"),
            "validation every N steps needs validation prompts; set data.validation, or remove validationEverySteps",
        )
    if spec.training.validate_before_training and spec.data.validation is None:
        yield (
            ("training", "validateBeforeTraining"),
            "validation before training needs validation prompts; set data.validation, or remove "
            "validateBeforeTraining",
        )


def engine_args_are_vllms(rollout: "RolloutSpec") -> Iterator[RuleProblem]:
    if rollout.engine_args and rollout.engine != RolloutEngine.VLLM:
        yield ("engineArgs",), f"engineArgs are vLLM's; rollout.engine is {rollout.engine}: remove them or use vllm"
    for name, value in rollout.engine_args.items():
        problem = engine_arg_problem(name, value)
        if problem is not None:
            yield ("engineArgs", name), problem


def lora_reference_keeps_the_actors_dtype(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    actor, reference = spec.models.actor, spec.models.reference
    if actor.lora is None or reference is None or reference.dtype in (None, actor.dtype):
        return
    if reference.path in (None, actor.path):  # the reference is the actor's own base weights, adapters off
        yield (
            ("models", "reference", "dtype"),
            (
                f"with LoRA the reference is the actor's base weights, in the actor's dtype ({actor.dtype}); "
                "remove models.reference.dtype, or give the reference a path of its own"
            ),
        )


def optimizer_offload_goes_with_params(offload: "OffloadSpec") -> Iterator[RuleProblem]:
    """FSDP2's CPUOffloadPolicy moves parameters, gradients and optimiser state together, and the optimiser steps
    where the parameters live: neither half can be had alone. perLayer and gradientsOnDevice only say how offloaded
    parameters and gradients move, and a gathered model keeps its gradients on the device."""
    if offload.params and not offload.optimizer:
        yield (
            ("optimizer",),
            "with params offloaded FSDP2 steps the optimiser on the CPU, so its state is in host memory too; "
            "set optimizer: true as well",
        )
    if offload.per_layer is not None and not offload.params:
        yield (
            ("perLayer",),
            "perLayer says how offloaded parameters move during an update; set params: true (and optimizer: true) "
            "as well, or remove perLayer",
        )
    if offload.gradients_on_device is not None and not offload.params:
        yield (
            ("gradientsOnDevice",),
            "gradientsOnDevice says where an offloaded model's gradients stay during an update; set params: true "
            "(and optimizer: true) as well, or remove gradientsOnDevice",
        )
    if offload.per_layer is False and offload.gradients_on_device is False:
        yield (
            ("gradientsOnDevice",),
            "perLayer: false keeps the gathered model and its gradients on the device for the optimiser step; to "
            "copy the gradients out at every pass, set perLayer: true as well, or remove gradientsOnDevice",
        )
    if offload.optimizer and not offload.params:
        yield (
            ("optimizer",),
            "FSDP2 offloads the optimiser state only together with the parameters (its CPUOffloadPolicy steps the "
            "optimiser where the parameters live); set params: true as well, or neither",
        )


def lora_reference_is_not_offloaded(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    actor, reference = spec.models.actor, spec.models.reference
    if actor.lora is None or reference is None or not reference.offload.params:
        return
    if reference.path in (None, actor.path):  # the reference is the actor's own base weights, adapters off
        yield (
            ("models", "reference", "offload", "params"),
            "with LoRA the reference is the actor's own base weights with the adapters off, not a model of its own; "
            "remove models.reference.offload (models.actor.offload offloads those weights), or give the reference "
            "a path of its own",
        )


def token_budgets_fit_a_sequence(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """verl asserts the same at start-up (max_token_len must be >= the longest sequence); here it is refused at
    the door: a sequence longer than the budget could only get a pass of its own, over the budget."""
    longest = spec.data.max_prompt_length + spec.max_response_tokens
    models = spec.models
    budgets: list[tuple[str, str, int | None]] = [
        ("actor", "maxTokensPerMicroBatch", models.actor.max_tokens_per_micro_batch),
        ("actor", "forwardMaxTokensPerMicroBatch", models.actor.forward_max_tokens_per_micro_batch),
    ]
    if models.critic is not None:
        budgets += [
            ("critic", "maxTokensPerMicroBatch", models.critic.max_tokens_per_micro_batch),
            ("critic", "forwardMaxTokensPerMicroBatch", models.critic.forward_max_tokens_per_micro_batch),
        ]
    if models.reference is not None:
        budgets.append(("reference", "maxTokensPerMicroBatch", models.reference.max_tokens_per_micro_batch))
    for role, field, budget in budgets:
        if budget is not None and budget < longest:
            yield (
                ("models", role, field),
                f"{budget} tokens cannot hold the longest sequence, data.maxPromptLength + the response budget = "
                f"{longest}; raise it to at least {longest}",
            )


#: Below this, a sync probe cannot tell a stale engine from one running in a lower precision than the trainer.
LOW_PRECISION_PROBE_TOLERANCE = 1e-2


def verify_sync_allows_the_rollout_precision(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    rollout, actor = spec.rollout, spec.models.actor
    if not rollout.verify_sync or rollout.dtype in (None, actor.dtype):
        return
    if rollout.verify_sync_tolerance < LOW_PRECISION_PROBE_TOLERANCE:
        yield (
            ("rollout", "verifySyncTolerance"),
            (
                f"the engine runs in {rollout.dtype} and the trainer in {actor.dtype}: their log-probs differ by "
                f"the engine's precision, far above {rollout.verify_sync_tolerance}; raise verifySyncTolerance "
                f"(at least {LOW_PRECISION_PROBE_TOLERANCE}) or drop rollout.dtype"
            ),
        )


def queued_jobs_have_fixed_pools(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    if spec.workload_priority_class is not None and spec.queue_name is None:
        yield ("workloadPriorityClass",), "a Kueue priority class needs a queue; set queueName too, or remove it"
    if spec.queue_name is None:
        return
    for role in Role:
        pool = getattr(spec.resources, role.value)
        if pool is not None and pool.is_elastic:
            yield (
                ("resources", role.value, "maxReplicas"),
                (
                    "Kueue reserves a fixed quota for a queued job and admits no RayJob with an autoscaler "
                    "(queueName is set); set minReplicas = maxReplicas = replicas"
                ),
            )


def episode_budgets_fit(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    environment = spec.environment
    if environment is None:
        return
    if environment.max_tokens_per_turn is not None and "max_new_tokens" in spec.rollout.model_fields_set:
        yield (
            ("environment", "maxTokensPerTurn"),
            "with an environment rollout.maxNewTokens is the default of environment.maxTokensPerTurn; "
            "set one of the two, not both",
        )
    where = "maxTokensPerTurn" if environment.max_tokens_per_turn is not None else "rollout.maxNewTokens"
    if spec.max_turn_tokens > environment.max_episode_tokens:
        path: tuple[str, ...] = ("environment", "maxTokensPerTurn")
        if environment.max_tokens_per_turn is None:
            path = ("rollout", "maxNewTokens")
        yield (
            path,
            f"a message of up to {spec.max_turn_tokens} tokens ({where}) cannot fit an episode of "
            f"environment.maxEpisodeTokens {environment.max_episode_tokens}; raise maxEpisodeTokens or lower {where}",
        )


def episodes_use_a_fixed_rollout_pool(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """Episodes keep their engines for many turns (runtime/environments/scheduler.py), outside the queue the
    rollout pool scales on: refused rather than accepted with a pool that never moves."""
    pool = spec.resources.rollout
    if spec.environment is not None and pool is not None and pool.is_elastic:
        yield (
            ("resources", "rollout", "maxReplicas"),
            "with spec.environment the rollout pool does not scale (episodes hold their engines turn after turn); "
            "set minReplicas = maxReplicas = replicas",
        )


def pods_outlive_the_stop_window(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """A pod template's own terminationGracePeriodSeconds must leave the driver its stop window."""
    window = spec.run_policy.stop_grace_period_seconds
    placements = {"head": spec.resources.head} | {role.value: getattr(spec.resources, role.value) for role in Role}
    for name, placement in placements.items():
        template = placement.pod_template if placement is not None else None
        pod = template.get("spec") if isinstance(template, dict) else None
        grace = pod.get("terminationGracePeriodSeconds") if isinstance(pod, dict) else None
        if isinstance(grace, int) and grace < window:
            yield (
                ("resources", name, "podTemplate", "spec", "terminationGracePeriodSeconds"),
                f"{grace} s is shorter than runPolicy.stopGracePeriodSeconds ({window} s): the pod would be killed "
                "while the job saves its checkpoint; remove it (kuberl sets the window plus 15 s) or raise it",
            )


def pod_template_env_holds_no_credential(spec: "RLJobSpec") -> Iterator[RuleProblem]:
    """A literal env value of a podTemplate is stored in the manifest as spec.env's are: the same checks. A
    `valueFrom` (a secretKeyRef) is how a container gets a credential, and passes."""
    for _, path, container in pod_template_containers(spec):
        for index, entry in enumerate(container.get("env") or []):
            value, name = entry.get("value"), entry.get("name")
            if not isinstance(value, str) or not value:
                continue
            why = credential_in(value)
            if why is None and isinstance(name, str) and credential_name(name):
                why = f"a credential ({name}, by its name)"
            if why is not None:
                yield (
                    (*path, "env", index, "value"),
                    f"holds {why}; credentials do not belong in the manifest (it is stored and shown in the clear): "
                    "put it in a Secret and use valueFrom.secretKeyRef, or list the Secret in spec.secretRefs",
                )


ALGORITHM_RULES: tuple[Rule, ...] = (
    group_estimators_need_groups,
    sequence_losses_weigh_each_response_once,
    loss_knobs_belong_to_the_chosen_loss,
    dynamic_sampling_needs_groups,
)
REWARD_RULES: tuple[Rule, ...] = (batch_timeout_covers_endpoint_retries,)
RESOURCES_RULES: tuple[Rule, ...] = (replicas_within_bounds,)
ROLLOUT_RULES: tuple[Rule, ...] = (engine_logprobs_need_sampling_at_temperature, engine_args_are_vllms)
CHECKPOINT_RULES: tuple[Rule, ...] = (checkpoint_storage_is_one_place,)
OFFLOAD_RULES: tuple[Rule, ...] = (optimizer_offload_goes_with_params,)
#: Rules that read more than one section of the spec.
SPEC_RULES: tuple[Rule, ...] = (
    gae_needs_a_critic,
    token_baselines_need_the_trainers_pass,
    critic_pool_needs_a_critic,
    colocated_rollout_uses_the_actor_pool,
    tensor_parallel_fits_its_pool,
    mini_batch_divides_batch,
    correction_is_not_counted_twice,
    asynchronous_rollout_is_separate_and_corrected,
    overlong_buffer_fits_the_budget,
    validation_needs_prompts,
    queued_jobs_have_fixed_pools,
    lora_reference_keeps_the_actors_dtype,
    lora_reference_is_not_offloaded,
    token_budgets_fit_a_sequence,
    verify_sync_allows_the_rollout_precision,
    episode_budgets_fit,
    episodes_use_a_fixed_rollout_pool,
    pods_outlive_the_stop_window,
    pod_template_env_holds_no_credential,
    *KUBERAY_RULES,
)


def raise_rule_problems(model: Any, rules: tuple[Rule, ...]) -> None:
    """Run `rules` on a field-valid model; raise every problem found as one pydantic error."""
    raise_problems([problem for rule in rules for problem in rule(model)])


def raise_problems(problems: list[RuleProblem]) -> None:
    """Raise `problems` (paths relative to what is validated) as one pydantic error, each with its own path."""
    if problems:
        summary = "; ".join(".".join(map(str, path)) + ": " + message for path, message in problems)
        raise PydanticCustomError(RULES_ERROR_TYPE, "{summary}", {"summary": summary, "problems": problems})
