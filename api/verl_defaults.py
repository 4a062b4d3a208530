"""Where kuberl's defaults differ from verl's, and why: shown by `kuberl explain <field>` and docs/verl.md.

    VERL_DIFFERENCES["algorithm.lam"].verl_value    # 1.0 (kuberl: 0.95)

One entry per RLJob field (dotted, camelCase, under `spec`) whose default is not verl's (verl's
`verl/trainer/config/ppo_trainer.yaml`). `kuberl convert verl` pins verl's value of each in the manifest it
writes, so a converted job trains with verl's values, and reports as lost the two kuberl cannot follow yet
(the rollout's dtype, tensor parallelism); a test holds the converter to this table. A job written by
hand gets kuberl's, for the reason given.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VerlDifference:
    verl_key: str  # the Hydra key, as written on verl's command line
    verl_value: Any  # verl's default, as verl writes it
    why: str  # why kuberl's default is not verl's
    kuberl: str = ""  # kuberl's default in words, where the field's own default depends on others

    def verl(self) -> str:
        """verl's default as `key=value`, as `kuberl explain` prints it."""
        if self.verl_key.startswith("("):  # no key: verl always does it
            return self.verl_key[1:-1]
        value = self.verl_value
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        return f"{self.verl_key}={text}"


VERL_DIFFERENCES: dict[str, VerlDifference] = {
    "algorithm.name": VerlDifference(
        "algorithm.adv_estimator",
        "gae",
        "verl's default is PPO with a critic; kuberl's is grpo, the critic-free method most jobs run. "
        "Write name: ppo for verl's.",
    ),
    "algorithm.groupSize": VerlDifference(
        "actor_rollout_ref.rollout.n",
        1,
        "kuberl takes the preset's group size (8 for grpo), so name: grpo alone is a working GRPO job; "
        "group estimators need at least 2 responses per prompt.",
        kuberl="the preset's (8 for grpo, 16 for dapo, 1 for ppo)",
    ),
    "algorithm.lossAggregation": VerlDifference(
        "actor_rollout_ref.actor.loss_agg_mode",
        "token-mean",
        "verl uses token-mean for every algorithm; kuberl's presets follow their papers: grpo and gspo "
        "average tokens within a response, then responses (DeepSeekMath's objective), dr_grpo sums tokens over "
        "maxNewTokens; dapo, cispo, ppo, rloo, reinforce_pp and remax use token_mean.",
        kuberl="the preset's (seq_mean_token_mean for grpo)",
    ),
    "algorithm.kl.coef": VerlDifference(
        "actor_rollout_ref.actor.use_kl_loss",
        False,
        "verl adds no KL term unless asked (use_kl_loss, use_kl_in_reward); kuberl's presets keep the one of "
        "their papers: 0.001 in the loss (grpo, as DeepSeekMath) or in the reward (ppo, rloo, reinforce_pp, remax, "
        "as InstructGPT); 0 for dr_grpo, dapo, gspo and cispo.",
        kuberl="the preset's (0.001 for grpo, in the loss)",
    ),
    "algorithm.lam": VerlDifference(
        "algorithm.lam",
        1.0,
        "0.95 is the GAE paper's recommended range (Schulman et al., 2015) and the default of PPO implementations "
        "(OpenAI baselines, TRL); verl's 1.0 gives Monte-Carlo returns minus the value.",
    ),
    "algorithm.valueClip": VerlDifference(
        "critic.cliprange_value",
        0.5,
        "kuberl clips the value by the policy's clip range, 0.2, as OpenAI baselines and TRL do.",
    ),
    "algorithm.miniBatchSize": VerlDifference(
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        256,
        "kuberl's default is one optimiser step per batch (the whole data.batchSize), which holds for any "
        "batch size; verl's 256 prompts must divide its train_batch_size.",
        kuberl="data.batchSize",
    ),
    "algorithm.klCov.coef": VerlDifference(
        "actor_rollout_ref.actor.policy_loss.ppo_kl_coef",
        0.1,
        "KL-Cov's paper (arXiv 2505.22617) weights the penalty by 1; verl's 0.1 is its own choice.",
    ),
    "models.actor.optim.weightDecay": VerlDifference(
        "actor_rollout_ref.actor.optim.weight_decay",
        0.01,
        "RL fine-tuning starts from a trained model: decay toward zero pulls the weights away from it for no "
        "gain, so kuberl does not decay (as TRL's trainers, by transformers' default 0).",
    ),
    "models.critic.optim.weightDecay": VerlDifference(
        "critic.optim.weight_decay", 0.01, "As the actor's: no decay on a model fine-tuned from a trained start."
    ),
    "models.actor.gradientCheckpointing": VerlDifference(
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        True,
        "kuberl's defaults size a job that fits without it, and recomputing activations costs about one more "
        "forward pass per step; turn it on for large models or long responses.",
    ),
    "rollout.dtype": VerlDifference(
        "actor_rollout_ref.rollout.dtype",
        "bfloat16",
        "verl keeps float32 master weights and generates in bfloat16; kuberl's engine generates in the actor's "
        "dtype unless rollout.dtype says otherwise (float32 by default), so a weight sync copies without casting.",
        kuberl="the actor's dtype",
    ),
    "models.critic.gradientCheckpointing": VerlDifference(
        "critic.model.enable_gradient_checkpointing",
        True,
        "as for the actor: kuberl's defaults size a job that fits without it; turn it on for large critics.",
    ),
    "data.chatTemplate": VerlDifference(
        "(always renders message-list prompts with the chat template)",
        True,
        "kuberl's plain {prompt, answer} records are raw text for base models, so it renders only when asked; a "
        "message list without it is refused at start, naming the record.",
    ),
    "data.batchSize": VerlDifference(
        "data.train_batch_size",
        1024,
        "kuberl's size defaults start a job that runs on one CPU or GPU; verl's assume 8 GPUs.",
    ),
    "rollout.maxNewTokens": VerlDifference(
        "data.max_response_length", 512, "Sized to run on one CPU or GPU, as data.batchSize."
    ),
    "rollout.tensorParallelSize": VerlDifference(
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        2,
        "kuberl's default runs one whole engine per trainer rank, on one GPU or a CPU; both split an engine over "
        "the GPUs it names, colocated over the actor's ranks or on a rollout pool. verl's 2 assumes a model too "
        "large for one GPU.",
    ),
    "rollout.syncBucketMb": VerlDifference(
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
        512,
        "Half verl's size halves the memory a sync holds at once for the bucket being sent.",
    ),
    "training.epochs": VerlDifference("trainer.total_epochs", 30, "Sized for a first run, as data.batchSize."),
    "checkpoint.intervalSteps": VerlDifference(
        "trainer.save_freq",
        -1,
        "verl saves only when asked; a Kubernetes pod can be preempted at any time, so kuberl saves every 50 "
        "steps (and after the last) and a restart resumes from there.",
    ),
    "checkpoint.keepLast": VerlDifference(
        "trainer.max_actor_ckpt_to_keep",
        None,
        "verl keeps every checkpoint; kuberl keeps the last 3 so regular saves do not fill the volume.",
    ),
    "tracking": VerlDifference(
        "trainer.logger",
        ["console", "wandb"],
        "verl logs to Weights & Biases unless told otherwise, which fails without an account; kuberl writes "
        "metrics.jsonl and TensorBoard events always, and a tracker only when spec.tracking names one.",
        kuberl="no tracker",
    ),
    "resources.actor.gpus": VerlDifference(
        "trainer.n_gpus_per_node",
        8,
        "kuberl's defaults run on CPU (a laptop, CI); ask for GPUs per pool.",
    ),
}
